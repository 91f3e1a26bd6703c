"""The Multi30k config trained for a fixed number of steps in fp32 and in bf16 autocast on CUDA: loss curves compared.

    python benchmarks/gpu_train_check.py --steps 1200 --json benchmarks/results/gpu_train_multi30k.json

Both runs are the real command (`workbench train configs/multi30k_de_en.toml`) with a step count instead of the
config's time budget (the cosine then decays over the steps), the same seed and data, no validation until the end.
Agreement: the mean training loss over the last fifth of the logged steps differs by at most TOLERANCE relative
(bf16 rounds every matmul input to 8 bits of mantissa, so the curves are not equal step by step; a bf16 path that
is broken — overflow, a missing autocast region, a loss scaled wrongly — moves the tail by far more). Reported
beside it: the wall time and the median target tokens/s of each run, and the largest relative gap of any logged
point after the first fifth. Exit status 1 when the tails disagree, so gpu_check.sh counts it as a failure.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOLERANCE = 0.03  # relative, on the mean loss of the last fifth of the logged steps


def train(config: str, amp: str, steps: int, warmup: int, out_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "workbench.cli", "train", config, "--fresh", f"--max_steps={steps}", "--max_minutes=0",
           f"--warmup={warmup}", "--device=cuda", f"--amp={amp}", "--eval_every=0", "--save_every=0",
           "--average_last=0", "--keep_last=1", "--log_every=25", f"--out_dir={out_dir}"]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    wall = time.perf_counter() - start
    from workbench.checkpoint.format import load_checkpoint

    log = load_checkpoint(out_dir).train_log
    train_records = [r for r in log if r.get("kind") == "train"]
    valid = [r for r in log if r.get("kind") == "valid"]
    return {
        "amp": amp, "wall_s": round(wall, 2),
        "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in train_records[1:] or train_records),
        "steps": [r["step"] for r in train_records], "loss": [r["loss"] for r in train_records],
        "final_validation": valid[-1] if valid else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/multi30k_de_en.toml")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--warmup", type=int, default=300, help="the config's 1000 is most of a short run")
    ap.add_argument("--work", default="/tmp/workbench_gpu_check")
    ap.add_argument("--json", default="benchmarks/results/gpu_train_multi30k.json")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_train_check: no CUDA device", file=sys.stderr)
        return 2
    runs = {amp: train(a.config, amp, a.steps, a.warmup, Path(a.work) / f"m30k_{amp}") for amp in ("off", "bf16")}
    fp32, bf16 = runs["off"]["loss"], runs["bf16"]["loss"]
    n = min(len(fp32), len(bf16))
    tail = max(1, n // 5)
    mean32, mean16 = sum(fp32[n - tail:n]) / tail, sum(bf16[n - tail:n]) / tail
    tail_rel = abs(mean32 - mean16) / mean32
    gaps = [abs(x - y) / x for x, y in zip(fp32[n // 5:n], bf16[n // 5:n])]
    result = {
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "python": platform.python_version(),
        "config": a.config, "steps": a.steps, "warmup": a.warmup,
        "tail_mean_loss": {"fp32": mean32, "bf16": mean16}, "tail_relative_difference": tail_rel,
        "max_relative_gap_after_first_fifth": max(gaps) if gaps else None, "tolerance": TOLERANCE,
        "agree": tail_rel <= TOLERANCE,
        "bf16_speedup_tokens_per_s": runs["bf16"]["tokens_per_s_median"] / runs["off"]["tokens_per_s_median"],
        "runs": runs,
    }
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"fp32 tail loss {mean32:.4f}, bf16 {mean16:.4f}: relative difference {tail_rel:.4f} "
          f"(tolerance {TOLERANCE}); tokens/s fp32 {runs['off']['tokens_per_s_median']:.0f}, "
          f"bf16 {runs['bf16']['tokens_per_s_median']:.0f}; "
          f"wall {runs['off']['wall_s']} s / {runs['bf16']['wall_s']} s")
    return 0 if result["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""What the replacement model costs next to the plain forward pass (issue 36's speed goal: ≤ 1.1× with nothing
frozen), and what freezing and float64 add.

    python benchmarks/bench_replacement.py [--threads 1] [--repeats 15] [--json benchmarks/results/replacement_cpu.json]

Workloads: the shipped `multi30k-de-en` model teacher-forced on one Multi30k sentence (what a graph or a circuit
runs) and a batch of 32 random sentences of 24 tokens (tiny shapes of a corpus study). Builds, timed interleaved in
one process with the order rotating every round, each round's ratio to the plain forward paired, median and
quartiles over the rounds (process CPU time):

- `plain`: `model(src, tgt)`.
- `nothing_frozen`: `rm()` for `ReplacementModel(model, src, tgt, freeze=())`, built once: the model itself inside
  the replacement model's (empty) hook context. The goal's figure.
- `nothing_frozen_built`: building it and calling it (the build runs one clean forward).
- `frozen_fp32`, `frozen_fp64`: attention, norms and FFN gates held at the clean run (fp64: the model's float64 twin).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench import load  # noqa: E402
from workbench.core.replacement import ReplacementModel  # noqa: E402

SENTENCE = "Eine Frau in einem pinken Pulli und einer Schürze putzt einen Tisch mit einem Schwamm."


def workloads(tm) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    cfg = tm.model.cfg
    src_ids, _ = tm.encode_source(SENTENCE)
    out = tm.tgt_tokenizer.encode(tm.translate([SENTENCE])[0])
    one = (torch.tensor([src_ids]), torch.tensor([[cfg.start_id, *out]]))
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, cfg.src_vocab, (32, 24), generator=g)
    tgt = torch.randint(4, cfg.tgt_vocab, (32, 24), generator=g)
    src[:, -1], tgt[:, 0] = cfg.eos_id, cfg.start_id
    return {"one_sentence": one, "batch_32x24": (src, tgt)}


def builds(model, src, tgt) -> dict[str, object]:
    nothing = ReplacementModel(model, src, tgt, freeze=())
    fp32 = ReplacementModel(model, src, tgt)
    fp64 = ReplacementModel(model, src, tgt, dtype=torch.float64)
    return {
        "plain": lambda: model(src, tgt),
        "nothing_frozen": lambda: nothing(),
        "nothing_frozen_built": lambda: ReplacementModel(model, src, tgt, freeze=())(),
        "frozen_fp32": lambda: fp32(),
        "frozen_fp64": lambda: fp64(),
    }


def measure(fns: dict[str, object], repeats: int, inner: int) -> dict[str, dict[str, float]]:
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for fn in fns.values():
            fn()  # warm
        for r in range(repeats):
            order = names[r % len(names):] + names[: r % len(names)]
            for n in order:
                t = time.process_time()
                for _ in range(inner):
                    fns[n]()
                times[n].append((time.process_time() - t) / inner)
    out = {}
    for n in names:
        ratios = sorted(a / b for a, b in zip(times[n], times["plain"]))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        out[n] = {"ms_median": 1000 * statistics.median(times[n]), "ratio_median": statistics.median(ratios),
                  "ratio_q1": q[0], "ratio_q3": q[2]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tm = load(ROOT / "checkpoints" / "multi30k-de-en")
    result = {"torch": torch.__version__, "machine": platform.machine(), "threads": args.threads,
              "repeats": args.repeats, "workloads": {}}
    for name, (src, tgt) in workloads(tm).items():
        inner = 10 if name == "one_sentence" else 2
        result["workloads"][name] = {"shape": [list(src.shape), list(tgt.shape)],
                                     **measure(builds(tm.model, src, tgt), args.repeats, inner)}
        for build, row in result["workloads"][name].items():
            if build != "shape":
                print(f"{name:13s} {build:22s} {row['ms_median']:8.2f} ms  x{row['ratio_median']:.3f} "
                      f"[{row['ratio_q1']:.3f}, {row['ratio_q3']:.3f}]")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

"""Alignment and attribution speed on the shipped en->de model, all in one run:

    .venv/bin/python benchmarks/bench_align.py [--sentences 20] [--out benchmarks/results/align_cpu.json]

  - `workbench align` over the 508 RWTH pairs (English source, German target), as a user runs it: a
    subprocess, model loading and writing included, with the checkpoint's own aligner (alignment.json);
    the same in-process (align_pairs) for each method at layer level. Goal: at most 30 s.
  - per sentence (the first --sentences RWTH pairs, teacher-forced on the reference): a plain traced forward
    (`run_with_cache`, every hook_probs), ALTI+ through the whole model (`alti`, its own forward included), and
    the cross-attention score split of one layer (`split_cross_scores`, its own forward included); the median
    of --repeats timings each, and the ratios to the traced forward. Goal: each at most 3x.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from workbench import load
from workbench.analysis.alignment.word_align import AlignmentSpec, align_pairs, encode_words
from workbench.analysis.attribution.alti import alti
from workbench.analysis.attribution.score_split import split_cross_scores

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("WORKBENCH_DATA", ROOT.parent / "shared" / "data"))
RWTH = DATA / "alignments" / "rwth-deen"


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "general-en-de"))
    p.add_argument("--sentences", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "align_cpu.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    src_file, tgt_file = RWTH / "test.en", RWTH / "test.de"
    result: dict = {"device": "cpu", "torch": torch.__version__, "machine": platform.machine(),
                    "threads": args.threads, "checkpoint": Path(args.checkpoint).name,
                    "load_avg_before": os.getloadavg()}

    # 1. the CLI end to end
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "hyp.txt"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "workbench.cli", "align", "--checkpoint", args.checkpoint,
                               str(src_file), str(tgt_file), "-o", str(out)], env=env, capture_output=True,
                              text=True, check=True)
        wall = time.perf_counter() - t0
        lines = len(out.read_text().splitlines())
    result["cli_align_508"] = {"seconds": wall, "pairs": lines, "stderr": proc.stderr.strip(),
                               "goal_seconds": 30, "goal_met": wall <= 30}
    print(f"workbench align, 508 pairs: {wall:.1f} s ({proc.stderr.strip()})", flush=True)

    tm = load(args.checkpoint)
    src = src_file.read_text(encoding="utf-8").splitlines()
    tgt = tgt_file.read_text(encoding="utf-8").splitlines()
    last = len(tm.model.dec) - 1
    result["in_process_508"] = {}
    for method in ("weights", "norms", "alti"):
        spec = AlignmentSpec(method, "awi", "drop", ((0, None), (last, None)))
        t0 = time.perf_counter()
        align_pairs(tm.model, tm.src_tokenizer, tm.tgt_tokenizer, src, tgt, spec)
        result["in_process_508"][method] = time.perf_counter() - t0
        print(f"align_pairs {method} (layer maps), 508 pairs: {result['in_process_508'][method]:.1f} s", flush=True)

    # 2. per sentence: traced forward vs ALTI+ vs the score split
    cfg = tm.model.cfg
    rows = []
    for k in range(args.sentences):
        s = encode_words(tm.src_tokenizer, src[k])
        t = encode_words(tm.tgt_tokenizer, tgt[k])
        s_ids = torch.tensor([[*s.ids, cfg.eos_id]])
        t_ids = torch.tensor([[cfg.start_id, *t.ids]])
        with torch.no_grad():
            forward = median_time(lambda s=s_ids, t=t_ids: tm.model.run_with_cache(s, t), args.repeats)
            a = median_time(lambda s=s_ids, t=t_ids: alti(tm.model, s, t), args.repeats)
            split = median_time(lambda s=s_ids, t=t_ids: split_cross_scores(tm.model, s, t, 0), args.repeats)
        rows.append({"source_tokens": s_ids.size(1), "target_tokens": t_ids.size(1), "traced_forward": forward,
                     "alti": a, "score_split": split, "alti_ratio": a / forward, "split_ratio": split / forward})
        print(f"sentence {k + 1}: {s_ids.size(1)}x{t_ids.size(1)} tokens, forward {1e3 * forward:.1f} ms, ALTI+ "
              f"{a / forward:.2f}x, split {split / forward:.2f}x", flush=True)
    result["per_sentence"] = rows
    for key in ("alti_ratio", "split_ratio"):
        values = [r[key] for r in rows]
        result[key] = {"median": statistics.median(values), "max": max(values), "goal": 3.0,
                       "goal_met": statistics.median(values) <= 3.0}
    result["load_avg_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: result[k] for k in ("cli_align_508", "in_process_508", "alti_ratio", "split_ratio")},
                     indent=1))


if __name__ == "__main__":
    main()

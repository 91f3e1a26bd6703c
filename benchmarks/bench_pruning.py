"""Pruning curve on the shipped de->en model: reusing the clean runs vs recomputing them, in one run.

    .venv/bin/python benchmarks/bench_pruning.py [--sentences 64] [--steps 0,4,8,12,16] \
        [--out benchmarks/results/pruning_cpu.json]

`workbench.analysis.circuits.pruning.pruning_curve` decodes the unpruned model once for every kind's level 0 and hands
the clean encoder output to every level that removes decoder heads (decoder self- and cross-attention cannot
change the encoder). The baseline here is the same curve without either reuse: the unpruned model decoded for
each kind, and the source re-encoded at every level (`reuse_clean=False` plus two extra unpruned decodes). Both
curves are checked to be identical; the importance table is measured once and shared, so only the curve is timed.
Both wall time and this process's CPU time are reported (the ratio uses CPU time: with one intra-op thread it is
the work done, which a machine shared with other jobs does not distort as it does wall time); the two variants
alternate, and each figure is the minimum over --repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from workbench import load
from workbench.analysis.circuits.interventions_effect import head_importance
from workbench.analysis.circuits.pruning import pruning_curve
from workbench.corpus.data import dataset_files, read_parallel

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "multi30k-de-en"))
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--steps", default="0,4,8,12,16")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU time = work at 1)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tm = load(args.checkpoint)
    src, ref = read_parallel(*dataset_files("multi30k", "test", "de", "en"), limit=args.sentences)
    cfg = tm.model.cfg
    sources = [tm.encode_source(s)[0] for s in src]
    targets = [tm.tgt_tokenizer.encode(t) + [cfg.eos_id] for t in ref]
    steps = [int(x) for x in args.steps.split(",")]
    imp = head_importance(tm.model, sources, targets, decode=False)
    kw = dict(detokenize=tm.detokenize, references=ref, steps=steps, importance=imp)

    def reused():
        return pruning_curve(tm.model, sources, targets, **kw)

    def recomputed():
        # no reuse at all: every kind decodes its own unpruned level, every level re-encodes
        parts = [pruning_curve(tm.model, sources, targets, kinds=[k], reuse_clean=False, **kw).table
                 for k in ("enc_self", "dec_self", "cross")]
        return pd.concat(parts, ignore_index=True)

    times = {"reused": [], "recomputed": []}
    cpu = {"reused": [], "recomputed": []}
    for k in range(args.repeats):
        order = (("reused", reused), ("recomputed", recomputed))
        for name, fn in order if k % 2 == 0 else order[::-1]:
            t0, c0 = time.perf_counter(), time.process_time()
            out = fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            if name == "reused":
                a = out.table
            else:
                b = out
        pd.testing.assert_frame_equal(a, b)
    result = {
        "device": "cpu", "torch": torch.__version__, "machine": platform.machine(), "threads": torch.get_num_threads(),
        "checkpoint": Path(args.checkpoint).name, "sentences": args.sentences, "steps": steps,
        "decodes_reused": 1 + 3 * (len([s for s in steps if s > 0])),
        "decodes_recomputed": 3 * len(steps),
        "seconds_reused": min(times["reused"]), "seconds_recomputed": min(times["recomputed"]),
        "cpu_seconds_reused": min(cpu["reused"]), "cpu_seconds_recomputed": min(cpu["recomputed"]),
        "speedup_cpu": min(cpu["recomputed"]) / min(cpu["reused"]),
        "repeats": args.repeats, "load_average_1min": os.getloadavg()[0],
        "curves_identical": True,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(f"-> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Decoding A/B against an earlier commit, in one process: the same weights, outputs compared, runs interleaved.

    python benchmarks/ab_decode.py --baseline HEAD~1 --threads 1 --rounds 9                 # tiny, beam 5 and greedy
    python benchmarks/ab_decode.py --baseline HEAD~1 --threads 1 --shipped multi30k-de-en --sents 250

The baseline's `workbench` package (`git archive REV workbench`) is unpacked into a temporary folder as
`workbench_baseline` and imported beside the working tree's: its core and decoding modules import each other
relatively, so the baseline's search drives the baseline's model. Both models hold the same weights (the
baseline's built from the working tree's state dict).

Workloads: `tiny` is bench_decode.py's (peers.py's tiny weights through the Marian importer, 64 random sentences
of 32 tokens, 64 output tokens forced, beam 5), plus greedy on the same input; `--shipped NAME` translates the
first `--sents` lines of that checkpoint's Multi30k test2016 side with `TranslationModel.translate` (its own
decoding defaults), beam 5 and greedy, the baseline run by swapping in its model and `generate`.

Every workload first checks that both sides give the same output (hypotheses, scores included, or the same
translations); then each round runs baseline and working tree once, in alternating order (ABBA), and reports the
median over rounds and the spread of the per-round ratio baseline / working tree, in wall time and in this
process's CPU time (less disturbed by a shared machine's other jobs). Short workloads over many rounds resist a
load that drifts during the run better than a few long ones.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT.parent / "shared" / "bench"))

BASELINE = "workbench_baseline"


def unpack_baseline(rev: str, into: Path) -> None:
    """`workbench` of commit `rev`, as the package `workbench_baseline` under `into` (put on sys.path)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "workbench"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    (into / "workbench").rename(into / BASELINE)
    sys.path.insert(0, str(into))


def baseline_twin(model):
    """The baseline's Transformer with `model`'s config and weights, in eval mode."""
    from workbench_baseline.core.model import Transformer

    twin = Transformer(model.cfg)
    twin.load_state_dict(model.state_dict())
    twin.check_inputs = model.check_inputs
    return twin.eval()


def same_generation(a, b) -> bool:
    key = lambda gen: [[(h.tokens, h.score, h.log_prob) for h in hyps] for hyps in gen.hypotheses]  # noqa: E731
    return key(a) == key(b)


def interleave(name: str, baseline: Callable, current: Callable, same: Callable, rounds: int) -> dict:
    """Check equal outputs, then `rounds` ABBA rounds; per side the times, and the per-round ratios' spread."""
    if not same(baseline(), current()):
        raise SystemExit(f"{name}: the working tree's output differs from the baseline's: not timing it")
    wall: dict[str, list[float]] = {"baseline": [], "current": []}
    cpu: dict[str, list[float]] = {"baseline": [], "current": []}
    runs = {"baseline": baseline, "current": current}
    for r in range(rounds):
        for side in ("baseline", "current") if r % 2 == 0 else ("current", "baseline"):
            t0, c0 = time.perf_counter(), time.process_time()
            runs[side]()
            wall[side].append(time.perf_counter() - t0)
            cpu[side].append(time.process_time() - c0)

    def ratio(times):
        per_round = [b / c for b, c in zip(times["baseline"], times["current"])]
        return {"median": statistics.median(per_round), "min": min(per_round), "max": max(per_round)}

    out = {"identical_outputs": True, "wall_s": wall, "cpu_s": cpu,
           "median_cpu_s": {k: statistics.median(v) for k, v in cpu.items()},
           "baseline_over_current_cpu": ratio(cpu), "baseline_over_current_wall": ratio(wall)}
    c, w = out["baseline_over_current_cpu"], out["baseline_over_current_wall"]
    print(f"{name:40s} CPU s {out['median_cpu_s']['baseline']:.3f} -> {out['median_cpu_s']['current']:.3f}  "
          f"baseline/current CPU x{c['median']:.3f} [{c['min']:.3f}, {c['max']:.3f}]  "
          f"wall x{w['median']:.3f} [{w['min']:.3f}, {w['max']:.3f}]", flush=True)
    return out


def tiny_workloads(args) -> dict[str, tuple[Callable, Callable, Callable]]:
    import peers
    from bench_decode import workbench_from_hf
    from workbench_baseline.decoding import search as base_search

    from workbench.decoding import search

    cfg, dev = peers.CONFIGS["tiny"], torch.device("cpu")
    src = peers.random_tokens(64, 32, cfg["vocab"], dev, 4)  # bench_decode.py's sources (its seed 0 + 4)
    hf = peers.Peer("hf-marian-sdpa", cfg, dev, 0)
    current = workbench_from_hf(hf.model.float().eval()).float().eval()
    baseline = baseline_twin(current)
    fixed = dict(min_len=64, max_len=64)
    return {
        "tiny beam 5, 64 x 64": (lambda: base_search.beam_search(baseline, src, beam=5, **fixed),
                                 lambda: search.beam_search(current, src, beam=5, **fixed), same_generation),
        "tiny greedy, 64 x 64": (lambda: base_search.greedy(baseline, src, **fixed),
                                 lambda: search.greedy(current, src, **fixed), same_generation),
    }


def shipped_workloads(args) -> dict[str, tuple[Callable, Callable, Callable]]:
    from bench_decode import SHIPPED_TESTS
    from workbench_baseline.decoding import search as base_search

    import workbench
    from workbench.decoding import translator

    tm = workbench.load(ROOT / "checkpoints" / args.shipped, device="cpu")
    test = ROOT.parent / "shared" / "data" / "multi30k" / SHIPPED_TESTS[args.shipped]
    lines = test.read_text(encoding="utf-8").splitlines()[: args.sents]
    current, baseline = tm.model, baseline_twin(tm.model)

    @contextlib.contextmanager
    def baseline_inside():
        generate = translator.generate
        tm.model, translator.generate = baseline, base_search.generate
        try:
            yield
        finally:
            tm.model, translator.generate = current, generate

    def run(beam: int, on_baseline: bool) -> list[str]:
        with baseline_inside() if on_baseline else contextlib.nullcontext():
            return tm.translate(lines, beam=beam)

    equal = lambda a, b: a == b  # noqa: E731
    return {f"{args.shipped} {kind}, {len(lines)} sentences":
            (lambda b=beam: run(b, True), lambda b=beam: run(b, False), equal)
            for kind, beam in (("beam 5", 5), ("greedy", 1))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="git revision whose workbench package is the baseline")
    ap.add_argument("--shipped", default=None, help="a shipped checkpoint's test set instead of the tiny workload")
    ap.add_argument("--sents", type=int, default=250, help="test lines translated per run (--shipped)")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds (at least 7)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.rounds < 7:
        raise SystemExit(f"--rounds ({args.rounds}) must be at least 7")
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="ab_decode_") as tmp:
        unpack_baseline(args.baseline, Path(tmp))
        workloads = shipped_workloads(args) if args.shipped else tiny_workloads(args)
        results = {name: interleave(name, *fns, rounds=args.rounds) for name, fns in workloads.items()}
    if args.json:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.baseline], check=True,
                             capture_output=True, text=True).stdout.strip()
        meta = {"command": "python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
                "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "baseline": rev, "torch": torch.__version__, "threads": torch.get_num_threads(),
                "timing": "ABBA rounds in one process; ratio = baseline seconds / working tree seconds per round"}
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()

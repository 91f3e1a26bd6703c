"""Steered against unsteered beam search on the shipped de->en model, in one run:

    .venv/bin/python benchmarks/bench_steering.py [--sentences 100] [--beam 5] [--reps 5]
                                                  [--out benchmarks/results/steering_cpu.json]

Each rep translates the first --sentences Multi30k test2016 sources (beam search with the KV cache, the
checkpoint's decoding defaults otherwise) once per variant, the variants interleaved in a rotating order so drift
and warm-up hit them alike; the figure is each variant's median over reps divided by the unsteered median
(`ratio_to_plain`), beside the ratio of the fastest reps (`ratio_of_fastest`) and of the process's CPU seconds
(`cpu_ratio_to_plain`, median over reps; with one thread, the least sensitive to other load on a shared machine).

  - plain: no dictionary spliced.
  - spliced: every shipped dictionary spliced in, none steered (the splice's idle cost).
  - +0 at SITE: one feature steered by an edit of 0 at one site. The translations are the plain ones bit for bit
    (asserted), so the search takes the same steps and the ratio is the steering machinery's cost alone: the
    hooks, the dictionary's encoder, the decoded edit. hook_memory is encoder-side (the splice runs once per
    batch); dec.1.cross_attn.hook_out and dec.1.ffn (a transcoder) run at every step on every live beam.
  - +0 at 3 sites: the three together.
  - steer hook_memory, steer 3 sites: real edits (the notebook's "woman" feature clamped to 0.3; with it, a
    decoder feature +20 and a transcoder feature clamped to 4). Translations change, and so does their length
    (with the three sites many run to the length limit, and a longer output costs more per token: its attention
    reads a longer cache), so these figures are not the steering's cost; `per_token_ratio` divides by the tokens
    generated.

Goal: steered beam search at most 1.2x the unsteered one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from contextlib import ExitStack
from pathlib import Path

import torch

from workbench.corpus.data import load_dataset
from workbench.decoding.translator import load
from workbench.features import SparseDictionary, splice
from workbench.features.steering import selective_feature

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("WORKBENCH_DATA", ROOT.parent / "shared" / "data"))
CKPT = ROOT / "checkpoints" / "multi30k-de-en"
WOMAN = "{woman}"  # the notebook's "woman" feature, found by the notebook's rule at start (ids change with retraining)
STEERS = {
    "+0 at hook_memory": {"hook_memory": {100: "+0"}},
    "+0 at dec.1.cross_attn.hook_out": {"dec.1.cross_attn.hook_out": {9: "+0"}},
    "+0 at dec.1.ffn": {"dec.1.ffn": {3: "+0"}},
    "+0 at 3 sites": {"hook_memory": {100: "+0"}, "dec.1.cross_attn.hook_out": {9: "+0"}, "dec.1.ffn": {3: "+0"}},
    "steer hook_memory": {"hook_memory": {WOMAN: 0.3}},
    "steer 3 sites": {"hook_memory": {WOMAN: 0.3}, "dec.1.cross_attn.hook_out": {9: "+20"}, "dec.1.ffn": {3: 4.0}},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=int, default=100)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "steering_cpu.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tm = load(CKPT, device=args.device)
    sources = (DATA / "multi30k" / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[: args.sentences]
    dictionaries = [SparseDictionary.load(d, device=args.device) for d in sorted((CKPT / "features").iterdir())
                    if (d / "cfg.json").is_file()]
    memory = next(d for d in dictionaries if d.cfg.hook_name == "hook_memory")
    valid_src, _ = load_dataset("multi30k", "valid", "de", "en", limit=300)  # notebook 08's steering cell's rule
    woman = selective_feature(tm, memory, valid_src, {"frau", "frauen", "mädchen"})
    steers = {name: {site: {(woman if f == WOMAN else f): v for f, v in edits.items()} for site, edits in s.items()}
              for name, s in STEERS.items()}

    def sync() -> None:
        if tm.device.type == "cuda":
            torch.cuda.synchronize()

    def plain() -> list[list[int]]:
        return [r.tokens for r in tm.translate(sources, beam=args.beam, return_tokens=True)]

    def spliced(steer=None):
        def run() -> list[list[int]]:
            with ExitStack() as stack:
                for d in dictionaries:
                    stack.enter_context(splice(tm.model, d))
                return [r.tokens for r in tm.translate(sources, beam=args.beam, steer=steer, return_tokens=True)]
        return run

    variants = {"plain": plain, "spliced": spliced()} | {name: spliced(s) for name, s in steers.items()}
    outputs = {name: fn() for name, fn in variants.items()}  # warm-up, and what each variant translates
    for name, out in outputs.items():
        if name == "spliced" or name.startswith("+0"):
            assert out == outputs["plain"], f"{name} changed a translation"
    tokens = {name: sum(len(t) for t in out) for name, out in outputs.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for rep in range(args.reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            variants[name]()
            sync()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    base = statistics.median(times["plain"])
    cpu_base = statistics.median(cpu["plain"])
    result = {
        "device": str(tm.device), "torch": torch.__version__, "machine": platform.machine(), "threads": args.threads,
        "checkpoint": CKPT.name, "sentences": len(sources), "beam": args.beam, "reps": args.reps,
        "steers": steers, "woman_feature": woman, "goal": "steered beam search <= 1.2x unsteered",
        "seconds": {name: [round(t, 4) for t in ts] for name, ts in times.items()},
        "median_s": {name: round(statistics.median(ts), 4) for name, ts in times.items()},
        "ratio_to_plain": {name: round(statistics.median(ts) / base, 3) for name, ts in times.items()},
        "ratio_of_fastest": {name: round(min(ts) / min(times["plain"]), 3) for name, ts in times.items()},
        "cpu_seconds": {name: [round(t, 4) for t in ts] for name, ts in cpu.items()},
        "cpu_ratio_to_plain": {name: round(statistics.median(ts) / cpu_base, 3) for name, ts in cpu.items()},
        "load_average": os.getloadavg(),
        "generated_tokens": tokens,
        "per_token_ratio": {name: round(statistics.median(ts) / tokens[name] / (base / tokens["plain"]), 3)
                            for name, ts in times.items()},
        "changed_translations": {name: sum(a != b for a, b in zip(out, outputs["plain"]))
                                 for name, out in outputs.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: result[k] for k in ("median_s", "ratio_to_plain", "ratio_of_fastest", "cpu_ratio_to_plain",
                                              "per_token_ratio", "changed_translations", "load_average")}, indent=1))


if __name__ == "__main__":
    main()

"""Integrated gradients on the shipped models: convergence delta at the default (adaptive) rule vs the 32-step
midpoint rule, and the source-attribution agreement table recomputed with converged integrated gradients.

    python benchmarks/bench_ig.py --pairs 20 --out benchmarks/results/ig_cpu.json

Sentences: the noun-swap pairs of benchmarks/bench_why.py (Multi30k test2016, clean outputs) for multi30k-de-en;
the first `--sentences` lines of newstest2014 (English side, the model's own outputs) for general-en-de.
|delta| per output step = |sum of its attributions - (log p(y_t | x) - log p(y_t | baseline))|, in nats.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench import load  # noqa: E402
from workbench.analysis import attribution_agreement, integrated_gradients, noun_swaps  # noqa: E402
from workbench.core.batching import decoder_input  # noqa: E402
from workbench.corpus.data import dataset_files  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def deltas(model, sentences, steps):
    """Per sentence: max |delta| over its steps, evaluations' wall time."""
    out = []
    for src, tgt, targets in sentences:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            _, d = integrated_gradients(model, src, tgt, targets, steps=steps, return_convergence_delta=True)
        out.append({"steps": int(targets.size(1)), "max_abs_delta": float(d.abs().max()),
                    "mean_abs_delta": float(d.abs().mean()), "seconds": time.perf_counter() - t0})
    return out


def summary(rows):
    n = sum(r["steps"] for r in rows)
    return {"sentences": len(rows), "output_steps": n,
            "mean_abs_delta_per_step": sum(r["mean_abs_delta"] * r["steps"] for r in rows) / n,
            "median_max_abs_delta": statistics.median(r["max_abs_delta"] for r in rows),
            "max_abs_delta": max(r["max_abs_delta"] for r in rows),
            "seconds_per_sentence": statistics.mean(r["seconds"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--sentences", type=int, default=5, help="general-en-de sentences")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--skip-agreement", action="store_true")
    ap.add_argument("--only-agreement", action="store_true",
                    help="the agreement table alone (to run beside a --skip-agreement run on another core)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = {"torch": torch.__version__, "machine": platform.processor() or platform.machine(),
              "threads": args.threads, "models": {}}

    def save():
        if args.out:
            args.out.write_text(json.dumps(result, indent=2) + "\n")

    tm = load(ROOT / "checkpoints" / "multi30k-de-en")
    model = tm.model.eval()
    de, _ = dataset_files("multi30k", "test", "de", "en", root=ROOT.parent / "shared" / "data", download=False)
    pairs = noun_swaps(tm, Path(de).read_text(encoding="utf-8").splitlines(), max_pairs=args.pairs)
    eos = torch.full((1, 1), model.cfg.eos_id)
    sents = [(q.src, q.tgt, torch.cat([q.tgt[:, 1:], eos], 1)) for q in pairs]
    if not args.only_agreement:
        m30k = {"midpoint_32": summary(deltas(model, sents, 32))}
        log(f"multi30k-de-en midpoint 32: {m30k['midpoint_32']}")
        m30k["adaptive"] = summary(deltas(model, sents, None))
        log(f"multi30k-de-en adaptive: {m30k['adaptive']}")
        result["models"]["multi30k-de-en"] = m30k
        save()

        gen = load(ROOT / "checkpoints" / "general-en-de")
        en = (ROOT.parent / "shared" / "data" / "wmt-news" / "newstest2014.en").read_text(encoding="utf-8").splitlines()
        outs = gen.translate(en[: args.sentences], return_tokens=True)
        g_sents = [(torch.tensor([r.source_tokens]), torch.tensor([decoder_input(r.tokens, gen.model.cfg.start_id)]),
                    torch.tensor([r.tokens])) for r in outs]
        g = {"midpoint_32": summary(deltas(gen.model, g_sents, 32))}
        log(f"general-en-de midpoint 32: {g['midpoint_32']}")
        g["adaptive"] = summary(deltas(gen.model, g_sents, None))
        log(f"general-en-de adaptive: {g['adaptive']}")
        result["models"]["general-en-de"] = g
        save()

    if not args.skip_agreement:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            table = attribution_agreement(model, sents)
        log(f"attribution agreement (adaptive IG): {time.perf_counter() - t0:.1f} s")
        print(table.round(2).to_string())
        result["attribution_agreement"] = {"sentences": table.attrs["sentences"], "steps": table.attrs["steps"],
                                           "ig": "adaptive (default)", "mean_step_spearman": table.round(4).to_dict()}
        save()


if __name__ == "__main__":
    main()

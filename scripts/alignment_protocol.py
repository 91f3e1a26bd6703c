"""The AER table of docs/analysis.md §10 under each paper's own protocol, beside the published figures.

    python scripts/alignment_protocol.py --checkpoint checkpoints/general-en-de \
        --src ../shared/data/alignments/rwth-deen/test.en --tgt ../shared/data/alignments/rwth-deen/test.de \
        --gold ../shared/data/alignments/rwth-deen/test.talp --swap-gold --json docs/evidence/alignment_protocol.json

Per method (attention weights, norms, ALTI+) and shift (AWO, AWI): whole-layer maps, one argmax link per target
word, the paper's EOS rule, no symmetrization, the best layer on all the given lines, and a bootstrap 95 %
interval over sentences (`word_align.papers_protocol`). The checkpoint's own aligner (alignment.json) is scored
on the same lines for contrast, though it was chosen on lines 1-150 of them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from workbench.analysis.alignment.alignment import bootstrap_aer, read_alignments, score_alignments
from workbench.analysis.alignment.word_align import (
    ATTENTION_METHODS,
    SHIFTS,
    align_pairs,
    aligner,
    encode_words,
    papers_protocol,
)
from workbench.decoding.translator import load

NAMES = {"weights": "attention weights", "norms": "norms ‖Σ α f(x)‖ (Kobayashi et al. 2020)",
         "alti": "ALTI+ (Ferrando et al. 2022)"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--tgt", required=True)
    ap.add_argument("--gold", required=True)
    ap.add_argument("--swap-gold", action="store_true", help="the gold writes the model's target word first")
    ap.add_argument("--methods", default=",".join(ATTENTION_METHODS))
    ap.add_argument("--shifts", default=",".join(SHIFTS))
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--eos", choices=["drop", "null"], default=None,
                    help="one EOS rule for every method (a sensitivity check; default: each paper's own)")
    ap.add_argument("--json", default=None, help="write the figures here too")
    args = ap.parse_args()

    tm = load(args.checkpoint)
    src = Path(args.src).read_text(encoding="utf-8").splitlines()
    tgt = Path(args.tgt).read_text(encoding="utf-8").splitlines()
    gold = read_alignments(args.gold, base=1, swap=args.swap_gold)
    sources = [encode_words(tm.src_tokenizer, s) for s in src]
    targets = [encode_words(tm.tgt_tokenizer, t) for t in tgt]
    rows, start = [], time.perf_counter()
    for method in args.methods.split(","):
        t0 = time.perf_counter()
        rows += papers_protocol(tm.model, sources, targets, gold, methods=[method], shifts=args.shifts.split(","),
                                draws=args.draws, eos=args.eos)
        print(f"# {method}: {time.perf_counter() - t0:.0f} s", flush=True)

    print(f"\n{Path(args.checkpoint).name}, {len(src)} lines, AER % (95 % bootstrap interval over sentences, "
          f"{args.draws} draws); best layer on all lines, argmax per target word, no symmetrization\n")
    print("| method | EOS | shift | best layer | AER % | 95 % interval | published (paper's model) | "
          "precision % | recall % |")
    print("|---|---|---|---:|---:|---|---:|---:|---:|")
    for r in rows:
        pub = "–" if r.published is None else f"{r.published:.1f}"
        print(f"| {NAMES.get(r.method, r.method)} | {r.eos} | {r.shift.upper()} | L{r.layer} | "
              f"{100 * r.score.aer:.1f} | {100 * r.interval[0]:.1f}–{100 * r.interval[1]:.1f} | {pub} | "
              f"{100 * r.score.precision:.1f} | {100 * r.score.recall:.1f} |")
    result = {"checkpoint": args.checkpoint, "lines": len(src), "draws": args.draws, "seconds": None,
              "rows": [{"method": r.method, "shift": r.shift, "eos": r.eos, "layer": r.layer, "aer": r.score.aer,
                        "interval": list(r.interval), "per_layer": list(r.per_layer), "published": r.published,
                        "precision": r.score.precision, "recall": r.score.recall} for r in rows]}
    if tm.alignment:  # the checkpoint's own aligner on the same lines, for contrast (chosen on lines 1-150)
        spec = aligner(tm.model, tm.alignment, directory=tm.meta["path"])[0].check(tm.model)
        links = align_pairs(tm.model, tm.src_tokenizer, tm.tgt_tokenizer, src, tgt, spec)
        own, ci = score_alignments(links, gold), bootstrap_aer(links, gold, draws=args.draws)
        print(f"\nits alignment.json ({spec.label()}) on the same {len(src)} lines: AER {100 * own.aer:.1f} % "
              f"({100 * ci[0]:.1f}–{100 * ci[1]:.1f})")
        result["own"] = {"label": spec.label(), "aer": own.aer, "interval": list(ci)}
    result["seconds"] = round(time.perf_counter() - start, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

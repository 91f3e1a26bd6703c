"""`workbench evaluate --checkpoint DIR --src FILE --ref FILE [--ref FILE ...]`: sacrebleu BLEU and chrF.

Prints the scores with their signatures (or one JSON object with --json); decoding flags as `workbench translate`.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..decoding.evaluate import evaluate, read_lines, read_text
from ..decoding.translator import load
from .translate import add_decode_arguments, decode_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_decode_arguments(p)
    p.add_argument("--src", required=True, metavar="FILE", help="source sentences, one per line")
    p.add_argument("--ref", required=True, action="append", metavar="FILE",
                   help="reference translations; repeat for several references")
    p.add_argument("--hyp-out", dest="hyp_out", default=None, metavar="FILE", help="write the hypotheses here")
    p.add_argument("--json", action="store_true", help="print the scores as one JSON object")


def run(args: argparse.Namespace) -> int:
    with open(args.src, "rb") as fh:
        sources = list(read_lines(fh, errors=args.errors, name=args.src))
    refs = [read_text(r) for r in args.ref]
    for path, r in zip(args.ref, refs):
        if len(r) != len(sources):
            raise ValueError(f"{path} has {len(r)} lines but {args.src} has {len(sources)}")
    tm = load(args.checkpoint, device=args.device)
    options = decode_options(args)
    result = evaluate(tm, sources, refs, **options)
    if args.hyp_out:
        with open(args.hyp_out, "w", encoding="utf-8", newline="\n") as fh:
            fh.writelines(h + "\n" for h in result.hypotheses)
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        print(f"BLEU = {result.bleu:.2f}  {result.bleu_signature}")
        print(f"     {result.bleu_detail}")
        print(f"chrF = {result.chrf:.2f}  {result.chrf_signature}")
        print(f"looping: {result.looping:.2f}% of outputs repeat a word 4-gram three or more times")
    sys.stdout.flush()
    return 0

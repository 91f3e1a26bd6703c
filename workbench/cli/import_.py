"""`workbench import {marian,fsmt,fairseq,opennmt} SOURCE --out DIR`: convert a published checkpoint.

SOURCE is a local directory or file, a Hugging Face hub id (hf:Helsinki-NLP/opus-mt-en-de) or a
URL (fairseq/OpenNMT-py archives); downloads go to $WORKBENCH_CACHE (~/.cache/attention-workbench).
The conversion report (what came from where, what was ignored and why) is printed and saved in
the checkpoint's meta.json.
"""

from __future__ import annotations

import argparse
import sys

from ..corpus.download import NetworkUnreachable
from ..importers import import_checkpoint

FORMATS = ("marian", "fsmt", "fairseq", "opennmt")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", choices=FORMATS, help="source toolkit")
    parser.add_argument("source", help="local path, hf:owner/name (marian, fsmt) or an http(s) URL")
    parser.add_argument("--out", required=True, help="checkpoint directory to write")
    parser.add_argument("--spm", default=None, help="opennmt: sentencepiece model (default: *.model beside the .pt)")
    parser.add_argument("--alpha", type=float, default=None,
                        help="fairseq: length-penalty exponent to record, as translate --alpha (default 1.0)")
    parser.add_argument("--quiet", action="store_true", help="print only the output path")


def run(args: argparse.Namespace) -> int:
    options = {}
    if args.spm is not None:
        options["spm"] = args.spm
    if args.alpha is not None:
        options["lenpen"] = args.alpha
    try:
        imported = import_checkpoint(args.format, args.source, **options)
    except NetworkUnreachable as exc:
        print(f"workbench import: {exc}", file=sys.stderr)
        return 3
    out = imported.save(args.out)
    if not args.quiet:
        print(imported.report.summary())
        if imported.src_tokenizer is None:
            print("  warning: no tokenizer files found; the checkpoint works on ids only")
    print(out)
    return 0

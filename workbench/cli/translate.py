"""`workbench translate`: one output line per input line, in order, streamed in chunks.

Invalid UTF-8 policy: by default a line that is not valid UTF-8 stops the run with an error
naming the line and byte offset (nothing is silently altered); `--errors replace` substitutes
U+FFFD for the bad bytes and warns once per line instead (sacrebleu and Marian read input the
same strict way by default).
"""

from __future__ import annotations

import argparse
import sys

from ..analysis.alignment import format_pharaoh
from ..analysis.word_align import AlignmentSpec, align_pairs, fallback_spec
from ..decoding.evaluate import read_lines
from ..decoding.translator import load

DECODE_FLAGS = ("beam", "n_best", "length_penalty", "alpha", "max_len_a", "max_len_b", "max_len", "min_len",
                "no_repeat_ngram", "max_tokens")


def add_decode_arguments(p: argparse.ArgumentParser) -> None:
    """Decoding options shared with `workbench evaluate`; unset ones keep the checkpoint's defaults."""
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="checkpoint (or run) directory")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--beam", type=int, default=None, metavar="N", help="beam size (1 = greedy)")
    p.add_argument("--length-penalty", dest="length_penalty", choices=["average", "gnmt", "none"], default=None)
    p.add_argument("--alpha", type=float, default=None, help="length-penalty exponent")
    p.add_argument("--max-len-a", dest="max_len_a", type=float, default=None)
    p.add_argument("--max-len-b", dest="max_len_b", type=int, default=None)
    p.add_argument("--max-len", dest="max_len", type=int, default=None, help="absolute output length limit")
    p.add_argument("--min-len", dest="min_len", type=int, default=None)
    p.add_argument("--no-repeat-ngram", dest="no_repeat_ngram", type=int, default=None)
    p.add_argument("--max-tokens", dest="max_tokens", type=int, default=None, metavar="K",
                   help="source tokens per batch, padding included (as training's max_tokens)")
    p.add_argument("--errors", choices=["strict", "replace"], default="strict",
                   help="invalid UTF-8 input: stop with the line number (strict) or replace and warn")


def decode_options(args: argparse.Namespace) -> dict:
    """The decoding flags the user set, as keyword arguments for `TranslationModel.config_with`."""
    return {k: getattr(args, k) for k in DECODE_FLAGS if getattr(args, k, None) is not None}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_decode_arguments(p)
    p.add_argument("--input", "-i", default="-", metavar="FILE", help="input file (default: stdin)")
    p.add_argument("--output", "-o", default="-", metavar="FILE", help="output file (default: stdout)")
    p.add_argument("--chunk", type=int, default=512, help="lines held in memory at once (sorted within a chunk)")
    p.add_argument("--alignments", action="store_true",
                   help="append ' ||| i-j ...' to each output: its word alignment to the source (0-based, source "
                        "first; the checkpoint's own aligner, as `workbench align` computes it)")


def run(args: argparse.Namespace) -> int:
    tm = load(args.checkpoint, device=args.device)
    options = decode_options(args)
    tm.decode_config = tm.config_with(**options)  # validate before reading any input
    source = sys.stdin.buffer if args.input == "-" else open(args.input, "rb")  # noqa: SIM115
    sink = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
    try:
        lines = read_lines(source, errors=args.errors, name=args.input if args.input != "-" else "stdin")
        if args.alignments:
            _translate_aligned(tm, lines, sink, args.chunk)
        else:
            for text in tm.translate_lines(lines, chunk=args.chunk):
                sink.write(text + "\n")
        sink.flush()
    finally:
        if source is not sys.stdin.buffer:
            source.close()
        if sink is not sys.stdout:
            sink.close()
    return 0


def _translate_aligned(tm, lines, sink, chunk: int) -> None:
    """Chunk by chunk: translate, then align each output to its source (teacher-forced, as `workbench align`)."""
    spec = AlignmentSpec.from_dict(tm.alignment) if tm.alignment else fallback_spec(tm.model)
    buffer: list[str] = []

    def flush() -> None:
        outputs = list(tm.translate_lines(buffer, chunk=chunk))
        links = align_pairs(tm.model, tm.src_tokenizer, tm.tgt_tokenizer, buffer, outputs, spec, skip_long=True)
        for text, link in zip(outputs, links):
            sink.write(f"{text} ||| {format_pharaoh(link)}\n")
        buffer.clear()

    for line in lines:
        buffer.append(line)
        if len(buffer) >= chunk:
            flush()
    if buffer:
        flush()

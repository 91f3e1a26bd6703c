"""`workbench translate`: one output line per input line, in order, streamed in chunks.

Invalid UTF-8 policy: by default a line that is not valid UTF-8 stops the run with an error
naming the line and byte offset (nothing is silently altered); `--errors replace` substitutes
U+FFFD for the bad bytes and warns once per line instead (sacrebleu and Marian read input the
same strict way by default).

Steering: `--steer SITE:FEATURE=VALUE` (repeatable) edits a dictionary feature at every position while decoding:
`hook_memory:12=5` clamps feature 12 of the hook_memory dictionary to 5, `dec.1.ffn:3=+2` adds 2 to it,
`hook_memory:12==-2` clamps it to -2 (`TranslationModel.translate(steer=...)`). Each steered site's dictionary is
`--dictionary DIR` (repeatable; its site comes from its cfg.json) or else the checkpoint's `features/SITE/`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..analysis.alignment.alignment import format_pharaoh
from ..analysis.alignment.word_align import align_pairs, aligner
from ..analysis.training_dynamics.confidence import lacks
from ..decoding.evaluate import read_lines
from ..decoding.translator import TranslationModel, load
from ..features.dictionary import SparseDictionary
from ..features.sites import site_of, splice

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
    p.add_argument("--steer", action="append", default=[], metavar="SITE:FEATURE=VALUE",
                   help="edit a dictionary feature at every position while decoding: VALUE clamps it (=-2 clamps "
                        "to a negative), +VALUE or -VALUE adds; repeatable, e.g. --steer hook_memory:12=5")
    p.add_argument("--dictionary", action="append", default=[], metavar="DIR",
                   help="a dictionary for --steer (cfg.json + sae_weights.safetensors; its site from cfg.json); "
                        "repeatable; a steered site without one reads the checkpoint's features/SITE/")


def parse_steer_args(specs: list[str]) -> dict[str, dict[int, str]]:
    """{site: {feature: value text}} from --steer SITE:FEATURE=VALUE flags; a malformed flag raises ValueError."""
    steer: dict[str, dict[int, str]] = {}
    for spec in specs:
        left, eq, value = spec.partition("=")
        site, colon, feature = left.rpartition(":")
        if not (eq and colon and site and value):
            raise ValueError(f"--steer {spec!r}: expected SITE:FEATURE=VALUE, e.g. hook_memory:12=5 or dec.1.ffn:3=+2")
        try:
            index = int(feature)
        except ValueError:
            raise ValueError(f"--steer {spec!r}: the feature must be an integer id, got {feature!r}") from None
        steer.setdefault(site, {})[index] = value
    return steer


def steering_dictionaries(tm: TranslationModel, steer: dict, paths: list[str]) -> list[SparseDictionary]:
    """The dictionaries to splice for `steer`: the --dictionary ones, then the checkpoint's features/SITE/."""
    given = [SparseDictionary.load(p, device=tm.device) for p in paths]
    by_site = {site_of(d).name: d for d in given}
    root = Path(tm.meta.get("path", "")) / "features"
    for site in steer:
        if site not in by_site:
            directory = root / site
            if not (directory / "cfg.json").is_file():
                shipped = sorted(p.name for p in root.iterdir() if (p / "cfg.json").is_file()) if root.is_dir() else []
                raise ValueError(f"--steer {site}: no dictionary for that site (none at {directory}; the "
                                 f"checkpoint has {shipped or 'none'}); give --dictionary DIR")
            by_site[site] = SparseDictionary.load(directory, device=tm.device)
    return list(by_site.values())


def run(args: argparse.Namespace) -> int:
    tm = load(args.checkpoint, device=args.device)
    options = decode_options(args)
    tm.decode_config = tm.config_with(**options)  # validate before reading any input
    steer = parse_steer_args(getattr(args, "steer", []))
    if getattr(args, "dictionary", []) and not steer:
        raise ValueError("--dictionary is read for --steer only; give a --steer SITE:FEATURE=VALUE too")
    with contextlib.ExitStack() as spliced:
        for d in steering_dictionaries(tm, steer, getattr(args, "dictionary", [])) if steer else []:
            spliced.enter_context(splice(tm.model, d))
        if steer:
            tm.translate([], steer=steer)  # an unknown site or a feature out of range is refused before any input
        return _run(tm, args, steer or None)


def _run(tm: TranslationModel, args: argparse.Namespace, steer: dict | None) -> int:
    source = sys.stdin.buffer if args.input == "-" else open(args.input, "rb")  # noqa: SIM115
    sink = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
    try:
        name = args.input if args.input != "-" else "stdin"
        lines = _warn_wordless(read_lines(source, errors=args.errors, name=name))
        if args.alignments:
            _translate_aligned(tm, lines, sink, args.chunk, steer)
        else:
            for text in tm.translate_lines(lines, chunk=args.chunk, steer=steer):
                sink.write(text + "\n")
        sink.flush()
    finally:
        if source is not sys.stdin.buffer:
            source.close()
        if sink is not sys.stdout:
            sink.close()
    return 0


def _warn_wordless(lines: Iterable[str]) -> Iterator[str]:
    """The lines unchanged, with a one-line warning for each that has neither letters nor digits (emoji,
    punctuation): the model has nothing to translate there, and its output means nothing."""
    for number, line in enumerate(lines, 1):
        if lacks(line) == "letters or digits":
            warnings.warn(f"line {number} has no words (no letters or digits): its translation means nothing",
                          stacklevel=2)
        yield line


def _translate_aligned(tm, lines, sink, chunk: int, steer: dict | None = None) -> None:
    """Chunk by chunk: translate, then align each output to its source (teacher-forced, as `workbench align`)."""
    spec = aligner(tm.model, tm.alignment or None, directory=tm.meta.get("path"))[0]
    buffer: list[str] = []

    def flush() -> None:
        outputs = list(tm.translate_lines(buffer, chunk=chunk, steer=steer))
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

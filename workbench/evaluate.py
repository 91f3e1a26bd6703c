"""Corpus BLEU and chrF with sacrebleu (and its signatures), from Python or `workbench evaluate`.

    scores = evaluate(tm, sources, [refs])            # translates, then scores
    scores.bleu, scores.chrf, scores.bleu_signature   # same numbers the CLI prints
    score(hypotheses, [refs_a, refs_b])               # several references: one list per reference set

Scoring is sacrebleu's defaults (BLEU: 13a tokenisation, exp smoothing; chrF: n=6, beta=2) on
detokenised text, so numbers compare with published sacrebleu scores.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Scores:
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    bleu_detail: str
    """sacrebleu's one-line BLEU report (precisions, brevity penalty, lengths)."""
    sentences: int
    references: int
    hypotheses: list[str] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("hypotheses")
        return out


def score(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> Scores:
    """BLEU and chrF of hypotheses against one or more reference sets (each as long as the hypotheses)."""
    from sacrebleu.metrics import BLEU, CHRF

    hyps = list(hypotheses)
    refs = [list(r) for r in references]
    if not refs:
        raise ValueError("at least one reference set is needed")
    for k, r in enumerate(refs):
        if len(r) != len(hyps):
            raise ValueError(f"reference set {k + 1} has {len(r)} lines but there are {len(hyps)} hypotheses")
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hyps, refs)
    c = chrf.corpus_score(hyps, refs)
    return Scores(bleu=b.score, chrf=c.score, bleu_signature=str(bleu.get_signature()),
                  chrf_signature=str(chrf.get_signature()), bleu_detail=str(b), sentences=len(hyps),
                  references=len(refs), hypotheses=hyps)


def evaluate(model, sources: Sequence[str], references: Sequence[Sequence[str]], **options: Any) -> Scores:
    """Translate `sources` with a TranslationModel (options override its decoding defaults) and score them."""
    sources = list(sources)
    for k, r in enumerate(references):
        if len(r) != len(sources):
            raise ValueError(f"reference set {k + 1} has {len(r)} lines but there are {len(sources)} sources")
    hyps = model.translate(sources, **options)
    return score(hyps, references)


def read_text(path: str | Path) -> list[str]:
    """Lines of a UTF-8 file (no trailing newline); invalid UTF-8 is an error naming the line."""
    from .cli_translate import read_lines

    with open(path, "rb") as fh:
        return list(read_lines(fh, errors="strict", name=str(path)))


# ---------------------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .cli_translate import add_decode_arguments

    add_decode_arguments(p)
    p.add_argument("--src", required=True, metavar="FILE", help="source sentences, one per line")
    p.add_argument("--ref", required=True, action="append", metavar="FILE",
                   help="reference translations; repeat for several references")
    p.add_argument("--hyp-out", dest="hyp_out", default=None, metavar="FILE", help="write the hypotheses here")
    p.add_argument("--json", action="store_true", help="print the scores as one JSON object")


def run(args: argparse.Namespace) -> int:
    from .cli_translate import decode_options, read_lines
    from .translator import load

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
    sys.stdout.flush()
    return 0

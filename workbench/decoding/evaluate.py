"""Corpus BLEU and chrF with sacrebleu (and its signatures), from Python or `workbench evaluate`.

    scores = evaluate(tm, sources, [refs])            # translates, then scores
    scores.bleu, scores.chrf, scores.bleu_signature   # same numbers the CLI prints
    score(hypotheses, [refs_a, refs_b])               # several references: one list per reference set

Scoring is sacrebleu's defaults (BLEU: 13a tokenisation, exp smoothing; chrF: n=6, beta=2) on
detokenised text, so numbers compare with published sacrebleu scores.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO


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
    looping: float = 0.0
    """Percent of hypotheses in which some word 4-gram occurs three or more times (`repetition_share`)."""
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
    if not hyps:  # sacrebleu would fail with an IndexError deep inside its statistics
        raise ValueError("nothing to score: 0 hypotheses and 0 reference lines "
                         "(is the source or reference file empty?)")
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hyps, refs)
    c = chrf.corpus_score(hyps, refs)
    return Scores(bleu=b.score, chrf=c.score, bleu_signature=str(bleu.get_signature()),
                  chrf_signature=str(chrf.get_signature()), bleu_detail=str(b), sentences=len(hyps),
                  references=len(refs), looping=100.0 * repetition_share(hyps), hypotheses=hyps)


def repetition_share(hypotheses: Sequence[str], *, n: int = 4, min_count: int = 3) -> float:
    """Share (0-1) of hypotheses in which some word n-gram occurs at least `min_count` times: a repetition loop.

    "…der Forschung der Forschung der Forschung…" counts; a sentence that says "the" five times does not
    (n = 4 by default). Words are whitespace-separated, as written.
    """
    hyps = list(hypotheses)
    if not hyps:
        return 0.0
    looping = 0
    for h in hyps:
        words = h.split()
        counts = Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
        looping += bool(counts) and max(counts.values()) >= min_count
    return looping / len(hyps)


def evaluate(model, sources: Sequence[str], references: Sequence[Sequence[str]], **options: Any) -> Scores:
    """Translate `sources` with a TranslationModel (options override its decoding defaults) and score them."""
    sources = list(sources)
    for k, r in enumerate(references):
        if len(r) != len(sources):
            raise ValueError(f"reference set {k + 1} has {len(r)} lines but there are {len(sources)} sources")
    hyps = model.translate(sources, **options)
    return score(hyps, references)


def read_lines(stream: BinaryIO, *, errors: str = "strict", name: str = "input") -> Iterator[str]:
    """Decode a byte stream line by line (\\n, with an optional \\r before it), naming bad lines.

    errors="strict" stops at a line that is not valid UTF-8 (line number and byte offset in the
    message); "replace" substitutes U+FFFD and warns once per such line."""
    for number, raw in enumerate(stream, start=1):
        raw = raw.rstrip(b"\n")
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            where = f"{name} line {number} is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
            if errors == "strict":
                raise ValueError(f"{where}; fix the file or pass --errors replace") from None
            warnings.warn(f"{where}; replaced with U+FFFD", stacklevel=2)
            yield raw.decode("utf-8", errors="replace")


def read_text(path: str | Path) -> list[str]:
    """Lines of a UTF-8 file (no trailing newline); invalid UTF-8 is an error naming the line."""
    with open(path, "rb") as fh:
        return list(read_lines(fh, errors="strict", name=str(path)))

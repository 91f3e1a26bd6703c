"""One sentence's evidence: its word alignment (by a chosen method) and each output token's source share.

    ev = sentence_evidence(tm, "Ein Hund läuft .", "A dog runs .", method="alti")
    ev.weights          # (output words, source words): the alignment strengths (rows sum to 1)
    ev.links            # {(source word, output word)}: the argmax alignment, Pharaoh order
    ev.pieces, ev.shares  # output pieces (EOS last) and each one's ALTI+ source share

Words are the whitespace tokens of the two lines (`word_align`: source pieces summed into their word, target
pieces averaged). The links are what `workbench align` writes for the pair: the checkpoint's own aligner
(`alignment.json`: its units, shift, EOS rule and symmetrization), or fairseq's default (last layer, heads
averaged, AWO) when it has none or another method is chosen (`word_align.aligner` decides, for both). The
source shares are teacher-forced on the output as written (`source_share.output_source_shares`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..alignment.alignment import Link
from ..alignment.word_align import METHODS, AlignmentSpec, aligner, alignment_maps, encode_words
from .source_share import LowShareThresholds, output_source_shares


@dataclass(frozen=True)
class SentenceEvidence:
    src_words: list[str]
    out_words: list[str]
    weights: np.ndarray
    links: set[Link]
    method: str
    spec: str
    pieces: list[str]
    shares: np.ndarray
    flags: list[bool]


def aligner_spec(tm, method: str | None = None) -> AlignmentSpec:
    """The aligner `workbench align` uses with no options (`word_align.aligner`): the checkpoint's own
    (alignment.json), else fairseq's default; another `method` starts from the default."""
    return aligner(tm.model, getattr(tm, "alignment", None) or None, method,
                   directory=(getattr(tm, "meta", None) or {}).get("path"))[0]


def describe_aligner(spec: AlignmentSpec, *, own: bool) -> str:
    """One line saying what draws the links: the method, shift and units (a trained alignment layer by name), the
    EOS rule, symmetrization and punctuation rule; for the checkpoint's own aligner (`own`) also its stored
    held-out AER."""
    text = spec.reads()
    if not own:
        return text
    rules = f"EOS {'dropped' if spec.eos == 'drop' else spec.eos}, symmetrized {spec.symmetrize}"
    if spec.punctuation == "apart":
        rules += ", no link between a punctuation mark and a word"
    aer = spec.provenance.get("held_out_aer")
    where = spec.provenance.get("chosen_on", "")
    scored = ""
    if isinstance(aer, (int, float)):
        scored = f"; AER {100 * aer:.1f} % on gold lines it was not chosen on"
        if "test.talp" in str(where):
            scored += " (RWTH de-en)"
    if str(spec.provenance.get("chosen", "")).startswith("fallback"):
        return f"fairseq's default aligner (the checkpoint stores none of its own), {text} ({rules})"
    return f"the checkpoint's aligner, {text} ({rules}){scored}"


def sentence_evidence(tm, source: str, output: str, *, method: str | None = None,
                      thresholds: LowShareThresholds | None = None) -> SentenceEvidence:
    """Alignment and source shares of one (source, output) pair of a `TranslationModel` (module docstring), by the
    checkpoint's own aligner (`method` None) or `method` from the fallback's units; `thresholds` flag the tokens
    with an unusually low source share (else nothing is flagged)."""
    if method is not None and method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    spec = aligner_spec(tm, method)
    own = method is None
    method = spec.method
    src, out = encode_words(tm.src_tokenizer, source), encode_words(tm.tgt_tokenizer, output)
    if not src.ids or not out.ids:
        raise ValueError("both the source and the output need at least one word")
    maps = alignment_maps(tm.model, [src], [out], method=method, shift=spec.shift, layer=spec.layer)[0]
    combined = maps.combined(spec.units)[:, :-1]  # the source EOS column dropped
    weights = combined / np.maximum(combined.sum(-1, keepdims=True), 1e-30)
    links = spec.links_of(maps)  # what `workbench align` writes for this pair, symmetrization included
    eos = tm.model.cfg.eos_id
    ids = [*out.ids, eos]
    shares = output_source_shares(tm.model, [[*src.ids, eos]], [ids])[0]
    pieces = tm.tgt_tokenizer.pieces(ids)
    flags = thresholds.flag(shares, pieces) if thresholds is not None else [False] * len(ids)
    return SentenceEvidence(src.words, out.words, weights, links, method, describe_aligner(spec, own=own),
                            list(pieces), shares, flags)

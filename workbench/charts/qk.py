"""Why a head attends: the top query × key pairs of a QK attribution (`analysis.qk_attribution`, any attention kind)
as a readable table, each part named with the piece it carries.

    table = qk_pairs_table(qk, src_tokens=pieces, tgt_tokens=["<s>", *out_pieces], k=12)   # pandas DataFrame
    qk_caption(qk, src_tokens, tgt_tokens)                                                 # one line of text
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _piece(tokens: Sequence[str] | None, i: int | None) -> str:
    if tokens is None or i is None or not 0 <= i < len(tokens):
        return "" if i is None else f"#{i}"
    return tokens[i]


def part_label(label: str, info: Mapping[str, Any], *, src_tokens: Sequence[str] | None = None,
               tgt_tokens: Sequence[str] | None = None, feature_names: Mapping[tuple[str, int], str] | None = None
               ) -> str:
    """A part of one side as a reader wants it: the token embedding with its piece, a head's split with the piece
    it read from, an FFN with its position's piece, a feature with what it stands for (`feature_names`)."""
    kind, at = info.get("kind"), info.get("from")
    own = src_tokens if info.get("stack") == "enc" else tgt_tokens
    if kind == "embed":
        where = "source" if info.get("stack") == "enc" else "target"
        return f"{where} token {_piece(own, at)!r}" if label.endswith("_tok") else f"{where} position {at}"
    if kind in ("enc_self", "dec_self", "cross") and " <- " in label:
        head = label.split(" <- ")[0]
        read = src_tokens if info.get("from_side") == "enc" else tgt_tokens
        return f"{head} ← {_piece(read, at)!r} ({info.get('weight', 0.0):.2f})"
    if kind == "ffn":
        return f"{label} at {_piece(own, at)!r}"
    if kind == "feature":
        name = (feature_names or {}).get((info.get("site"), info.get("feature")))
        return label + (f" ({name})" if name else "")
    return label


def qk_pairs_table(qk, *, src_tokens: Sequence[str] | None = None, tgt_tokens: Sequence[str] | None = None,
                   k: int = 12, feature_names: Mapping[tuple[str, int], str] | None = None):
    """The k largest terms (by |value|): query side, key side, term, and the term as a share of the score."""
    import pandas as pd  # optional: only the tabular view needs it

    frame = qk.frame(k=k)
    n = qk.terms.size(1)
    order = qk.terms.flatten().abs().argsort(descending=True)[:k].tolist()
    rows = []
    for i, (_, r) in zip(order, frame.iterrows()):
        a, b = divmod(i, n)
        q = part_label(qk.query_labels[a], qk.query_info[a], src_tokens=src_tokens, tgt_tokens=tgt_tokens,
                       feature_names=feature_names)
        key = part_label(qk.key_labels[b], qk.key_info[b], src_tokens=src_tokens, tgt_tokens=tgt_tokens,
                         feature_names=feature_names)
        rows.append({"query side": q, "key side": key, "term": round(float(r["value"]), 4),
                     "share of score": round(float(r["value"]) / qk.score, 3) if qk.score else float("nan")})
    return pd.DataFrame(rows, columns=["query side", "key side", "term", "share of score"])


def qk_caption(qk, src_tokens: Sequence[str] | None = None, tgt_tokens: Sequence[str] | None = None) -> str:
    """One line: which edge, its score and probability, and how exactly the terms rebuild the score."""
    kind = qk.meta.get("kind", "cross")
    queries = src_tokens if kind == "enc_self" else tgt_tokens
    keys, where = (tgt_tokens, "decoder position") if kind == "dec_self" else (src_tokens, "source piece")
    return (f"{kind}:{qk.layer}:{qk.head}, {'source' if kind == 'enc_self' else 'output'} position {qk.t} "
            f"({_piece(queries, qk.t)!r}) reading {where} {qk.s} ({_piece(keys, qk.s)!r}): score {qk.score:.3f} "
            f"(attention {qk.probability:.2f}); {qk.terms.numel():,} terms ({len(qk.query_labels)} query × "
            f"{len(qk.key_labels)} key parts) sum to {qk.total:.3f} (off by {abs(qk.total - qk.score):.1e})")

"""From a `Trace` to the matrix a view draws: one sentence, chosen heads, padding trimmed, words or pieces.

Every view goes through `select_attention`, so they all agree on which tokens a matrix row and column
name, which cells are masked, and how heads are combined.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..core.heads import AttentionKind, check_kind
from ..core.trace import Trace
from .tokens import Scheme, merge_attention, merge_mask, word_groups

KIND_LABEL = {"enc_self": "encoder self-attention", "dec_self": "decoder self-attention", "cross": "cross-attention",
              "combined": "source+target attention"}
Heads = int | Sequence[int] | None  # one head, a chosen set (averaged), or None = all heads averaged


@dataclass(frozen=True)
class Attention:
    """One block's attention for one sentence, ready to draw.

    `values` is (H, Lq, Lk) float32 for the heads in `heads`; `masked` (Lq, Lk) marks cells the model
    could not attend to (padding keys, the causal future), drawn distinctly by every view.
    """

    kind: AttentionKind
    layer: int
    heads: tuple[int, ...]
    values: np.ndarray
    queries: tuple[str, ...]
    keys: tuple[str, ...]
    masked: np.ndarray
    words: bool = False

    @property
    def mean(self) -> np.ndarray:
        """(Lq, Lk) float32 average of the selected heads."""
        return self.values.mean(axis=0, dtype=np.float64).astype(np.float32)

    @property
    def shape(self) -> tuple[int, int]:
        return self.values.shape[-2], self.values.shape[-1]

    def describe(self) -> str:
        if len(self.heads) == 1:
            who = f"head {self.heads[0]}"
        elif len(self.heads) == self.n_heads_total:
            who = "mean of all heads"
        else:
            who = f"mean of heads {list(self.heads)}"
        unit = "words" if self.words else "pieces"
        return f"{KIND_LABEL[self.kind]}, layer {self.layer}, {who} ({unit})"

    n_heads_total: int = 0


def token_strings(trace: Trace, side: str, batch: int = 0, given: Sequence[str] | None = None) -> list[str]:
    """Token strings of one sentence: given ones, else `trace.meta[f"{side}_pieces"]`, else the ids."""
    if given is not None:
        return [str(t) for t in given]
    meta = trace.meta.get(f"{side}_pieces")
    if meta is not None:
        if meta and isinstance(meta[0], (list, tuple)):
            return [str(t) for t in meta[batch]]
        if batch:
            raise ValueError(f"trace.meta['{side}_pieces'] holds one sentence; batch {batch} was asked for")
        return [str(t) for t in meta]
    ids = getattr(trace, side)
    if ids is None:
        raise ValueError(f"trace has no {side} ids or meta['{side}_pieces']; pass the token strings")
    return [str(int(i)) for i in ids[batch]]


def real_length(trace: Trace, side: str, batch: int, pad_id: int | None, full: int) -> int:
    """Tokens before the first padding id (inputs are right-padded)."""
    ids = getattr(trace, side)
    if ids is None or pad_id is None:
        return full
    row = ids[batch].cpu()
    pads = (row == pad_id).nonzero()
    # A leading pad is a decoder start token (Marian starts with pad), never padding.
    pads = pads[pads > 0] if side == "tgt" else pads
    return int(pads[0]) if len(pads) else full


def structural_mask(kind: AttentionKind, lq: int, lk: int, q_real: int, k_real: int) -> np.ndarray:
    """(Lq, Lk) True where the model cannot attend: padding keys, plus the future for decoder self-attention."""
    masked = np.zeros((lq, lk), dtype=bool)
    masked[:, k_real:] = True
    if kind == "dec_self":
        masked |= np.triu(np.ones((lq, lk), dtype=bool), k=1)
    return masked


def select_attention(
    trace: Trace,
    kind: AttentionKind,
    layer: int,
    heads: Heads = None,
    *,
    batch: int = 0,
    src_tokens: Sequence[str] | None = None,
    tgt_tokens: Sequence[str] | None = None,
    words: bool = False,
    scheme: Scheme = "auto",
    trim: bool = True,
    pad_id: int | None = None,
) -> Attention:
    """The attention of one block for one sentence of the batch.

    heads: an int, a list (averaged by `.mean`), or None for all. trim: drop padded positions
    (pad_id from `trace.meta['pad_id']`, default 0). words: merge sub-word pieces (sum over keys,
    mean over queries) so rows still sum to 1.
    """
    check_kind(kind)
    probs = trace.attention(kind, layer)  # (B, H, Lq, Lk)
    if not 0 <= batch < probs.size(0):
        raise IndexError(f"batch index {batch} out of range: the trace holds {probs.size(0)} sentences")
    n_heads = probs.size(1)
    chosen = _heads(heads, n_heads)
    picked = probs[batch] if chosen == tuple(range(n_heads)) else probs[batch, list(chosen)]
    values = picked.detach().to("cpu", torch.float32).numpy()  # (h, Lq, Lk); a view when already float32 CPU
    q_side, k_side = {"enc_self": ("src", "src"), "dec_self": ("tgt", "tgt"), "cross": ("tgt", "src")}[kind]
    given = {"src": src_tokens, "tgt": tgt_tokens}
    q_tok = token_strings(trace, q_side, batch, given[q_side])
    k_tok = token_strings(trace, k_side, batch, given[k_side])
    lq, lk = values.shape[-2:]
    pad = trace.meta.get("pad_id", 0) if pad_id is None else pad_id
    q_real = real_length(trace, q_side, batch, pad, lq)
    k_real = real_length(trace, k_side, batch, pad, lk)
    q_tok, k_tok = _fit(q_tok, lq, q_side, q_real), _fit(k_tok, lk, k_side, k_real)
    masked = structural_mask(kind, lq, lk, q_real, k_real)
    if trim:
        values, masked = values[:, :q_real, :k_real], masked[:q_real, :k_real]
        q_tok, k_tok = q_tok[:q_real], k_tok[:k_real]
    att = Attention(kind, layer, chosen, np.ascontiguousarray(values), tuple(q_tok), tuple(k_tok), masked,
                    n_heads_total=n_heads)
    return to_words(att, scheme) if words else att


def to_words(att: Attention, scheme: Scheme = "auto") -> Attention:
    """Merge both sides' pieces into words (see `tokens.merge_attention`)."""
    if att.words:
        return att
    qg, kg = word_groups(att.queries, scheme), word_groups(att.keys, scheme)
    values = merge_attention(att.values, qg, kg).astype(np.float32)
    return replace(att, values=values, masked=merge_mask(att.masked, qg, kg), queries=qg.words, keys=kg.words,
                   words=True)


def combined_attention(
    trace: Trace,
    enc_layer: int,
    dec_layer: int | None = None,
    heads: Heads = None,
    *,
    words: bool = False,
    scheme: Scheme = "auto",
    **select_kw,
) -> Attention:
    """The tensor2tensor viewer's "all" view: source+target tokens on both sides, one block matrix

        [ enc_self(enc_layer)   masked             ]
        [ cross(dec_layer)      dec_self(dec_layer) ]

    Encoder and decoder may have different depths, hence two layer indices (dec_layer defaults to
    enc_layer). Rows still sum to 1 over each block's own keys, so a target row sums to 2.
    """
    dec_layer = enc_layer if dec_layer is None else dec_layer
    enc = select_attention(trace, "enc_self", enc_layer, heads, **select_kw)
    dself = select_attention(trace, "dec_self", dec_layer, heads, **select_kw)
    cross = select_attention(trace, "cross", dec_layer, heads, **select_kw)
    if enc.values.shape[0] != dself.values.shape[0]:
        # stacks with their own head counts (ModelConfig enc_heads/dec_heads): "all heads" differs per block
        raise ValueError(f"the source+target view needs the same heads in both stacks, but {enc.values.shape[0]} "
                         f"encoder and {dself.values.shape[0]} decoder heads are selected; choose heads both stacks "
                         f"have (0..{min(enc.n_heads_total, dself.n_heads_total) - 1}) or a single-stack view")
    s, t = len(enc.queries), len(dself.queries)
    h = enc.values.shape[0]
    values = np.zeros((h, s + t, s + t), dtype=np.float32)
    values[:, :s, :s], values[:, s:, :s], values[:, s:, s:] = enc.values, cross.values, dself.values
    masked = np.ones((s + t, s + t), dtype=bool)
    masked[:s, :s], masked[s:, :s], masked[s:, s:] = enc.masked, cross.masked, dself.masked
    tokens = enc.queries + dself.queries
    att = Attention("combined", dec_layer, enc.heads, values, tokens, tokens, masked,  # type: ignore[arg-type]
                    n_heads_total=enc.n_heads_total)
    return to_words(att, scheme) if words else att


def _heads(heads: Heads, n_heads: int) -> tuple[int, ...]:
    if heads is None:
        return tuple(range(n_heads))
    chosen = (heads,) if isinstance(heads, (int, np.integer)) else tuple(int(h) for h in heads)
    if not chosen:
        raise ValueError("heads is empty: pick at least one head, or None for all")
    bad = [h for h in chosen if not 0 <= h < n_heads]
    if bad:
        raise IndexError(f"heads {bad} out of range: this block has {n_heads} heads")
    return chosen


def _fit(tokens: list[str], length: int, side: str, real: int) -> list[str]:
    """Token strings may cover only the real tokens; padded positions are then named <pad>."""
    if len(tokens) < real:
        raise ValueError(f"{len(tokens)} {side} token strings for a sentence of {real} real positions")
    return (tokens + ["<pad>"] * length)[:length]

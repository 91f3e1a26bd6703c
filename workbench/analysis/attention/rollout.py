"""Attention rollout and attention flow (Abnar & Zuidema 2020), and rollout through the decoder
including cross-attention: how much each input token feeds each position after several layers.

    R = encoder_rollout(trace)                 # (B, S, S): row i = share of each source token in position i
    F = attention_flow(trace.stack("enc.*.self_attn.hook_probs")[:, 0].mean(1))   # one sentence, (S, S)
    dec = decoder_rollout(trace)               # .source (B, T, S), .target (B, T, T)

Residual connections are modelled as Abnar & Zuidema do: each layer's mixing matrix is
`residual · I + (1 - residual) · A` (A = the heads' attention, averaged by default), so a row is still a
distribution and rollout is the product of the layers' matrices, last layer on the left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from ...core.heads import hook_name
from ...core.trace import Trace

HeadReduce = Literal["mean", "max", "min"]


def _reduce_heads(a: torch.Tensor, how: HeadReduce | int) -> torch.Tensor:
    """(..., H, Lq, Lk) -> (..., Lq, Lk): mean/max/min over heads, or one head by index."""
    if isinstance(how, int):
        return a[..., how, :, :]
    if how == "mean":
        return a.mean(-3)
    if how == "max":
        return a.amax(-3)
    if how == "min":
        return a.amin(-3)
    raise ValueError(f"head_reduce must be 'mean', 'max', 'min' or a head index, got {how!r}")


def _mix(a: torch.Tensor, residual: float) -> torch.Tensor:
    """residual·I + (1 - residual)·A, rows renormalised (a max/min over heads is not a distribution)."""
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must lie in [0, 1], got {residual}")
    eye = torch.eye(a.size(-2), a.size(-1), dtype=a.dtype, device=a.device)
    m = residual * eye + (1.0 - residual) * a
    return m / m.sum(-1, keepdim=True).clamp(min=1e-12)


def attention_rollout(layers: torch.Tensor, *, residual: float = 0.5, head_reduce: HeadReduce | int = "mean",
                      heads_dim: bool = True) -> torch.Tensor:
    """Rollout of stacked self-attention (L, ..., H, S, S) (or (L, ..., S, S) with heads_dim=False):
    Â_L ··· Â_1, shape (..., S, S). Row i: how much of position i at the top comes from input token j."""
    if layers.dim() < 3 or layers.size(-1) != layers.size(-2):
        raise ValueError(f"need stacked square attention (L, ..., S, S), got shape {tuple(layers.shape)}")
    a = layers.to(torch.float64)
    if heads_dim:
        a = _reduce_heads(a, head_reduce)
    out = _mix(a[0], residual)
    for layer in a[1:]:
        out = _mix(layer, residual) @ out
    return out


def encoder_rollout(trace: Trace, *, residual: float = 0.5, head_reduce: HeadReduce | int = "mean",
                    upto: int | None = None) -> torch.Tensor:
    """Rollout through the encoder's self-attention (B, S, S), optionally only its first `upto` layers."""
    layers = trace.stack(hook_name("enc_self", "*"))
    if upto is not None:
        if not 1 <= upto <= layers.size(0):
            raise ValueError(f"upto ({upto}) must be in [1, {layers.size(0)}]")
        layers = layers[:upto]
    return attention_rollout(layers, residual=residual, head_reduce=head_reduce)


@dataclass(frozen=True)
class DecoderRollout:
    """Where each decoder position's state comes from, per input token: rows of [target | source] sum to 1.

    `target` (B, T, T): share from each decoder input token (the prefix); `source` (B, T, S): share from
    each source token, through cross-attention and the encoder's own mixing.
    """

    target: torch.Tensor
    source: torch.Tensor

    @property
    def source_share(self) -> torch.Tensor:
        """(B, T): how much of each position comes from the source at all."""
        return self.source.sum(-1)


def decoder_rollout(trace: Trace, *, residual: float = 0.5, head_reduce: HeadReduce | int = "mean",
                    through_encoder: bool = True) -> DecoderRollout:
    """Rollout through the decoder, self- and cross-attention both (Chefer et al. 2021's encoder-decoder
    relevance rules with attention in place of gradient-weighted attention).

    Per decoder layer: self-attention mixes the prefix, R ← Â_self R; cross-attention keeps `residual`
    of each position and takes the rest from the memory: R_src ← residual·R_src + (1 - residual)·A_cross·R_enc,
    R_tgt ← residual·R_tgt, where R_enc is the encoder rollout (identity if not `through_encoder`).
    Caveat: with a fixed `residual` r, the total source share is 1 - r^L whatever the attention; what the
    rollout tells is how that share (and the prefix's) is spread over tokens.
    """
    self_layers = trace.stack(hook_name("dec_self", "*")).to(torch.float64)
    cross_layers = trace.stack(hook_name("cross", "*")).to(torch.float64)
    if self_layers.size(0) != cross_layers.size(0):
        raise ValueError(f"{self_layers.size(0)} self-attention but {cross_layers.size(0)} cross-attention layers")
    b, _, t, s = cross_layers.shape[1:]
    if through_encoder:
        enc = encoder_rollout(trace, residual=residual, head_reduce=head_reduce)
    else:
        enc = torch.eye(s, dtype=torch.float64).expand(b, s, s)
    tgt = torch.eye(t, dtype=torch.float64).expand(b, t, t).clone()
    src = torch.zeros(b, t, s, dtype=torch.float64)
    for a_self, a_cross in zip(self_layers, cross_layers):
        m = _mix(_reduce_heads(a_self, head_reduce), residual)
        tgt, src = m @ tgt, m @ src
        c = _reduce_heads(a_cross, head_reduce)
        c = c / c.sum(-1, keepdim=True).clamp(min=1e-12)
        src = residual * src + (1.0 - residual) * (c @ enc)
        tgt = residual * tgt
    return DecoderRollout(tgt, src)


# ---------------------------------------------------------------------------- attention flow


def attention_flow(layers: torch.Tensor | np.ndarray, *, residual: float = 0.5,
                   outputs: list[int] | None = None) -> np.ndarray:
    """Attention flow (Abnar & Zuidema 2020) for ONE sentence: (L, S, S) head-averaged attention ->
    (S, S) where [i, j] is the maximum flow from input token j to top-layer position i in the layered
    graph whose edge (l-1, j) -> (l, i) has capacity Â_l[i, j].

    Exact max-flow (Dinic's algorithm) per pair: S² flows, so meant for sentences, not corpora (measured in
    docs/analysis.md); `outputs` limits the top positions computed (other rows are NaN).
    """
    a = torch.as_tensor(layers).to(torch.float64)
    if a.dim() != 3 or a.size(1) != a.size(2):
        raise ValueError(f"attention_flow needs one sentence's (L, S, S) attention, got {tuple(a.shape)}")
    mixed = _mix(a, residual).numpy()
    n_layers, n = mixed.shape[0], mixed.shape[1]
    cap = np.zeros(((n_layers + 1) * n, (n_layers + 1) * n))  # node l·S + p: position p after layer l
    for lay in range(n_layers):
        cap[lay * n : (lay + 1) * n, (lay + 1) * n : (lay + 2) * n] = mixed[lay].T  # [(l, j), (l+1, i)] = Â[i, j]
    out = np.full((n, n), np.nan)
    for i in range(n) if outputs is None else outputs:
        for j in range(n):
            out[i, j] = _max_flow(cap, j, n_layers * n + i)
    return out


_EPS = 1e-12


def _max_flow(cap: np.ndarray, source: int, sink: int) -> float:
    """Dinic's algorithm on a dense capacity matrix: BFS levels, then blocking flows along them."""
    r = cap.copy()  # residual capacities
    n = r.shape[0]
    total = 0.0
    while True:
        level = np.full(n, -1)
        level[source] = 0
        frontier = np.array([source])
        while frontier.size and level[sink] < 0:
            nxt = np.nonzero((r[frontier] > _EPS).any(0) & (level < 0))[0]
            level[nxt] = level[frontier[0]] + 1
            frontier = nxt
        if level[sink] < 0:
            return total
        adj = [np.nonzero((r[u] > _EPS) & (level == level[u] + 1))[0].tolist() for u in range(n)]
        ptr = [0] * n
        while (f := _push(r, adj, ptr, source, sink, np.inf)) > 0:
            total += f


def _push(r: np.ndarray, adj: list[list[int]], ptr: list[int], u: int, sink: int, f: float) -> float:
    """One augmenting path along the level graph from u (depth-first, advancing dead-end pointers)."""
    if u == sink:
        return f
    while ptr[u] < len(adj[u]):
        v = adj[u][ptr[u]]
        if r[u, v] > _EPS:
            d = _push(r, adj, ptr, v, sink, min(f, r[u, v]))
            if d > 0:
                r[u, v] -= d
                r[v, u] += d
                return d
        ptr[u] += 1
    return 0.0

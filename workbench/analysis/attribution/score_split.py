"""Why a cross-attention head attends where it does: each pre-softmax score split into
(component of the decoder stream) · W_QK · (component of the encoder memory) terms.

    split = split_cross_scores(model, src, tgt, layer=0)      # one sentence, every head of the layer
    split.terms[h]                          # (A, K, T, S): query component a x key component k
    split.total()                           # == hook_scores (tested to 1e-4)
    pairs = margin_by_group(split, head=0)  # which kinds of pairs make the argmax beat the runner-up

The cross-attention block of decoder layer l reads the decoder stream x_i (post-norm: the output of the
self-attention norm; pre-norm: the stream, through the block's input norm) and the memory m_j (the encoder
output after its final norm). Both are sums of components (`decompose.stream_components`: token and
position embeddings, each earlier head's output, each FFN, norm shifts), every norm on the way frozen at
the scale the clean run had, so the sums are exact. Then
    s_ij = ((W_Q x_i + b_Q) · (W_K m_j + b_K)) / √d_h
         = Σ_a Σ_k (W_Q x_a,i) · (W_K m_k,j) / √d_h  +  b_Q · k_j / √d_h  +  (W_Q x_i) · b_K / √d_h,
the last two ("query bias" and "key bias") kept apart. Masked (padded) keys hold the mask value in
`hook_scores` and are skipped by the comparisons here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ...core.hooks import path_of
from ...core.model import evaluating
from .decompose import _capture_names, frozen_norm, stream_components

GROUPS = ("token", "position", "self-attn heads", "cross-attn heads", "ffn", "biases")


@dataclass
class ScoreSplit:
    """Cross-attention scores of one sentence at one decoder layer, split into component pairs."""

    layer: int
    query_labels: list[str]
    query_info: list[dict[str, Any]]
    key_labels: list[str]
    key_info: list[dict[str, Any]]
    terms: torch.Tensor  # (H, A, K, T, S) float64
    query_bias: torch.Tensor  # (H, T, S): b_Q · k_j / √d_h
    key_bias: torch.Tensor  # (H, T, S): (W_Q x_i) · b_K / √d_h
    scores: torch.Tensor  # (H, T, S): the model's hook_scores
    key_mask: torch.Tensor  # (S,) True where the key is a real token

    def total(self) -> torch.Tensor:
        """(H, T, S): the sum of every term; equals `scores` on real keys."""
        return self.terms.sum((1, 2)) + self.query_bias + self.key_bias


def group_of(info: dict[str, Any], label: str) -> str:
    """The kind of a component, for summaries: token, position, self-attn heads, cross-attn heads, ffn, biases."""
    kind = info["kind"]
    if kind == "embed":
        return "token" if label.endswith("_tok") else "position"
    if kind in ("enc_self", "dec_self"):
        return "self-attn heads"
    if kind == "cross":
        return "cross-attn heads"
    if kind == "ffn":
        return "ffn"
    return "biases"


def split_hooks(model, layer: int) -> list[str]:
    names = _capture_names(model, "dec", layer + 1) + _capture_names(model, "enc", len(model.enc))
    sub = model.dec[layer].sublayer("cross_attn")
    names.append(sub.block.hook_scores.name)
    if not sub.norm_on_stream:
        names.append(sub.norm.hook_scale.name)
    return list(dict.fromkeys(names))


def block_input(model, trace, stack: str, layer: int, name: str
                ) -> tuple[list[str], list[dict[str, Any]], torch.Tensor]:
    """What block `name` ("self_attn", "cross_attn", "ffn") of layer `layer` of `stack` reads, as components
    (labels, info, parts (N, B, L, D)), every norm frozen, from a trace holding `_capture_names(model, stack,
    layer + 1)` (and, pre-norm, the block's input norm scale): post-norm the stream before it, pre-norm its input
    norm's output (the norm's bias one more part)."""
    sub = model.stream(stack).layers[layer].sublayer(name)
    labels, info, parts = stream_components(model, trace, stack, layer + 1, before=path_of(sub.block))
    if not sub.norm_on_stream:  # pre-norm: the block reads its input norm of the stream
        norm = sub.norm
        scale = trace[norm.hook_scale.name]
        parts = torch.cat([frozen_norm(parts, norm, scale), norm.bias.detach().double().expand_as(parts[:1])])
        labels = [*labels, f"{path_of(norm)}.bias"]
        info = [*info, {"stack": stack, "kind": "norm_bias", "layer": layer, "head_index": None}]
    return labels, info, parts


def cross_inputs(model, trace, layer: int) -> tuple[tuple[list[str], list[dict[str, Any]], torch.Tensor], ...]:
    """What cross-attention block `layer` reads, as components, from a trace holding `split_hooks(model, layer)`:
    ((query labels, info, parts (A, B, T, D)), (key labels, info, parts (K, B, S, D))), every norm frozen; the
    query parts sum to the block's input (pre-norm: its input norm's output), the key parts to the memory."""
    return block_input(model, trace, "dec", layer, "cross_attn"), stream_components(model, trace, "enc", len(model.enc))


@torch.no_grad()
def split_cross_scores(model, src: torch.Tensor, tgt: torch.Tensor, layer: int, *, trace=None) -> ScoreSplit:
    """The split for one sentence (src (1, S), tgt = decoder input (1, T)) at decoder `layer`, all heads."""
    if src.dim() != 2 or tgt.dim() != 2 or src.size(0) != 1 or tgt.size(0) != 1:
        raise ValueError(f"one sentence: src (1, S) and tgt (1, T), got {tuple(src.shape)} and {tuple(tgt.shape)}")
    if not 0 <= layer < len(model.dec):
        raise ValueError(f"layer {layer} out of range: the decoder has {len(model.dec)} layers")
    if trace is None:
        with evaluating(model):
            _, trace = model.run_with_cache(src.to(model.device), tgt.to(model.device), names=split_hooks(model, layer))
    attn = model.dec[layer].cross_attn
    (q_labels, q_info, q_parts), (k_labels, k_info, k_parts) = cross_inputs(model, trace, layer)
    h, dh = attn.n_heads, attn.d_head
    w_q = attn.q_proj.weight.detach().double().view(h, dh, -1)  # (H, Dh, D)
    w_k = attn.k_proj.weight.detach().double().view(h, dh, -1)
    q = torch.einsum("abtd,hed->hate", q_parts[:, :1].to(w_q.device), w_q)  # (H, A, T, Dh), b = 1
    k = torch.einsum("kbsd,hed->hkse", k_parts[:, :1].to(w_k.device), w_k)  # (H, K, S, Dh)
    scale = 1.0 / math.sqrt(dh)
    terms = torch.einsum("hate,hkse->hakts", q, k) * scale  # (H, A, K, T, S)
    b_q = torch.zeros(h, dh, dtype=torch.float64, device=q.device) if attn.q_proj.bias is None else \
        attn.q_proj.bias.detach().double().view(h, dh)
    b_k = torch.zeros(h, dh, dtype=torch.float64, device=q.device) if attn.k_proj.bias is None else \
        attn.k_proj.bias.detach().double().view(h, dh)
    k_full = k.sum(1) + b_k[:, None]  # (H, S, Dh): the real keys
    query_bias = torch.einsum("he,hse->hs", b_q, k_full)[:, None, :].expand(h, q.size(2), -1) * scale
    key_bias = torch.einsum("hte,he->ht", q.sum(1), b_k)[:, :, None].expand(-1, -1, k.size(2)) * scale
    scores = trace[attn.hook_scores.name][0].double().to(q.device)
    key_mask = (src[0] != model.cfg.pad_id).to(q.device)
    return ScoreSplit(layer, q_labels, q_info, k_labels, k_info, terms, query_bias.contiguous(),
                      key_bias.contiguous(), scores, key_mask)


def margin_by_group(split: ScoreSplit, head: int, *, rows=None, exclude_last_key: bool = True
                    ) -> dict[tuple[str, str], float]:
    """For each query row, the head's top key j1 against the runner-up j2: how much each (query group, key
    group) pair adds to s_ij1 - s_ij2, summed over the rows; the biases appear as ("query bias", "-") and
    ("-", "key bias"). `exclude_last_key` leaves the source EOS out of the contest."""
    s = split.scores[head]
    valid = split.key_mask.clone()
    if exclude_last_key:
        valid[int(valid.nonzero().max())] = False
    if int(valid.sum()) < 2:
        return {}
    masked = s.masked_fill(~valid, float("-inf"))
    top = masked.topk(2, dim=-1).indices  # (T, 2)
    rows = torch.arange(s.size(0)) if rows is None else torch.as_tensor(list(rows))
    q_groups = [group_of(i, lab) for i, lab in zip(split.query_info, split.query_labels)]
    k_groups = [group_of(i, lab) for i, lab in zip(split.key_info, split.key_labels)]
    qn, kn = sorted(set(q_groups), key=GROUPS.index), sorted(set(k_groups), key=GROUPS.index)
    gq = torch.zeros(len(q_groups), len(qn), dtype=torch.float64)
    gq[torch.arange(len(q_groups)), [qn.index(g) for g in q_groups]] = 1.0
    gk = torch.zeros(len(k_groups), len(kn), dtype=torch.float64)
    gk[torch.arange(len(k_groups)), [kn.index(g) for g in k_groups]] = 1.0
    j1, j2 = top[rows, 0], top[rows, 1]
    t = split.terms[head][:, :, rows]  # (A, K, R, S)
    pick = torch.arange(len(rows))
    diff = (t[:, :, pick, j1] - t[:, :, pick, j2]).sum(-1).cpu()  # (A, K), summed over rows
    grouped = gq.T @ diff @ gk
    out = {(a, b): float(grouped[x, y]) for x, a in enumerate(qn) for y, b in enumerate(kn)}
    out[("query bias", "-")] = float((split.query_bias[head, rows, j1] - split.query_bias[head, rows, j2]).sum())
    out[("-", "key bias")] = float((split.key_bias[head, rows, j1] - split.key_bias[head, rows, j2]).sum())
    return out

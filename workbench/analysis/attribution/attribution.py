"""Gradient attribution next to attention, for the same decoding step (Inseq's saliency and
input×gradient, Simonyan et al. 2014; Shrikumar et al. 2016), and how well the two agree.

    attr = token_attribution(model, src, tgt_in, targets)     # one sentence: src (1, S), tgt_in/targets (1, T)
    attr.source_saliency[t]          # (S,) ‖∂ log p(y_t) / ∂ e_s‖ for the token predicted at step t
    attr.source_input_x_gradient[t]  # (S,) e_s · ∂ log p(y_t) / ∂ e_s (signed)
    rho = step_agreement(attr.source_saliency, cross_attention_row_matrix)   # (T,) Spearman per step

Gradients are taken with respect to the scaled token embeddings (`hook_src_tok`, `hook_tgt_tok`),
before positions are added, as Inseq does for encoder-decoder models. Integrated gradients (Captum) is
not included: input×gradient is its one-step special case with a zero baseline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ...core.model import evaluating


def gradient_attribution(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Saliency ‖∂f/∂x_i‖ and input×gradient x_i·∂f/∂x_i over the last axis of x (…, L, D) for a scalar f."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        y = f(x)
        if y.numel() != 1:
            raise ValueError(f"f must return a scalar, got shape {tuple(y.shape)}")
        (grad,) = torch.autograd.grad(y, x)
    return grad.norm(dim=-1), (x.detach() * grad).sum(-1)


@dataclass(frozen=True)
class Attribution:
    """Per target step t (rows), attribution of log p(y_t) to each source and target-prefix token."""

    source_saliency: np.ndarray  # (T, S)
    source_input_x_gradient: np.ndarray  # (T, S)
    target_saliency: np.ndarray  # (T, T): zero above the diagonal (causal)
    target_input_x_gradient: np.ndarray  # (T, T)
    log_probs: np.ndarray  # (T,) log p(y_t)


def token_attribution(model, src: torch.Tensor, tgt: torch.Tensor, targets: torch.Tensor) -> Attribution:
    """Attribution for one sentence: `src` (1, S), decoder input `tgt` (1, T), `targets` (1, T) the tokens
    whose log-probability is explained at each step (the reference or the model's own output)."""
    if src.dim() != 2 or src.size(0) != 1 or tgt.shape != targets.shape or tgt.size(0) != 1:
        raise ValueError(f"need src (1, S), tgt and targets (1, T); got {tuple(src.shape)}, {tuple(tgt.shape)}, "
                         f"{tuple(targets.shape)}")
    leaves: dict[str, torch.Tensor] = {}

    def make_leaf(x: torch.Tensor, hook) -> torch.Tensor:
        leaf = x.detach().requires_grad_(True)
        leaves[hook.name] = leaf
        return leaf

    with evaluating(model):
        src_tok, tgt_tok = model.hook_src_tok.name, model.hook_tgt_tok.name
        with torch.enable_grad(), model.hooks({src_tok: make_leaf, tgt_tok: make_leaf}):
            logp = model(src, tgt).float().log_softmax(-1)[0]  # (T, V)
            chosen = logp.gather(-1, targets[0, :, None].to(logp.device))[:, 0]  # (T,)
            e_src, e_tgt = leaves[src_tok], leaves[tgt_tok]
            rows = {"ss": [], "sx": [], "ts": [], "tx": []}
            for t in range(chosen.size(0)):
                g_src, g_tgt = torch.autograd.grad(chosen[t], (e_src, e_tgt), retain_graph=t < chosen.size(0) - 1)
                rows["ss"].append(g_src[0].norm(dim=-1))
                rows["sx"].append((e_src[0].detach() * g_src[0]).sum(-1))
                rows["ts"].append(g_tgt[0].norm(dim=-1))
                rows["tx"].append((e_tgt[0].detach() * g_tgt[0]).sum(-1))
    arr = {k: torch.stack(v).double().cpu().numpy() for k, v in rows.items()}
    return Attribution(arr["ss"], arr["sx"], arr["ts"], arr["tx"], chosen.detach().double().cpu().numpy())


def rank(x: np.ndarray) -> np.ndarray:
    """Ranks along the last axis, ties sharing their mean rank (scipy's rankdata 'average')."""
    x = np.asarray(x, dtype=np.float64)
    flat = x.reshape(-1, x.shape[-1])
    out = np.empty_like(flat)
    for row, r in zip(flat, out):
        values, inverse = np.unique(row, return_inverse=True)  # sorted distinct values
        first = np.searchsorted(np.sort(row), values)  # rank of each value's first occurrence
        counts = np.bincount(inverse)
        r[:] = (first + (counts - 1) / 2.0)[inverse]
    return out.reshape(x.shape)


def spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman rank correlation of a and b along the last axis (NaN where one side is constant)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    ra, rb = rank(a), rank(b)
    ra = ra - ra.mean(-1, keepdims=True)
    rb = rb - rb.mean(-1, keepdims=True)
    den = np.sqrt((ra**2).sum(-1) * (rb**2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(-1) / np.where(den > 0, den, 1), np.nan)


def step_agreement(attribution: np.ndarray, attention: np.ndarray) -> np.ndarray:
    """(T,) Spearman correlation per step between an attribution (T, S) and attention (T, S)
    (e.g. one cross-attention head, or the heads' mean); saliency is unsigned, so compare it with |·|."""
    return spearman(attribution, attention)

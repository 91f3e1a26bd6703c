"""More source attributions for each output token, beside attention, saliency and input x gradient:
integrated gradients, occlusion and memory patching; and how all of them agree over a test set.

    ig = integrated_gradients(model, src, tgt, targets, steps=32)    # (T, S) per output step, per source token
    occ = occlusion(model, src, tgt, targets)                        # (T, S) drop in log p with token s occluded
    mem = memory_patching(model, src, tgt, targets, mean_memory)     # (T, S) drop with memory row s mean-ablated
    table = attribution_agreement(model, pairs)                      # mean per-step Spearman, method x method

Integrated gradients (Sundararajan et al. 2017) integrates the gradient of log p(y_t) along the straight line
from a baseline to the scaled source token embeddings (`hook_src_tok`; positions kept, as Inseq does), by the
midpoint rule; its rows sum to log p(y_t | x) - log p(y_t | baseline) up to the discretisation error (tested).
Occlusion (Zeiler & Fergus 2014) replaces one source token's embedding by the baseline (zero: the padding
embedding) and reads the drop in log p(y_t); memory patching mean-ablates one row of the encoder output,
what cross-attention reads. Both run every source position as one row of one batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .attribution import spearman, token_attribution

METHODS = ("attention", "saliency", "input_x_gradient", "integrated_gradients", "occlusion", "memory_patching")


def _check(src, tgt, targets):
    if src.dim() != 2 or src.size(0) != 1 or tgt.shape != targets.shape or tgt.dim() != 2 or tgt.size(0) != 1:
        raise ValueError(f"need src (1, S), tgt and targets (1, T); got {tuple(src.shape)}, {tuple(tgt.shape)}, "
                         f"{tuple(targets.shape)}")


def _target_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(N, T) log p(targets[t]) per row."""
    lp = logits.float().log_softmax(-1)
    return lp.gather(-1, targets.to(lp.device).expand(lp.size(0), -1)[..., None])[..., 0]


def integrated_gradients(model, src: torch.Tensor, tgt: torch.Tensor, targets: torch.Tensor, *, steps: int = 32
                         ) -> torch.Tensor:
    """(T, S): integrated gradients of log p(y_t) w.r.t. each source token embedding (summed over d_model),
    zero baseline, `steps` midpoints in one batch."""
    _check(src, tgt, targets)
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    alphas = (torch.arange(steps, dtype=torch.float32, device=model.device) + 0.5) / steps
    leaf: dict[str, torch.Tensor] = {}

    def scale(x: torch.Tensor, hook) -> torch.Tensor:
        leaf["x"] = x.detach()
        scaled = (alphas.to(x.dtype)[:, None, None] * x.detach()).requires_grad_(True)
        leaf["scaled"] = scaled
        return scaled

    was = model.training
    model.eval()
    try:
        with torch.enable_grad(), model.hooks({"hook_src_tok": scale}):
            lp = _target_log_probs(model(src.expand(steps, -1), tgt.expand(steps, -1)), targets)  # (steps, T)
            rows = []
            for t in range(lp.size(1)):
                (g,) = torch.autograd.grad(lp[:, t].sum(), leaf["scaled"], retain_graph=t < lp.size(1) - 1)
                rows.append((g.mean(0) * leaf["x"][0]).sum(-1))  # (S,)
    finally:
        model.train(was)
    return torch.stack(rows).double().cpu()


@torch.no_grad()
def occlusion(model, src: torch.Tensor, tgt: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(T, S): log p(y_t) minus log p(y_t) with source token s's embedding zeroed (its position kept)."""
    _check(src, tgt, targets)
    n = src.size(1)
    eye = torch.eye(n, dtype=torch.bool, device=model.device)

    def occlude(x: torch.Tensor, hook) -> torch.Tensor:
        return x.masked_fill(eye[:, :, None], 0.0) if x.size(0) == n else x

    clean = _target_log_probs(model(src, tgt), targets)[0]
    with model.hooks({"hook_src_tok": occlude}):
        occluded = _target_log_probs(model(src.expand(n, -1), tgt.expand(n, -1)), targets)  # (S, T)
    return (clean[None] - occluded).t().double().cpu()


@torch.no_grad()
def memory_patching(model, src: torch.Tensor, tgt: torch.Tensor, targets: torch.Tensor,
                    mean_memory: torch.Tensor) -> torch.Tensor:
    """(T, S): log p(y_t) minus log p(y_t) with encoder output row s replaced by `mean_memory` (D,)."""
    _check(src, tgt, targets)
    n = src.size(1)
    if mean_memory.shape != (model.cfg.d_model,):
        raise ValueError(f"mean_memory must be ({model.cfg.d_model},), got {tuple(mean_memory.shape)}")
    eye = torch.eye(n, dtype=torch.bool, device=model.device)[:, :, None]

    def put(x: torch.Tensor, hook) -> torch.Tensor:
        return torch.where(eye, mean_memory.to(x.device, x.dtype), x) if x.size(0) == n else x

    clean = _target_log_probs(model(src, tgt), targets)[0]
    with model.hooks({"hook_memory": put}):
        patched = _target_log_probs(model(src.expand(n, -1), tgt.expand(n, -1)), targets)
    return (clean[None] - patched).t().double().cpu()


@torch.no_grad()
def mean_memory(model, sources: Sequence[torch.Tensor]) -> torch.Tensor:
    """(D,) the encoder output averaged over every real position of `sources` (each (1, S))."""
    total, count = None, 0
    for src in sources:
        m = model.encode(src.to(model.device)).memory[0]
        total = m.sum(0) if total is None else total + m.sum(0)
        count += m.size(0)
    if total is None:
        raise ValueError("mean_memory needs at least one source")
    return total / count


def attribution_matrices(model, src, tgt, targets, *, memory_mean: torch.Tensor, steps: int = 32
                         ) -> dict[str, np.ndarray]:
    """Every method's (T, S) matrix for one sentence (attention: cross-attention averaged over layers and heads;
    signed methods as magnitudes, since attention and saliency are unsigned)."""
    _, trace = model.run_with_cache(src, tgt, names="dec.*.cross_attn.hook_probs")
    attn = trace.stack("dec.*.cross_attn.hook_probs")[:, 0].mean((0, 1))  # (T, S)
    grad = token_attribution(model, src, tgt, targets)
    return {
        "attention": attn.double().cpu().numpy(),
        "saliency": grad.source_saliency,
        "input_x_gradient": np.abs(grad.source_input_x_gradient),
        "integrated_gradients": integrated_gradients(model, src, tgt, targets, steps=steps).abs().numpy(),
        "occlusion": occlusion(model, src, tgt, targets).abs().numpy(),
        "memory_patching": memory_patching(model, src, tgt, targets, memory_mean).abs().numpy(),
    }


def attribution_agreement(model, sentences: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], *,
                          steps: int = 32):
    """Mean per-step Spearman correlation between every two methods over `sentences` ((src, tgt, targets),
    each (1, L)); a DataFrame method x method (attrs: sentences, steps)."""
    import pandas as pd  # optional: only the table needs it

    if not sentences:
        raise ValueError("attribution_agreement needs at least one sentence")
    mem = mean_memory(model, [s for s, _, _ in sentences])
    sums = np.zeros((len(METHODS), len(METHODS)))
    counts = np.zeros_like(sums)
    n_steps = 0
    for src, tgt, targets in sentences:
        mats = attribution_matrices(model, src, tgt, targets, memory_mean=mem, steps=steps)
        n_steps += mats["attention"].shape[0]
        for i, a in enumerate(METHODS):
            for j, b in enumerate(METHODS):
                rho = spearman(mats[a], mats[b])
                ok = ~np.isnan(rho)
                sums[i, j] += rho[ok].sum()
                counts[i, j] += ok.sum()
    table = pd.DataFrame(sums / np.maximum(counts, 1), index=list(METHODS), columns=list(METHODS))
    table.attrs.update(sentences=len(sentences), steps=n_steps)
    return table

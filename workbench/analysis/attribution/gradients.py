"""Gradients at hook points: a forward trace and a trace of d(metric)/d(activation), from one backward pass
(TransformerLens's `run_with_cache(incl_bwd=True)`).

    value, acts, grads = run_with_grads(model, src, tgt, lambda logits: logits[0, 3, tok], names="*.hook_result")
    grads["dec.1.cross_attn.hook_result"]     # (B, H, T, D), same shape as acts[...]

Each listened activation gets a zero tensor added that requires grad; its gradient is the activation's, the
forward values are unchanged, the graph upstream is not cut (gradients at several points of one path are all
correct), and the model's own parameters need not require grad.
"""

from __future__ import annotations

import torch

from ...core.hooks import HookPoint, NameFilter
from ...core.model import evaluating
from ...core.protocols import Metric
from ...core.trace import Trace


def run_with_grads(model, src: torch.Tensor, tgt: torch.Tensor, metric: Metric,
                   names: NameFilter = "*.hook_probs") -> tuple[torch.Tensor, Trace, Trace]:
    """metric(logits) must return a scalar. Returns its value, the activations and their gradients (both
    detached), for the hook points `names` selects. Run in eval mode; the model's mode is restored."""
    chosen = model.hook_names(names)
    zeros: dict[str, torch.Tensor] = {}
    acts: dict[str, torch.Tensor] = {}

    def tap(x: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        if hook.name in zeros:
            raise ValueError(f"{hook.name} ran twice in one forward; gradients need one call per hook point")
        zero = torch.zeros_like(x, requires_grad=True)
        zeros[hook.name] = zero
        acts[hook.name] = x.detach()
        return x + zero

    with evaluating(model):
        with torch.enable_grad(), model.hooks([(n, tap) for n in chosen]):
            value = metric(model(src, tgt))
            if not isinstance(value, torch.Tensor) or value.numel() != 1:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(f"metric must return a scalar tensor, got {shape}")
            order = list(zeros)
            grads = torch.autograd.grad(value.reshape(()), [zeros[n] for n in order], allow_unused=True)
    grad_map = {n: torch.zeros_like(zeros[n]) if g is None else g.detach() for n, g in zip(order, grads)}
    return value.detach(), Trace(acts, src=src, tgt=tgt), Trace(grad_map, src=src, tgt=tgt)

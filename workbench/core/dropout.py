"""Dropout with a cheaper CPU training mask: the residual, feed-forward, embedding and attention dropouts.

`torch.bernoulli_` draws one double per element on CPU (7.3 ms for 0.5M floats on 2 cores, 14 % of a Multi30k
training step); here one 64-bit draw gives four 16-bit uniforms (1.4 ms, mask and scale included), so p is rounded
to a multiple of 1/65536. Same RNG (torch's generator, so seeds and the trainer's RNG-state resume hold), same
expectation (kept values scaled by 1/(1-p')). Elsewhere (eval, CUDA, p = 0 or 1, in place, and under torch.compile,
which cannot trace `random_` and draws its own masks) it is `F.dropout`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cheap_mask_usable(x: torch.Tensor, p: float, training: bool = True, inplace: bool = False) -> bool:
    """Whether `dropout` draws its 16-bit mask for `x` (else it is `F.dropout`)."""
    return (training and x.device.type == "cpu" and 0 < round(p * 65536) < 65536 and not inplace
            and not torch.compiler.is_compiling())


def dropout(x: torch.Tensor, p: float, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """`F.dropout(x, p, training, inplace)`, with the 16-bit CPU mask where `cheap_mask_usable`."""
    if not cheap_mask_usable(x, p, training, inplace):
        return F.dropout(x, p, training, inplace)
    threshold = round(p * 65536)
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
    keep = bits.view(torch.int16)[:n].view(x.shape) >= threshold - 32768
    return _Masked.apply(x, keep, 65536 / (65536 - threshold))


class _Masked(torch.autograd.Function):
    """x where `keep`, else 0, times `scale`; its gradient the same of the incoming one. `where` and not `x * keep`:
    multiplying by a bool mask first copies it to floats, forward and backward (3.6x the time at (64, 30, 256));
    scaled in place, so each direction writes one tensor. The values and gradients of `x * keep * scale`, bit for
    bit."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:  # noqa: D102
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.where(keep, x, 0.0).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: D102
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad, 0.0).mul_(ctx.scale), None, None

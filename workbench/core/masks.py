"""Attention masks, one convention throughout (SDPA's): True = this query may attend to this key.

Masks are built once per batch by the model and passed down; `None` means "nothing to mask",
which keeps the fused kernels on their fastest path.

Targets are right-padded, so decoder self-attention needs only the causal mask: every padded
key lies in every real query's future. That keeps SDPA on its `is_causal` (flash) path and lets
a model use the padding id as its decoder start token (Marian does).
"""

from __future__ import annotations

import torch


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor | None:
    """(B, 1, 1, L) bool, True on real tokens; None when a CPU batch has no padding.

    Asking "is there any padding?" reads a value back from the device, so on accelerators and
    under torch.compile the mask is always returned (no host sync, no graph break).
    """
    keep = tokens != pad_id
    if tokens.device.type == "cpu" and not torch.compiler.is_compiling() and bool(keep.all()):
        return None
    return keep[:, None, None, :]


def causal_mask(length: int, device: torch.device | str | None = None, offset: int = 0) -> torch.Tensor:
    """(L, offset + L) bool: query i (absolute position offset + i) sees keys 0..offset + i."""
    q = torch.arange(offset, offset + length, device=device)[:, None]
    k = torch.arange(offset + length, device=device)[None, :]
    return k <= q

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


def target_lengths(tgt: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B,) real positions of right-padded decoder inputs: through the last non-padding id, and never fewer than 1.

    Position 0 is the decoder start token, real even when it is the padding id (Marian starts with pad), so
    `tgt != pad_id` is not the mask of a decoder input; this is.
    """
    if tgt.dim() != 2:
        raise ValueError(f"decoder inputs must be (batch, length), got shape {tuple(tgt.shape)}")
    index = torch.arange(1, tgt.size(1) + 1, device=tgt.device)
    return ((tgt != pad_id) * index).amax(1).clamp(min=1)


def real_positions(ids: torch.Tensor, pad_id: int, *, decoder: bool) -> torch.Tensor:
    """(B, L) bool, True on real positions: sources by their ids, decoder inputs by `target_lengths`."""
    if not decoder:
        return ids != pad_id
    return torch.arange(ids.size(1), device=ids.device)[None, :] < target_lengths(ids, pad_id)[:, None]

"""Editing hooks: ablate or scale heads, patch activations from another run.

Each factory returns a hook function `fn(tensor, hook) -> tensor`; put it under a hook name in
`model.hooks({...})` (or `model.intervene`), which removes it when the block ends:

    with model.intervene({"enc.2.self_attn.hook_context": zero_heads([1, 4])}):
        ...
    with model.intervene(ablate_heads({("cross", 1): [0, 2]})):
        ...

Heads are edited at `hook_context` (per-head output before the output projection): zeroing a
head there removes exactly its contribution and keeps attention on the fused kernel.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from .heads import KINDS, Head, block_path
from .hooks import HookFn, HookPoint


def _head_list(heads: int | Iterable[int]) -> list[int]:
    return [heads] if isinstance(heads, int) else list(heads)


def scale_heads(heads: int | Iterable[int], factor: float) -> HookFn:
    """Multiply the chosen heads' slice of a (B, H, L, *) tensor by `factor`."""
    chosen = _head_list(heads)

    def hook(x: torch.Tensor, point: HookPoint) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"head edits need a (B, H, L, *) tensor; {point.name} has shape {tuple(x.shape)}")
        bad = [h for h in chosen if not -x.size(1) <= h < x.size(1)]
        if bad:
            raise IndexError(f"heads {bad} out of range at {point.name}: it has {x.size(1)} heads")
        x = x.clone()
        x[:, chosen] = x[:, chosen] * factor
        return x

    return hook


def zero_heads(heads: int | Iterable[int]) -> HookFn:
    """Ablate the chosen heads (their per-head output becomes zero)."""
    return scale_heads(heads, 0.0)


def ablate_heads(
    spec: Mapping[tuple[str, int], int | Iterable[int]] | Iterable[Head | str | tuple[str, int, int]],
    factor: float = 0.0,
) -> dict[str, HookFn]:
    """Hooks on each block's `hook_context` scaling the chosen heads (kind in enc_self/dec_self/cross).

    `spec` is {(kind, layer): heads}, or a list of heads in any spelling `Head.parse` reads
    (Head("cross", 1, 0), "cross:1:0", ("cross", 1, 0)).
    """
    if not isinstance(spec, Mapping):
        grouped: dict[tuple[str, int], list[int]] = {}
        for h in spec:
            head = Head.parse(h)
            grouped.setdefault((head.kind, head.layer), []).append(head.head)
        spec = grouped
    out: dict[str, HookFn] = {}
    for (kind, layer), heads in spec.items():
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        out[block_path(kind, layer) + ".hook_context"] = scale_heads(heads, factor)
    return out


def patch(replacement: torch.Tensor, *, positions: Iterable[int] | None = None, heads=None) -> HookFn:
    """Activation patching: replace the tensor (or some positions / heads of it) by `replacement`,
    typically the same hook's activation captured on another input."""
    pos = None if positions is None else list(positions)
    head_idx = None if heads is None else _head_list(heads)

    def hook(x: torch.Tensor, point: HookPoint) -> torch.Tensor:
        if head_idx is not None and x.dim() != 4:
            # on (B, L, D) dim 1 is positions: indexing it by "heads" would silently patch positions
            raise ValueError(f"patch(heads={head_idx}) needs a (B, H, L, *) per-head activation; {point.name} "
                             f"has shape {tuple(x.shape)} (patch positions= there, or patch a hook_q/k/v/"
                             f"probs/context point)")
        if replacement.shape != x.shape:
            raise ValueError(
                f"patch for {point.name} has shape {tuple(replacement.shape)} but the activation is "
                f"{tuple(x.shape)}; capture it from an input of the same batch size and length"
            )
        r = replacement.to(device=x.device, dtype=x.dtype)
        if pos is None and head_idx is None:
            return r
        x = x.clone()
        if head_idx is not None and pos is not None:
            # (B, H, L, *) tensors: heads on dim 1, positions on dim 2
            tmp = x[:, head_idx]
            tmp[:, :, pos] = r[:, head_idx][:, :, pos]
            x[:, head_idx] = tmp
        elif head_idx is not None:
            x[:, head_idx] = r[:, head_idx]
        else:
            dim = 2 if x.dim() == 4 else 1  # (B, H, L, *) or (B, L, *)
            index = torch.tensor(pos, device=x.device)
            x.index_copy_(dim, index, r.index_select(dim, index))
        return x

    return hook

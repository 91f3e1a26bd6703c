"""Id lists to model input: padding into one tensor, and cutting a length-sorted order into token-budget
batches. Training, the translator, validation and the analyses all batch here (model side: no corpus reading)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_sequences(rows: Sequence[Sequence[int]], pad_id: int, *, device: torch.device | str | None = None
                  ) -> torch.Tensor:
    """(N, longest) long tensor of id lists, right-padded with `pad_id`: the one padding helper."""
    if len(rows) == 0:
        raise ValueError("no sequences to pad")
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
    return out if device is None else out.to(device)


def token_batches(lengths: Sequence[int], max_tokens: int, order: Sequence[int] | None = None) -> list[list[int]]:
    """Cut `order` (default: 0..N-1, usually sorted by length) into consecutive batches whose padded
    size, items x longest length, stays within `max_tokens` (fairseq's --max-tokens); one item longer
    than the budget still forms its own batch. Training, the translator and validation all batch here."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens ({max_tokens}) must be positive")
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in range(len(lengths)) if order is None else order:
        n = max(longest, int(lengths[i]))
        if cur and (len(cur) + 1) * n > max_tokens:
            out.append(cur)
            cur, n = [], int(lengths[i])
        cur.append(i)
        longest = n
    if cur:
        out.append(cur)
    return out

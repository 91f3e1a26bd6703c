"""What zeroing some heads does to one sentence: the ablated model's own output, and how it scores the original.

    effect = ablation_effect(tm, src_ids, out_ids, [("cross", 1, 2), ("enc_self", 0, 0)], beam=1)
    effect.text, effect.log_prob, effect.original_log_prob, effect.delta

The hooks are entered inside this call (`model.intervene`, a ContextVar), so it is safe to run in a
worker thread while other threads use the same model unedited.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...core.heads import Head
from ...core.interventions import ablate_heads
from ...decoding.search import generate

__all__ = ["AblationEffect", "ablation_effect", "check_heads"]


@dataclass(frozen=True)
class AblationEffect:
    heads: tuple[tuple[str, int, int], ...]
    tokens: tuple[int, ...]
    """The ablated model's own output (EOS-terminated)."""
    text: str
    log_prob: float
    """Log-probability of that output under the ablated model."""
    original_log_prob: float
    """Log-probability the ablated model gives the ORIGINAL output."""
    delta: float
    """original_log_prob minus the unablated model's log-probability of the original output."""


def check_heads(cfg, heads: Iterable[Head | str | tuple[str, int, int]]) -> dict[tuple[str, int], list[int]]:
    """{(kind, layer): [heads]} for `ablate_heads`; a ValueError naming the first head the model lacks.
    Heads may be spelled any way `Head.parse` reads (Head, "cross:1:0", ("cross", 1, 0))."""
    spec: dict[tuple[str, int], list[int]] = {}
    for spelled in heads:
        head = Head.parse(spelled).check(cfg)
        spec.setdefault((head.kind, head.layer), []).append(head.head)
    return spec


def ablation_effect(tm, source_ids: Sequence[int], output_ids: Sequence[int],
                    heads: Iterable[Head | str | tuple[str, int, int]], **decode_options: Any) -> AblationEffect:
    """Decode `source_ids` with `heads` zeroed (`decode_options`: beam=, alpha=, ... as `translate`), and
    teacher-force `output_ids` (the original output, EOS-terminated) with and without the ablation."""

    parsed = [Head.parse(h) for h in heads]
    heads = tuple(sorted({(h.kind, h.layer, h.head) for h in parsed}))  # (kind, layer, head) tuples, as before
    hooks = ablate_heads(check_heads(tm.model.cfg, heads))
    clean = tm.score(source_ids, output_ids).log_prob
    src = torch.tensor([list(source_ids)], dtype=torch.long, device=tm.device)
    with tm.model.intervene(hooks), torch.no_grad():
        best = generate(tm.model, src, tm.config_with(n_best=1, **decode_options)).hypotheses[0][0]
        original = tm.score(source_ids, output_ids).log_prob
    return AblationEffect(heads, tuple(best.tokens), tm.detokenize(best.tokens), float(best.log_prob), original,
                          original - clean)

"""SAELens classes for the dictionaries SAELens 6 ships no class for: TopK transcoders, with and without a skip term.

    import sae_lens
    from workbench.features.sae_lens_classes import register
    register()                                   # once per process (a second call does nothing)
    tc = sae_lens.SAE.load_from_disk("checkpoints/multi30k-de-en/features/dec.1.ffn")

SAELens loads the workbench's TopK and ReLU SAEs and its ReLU transcoders (with or without the skip term) as they
are. A TopK transcoder is saved with architecture "topk_transcoder" or "topk_skip_transcoder"; this module adds
those two architectures through SAELens's own extension point, `sae_lens.register_sae_class`. Each is SAELens's
`Transcoder` / `SkipTranscoder` with SAELens's `TopK` activation (ReLU of the k largest pre-activations), so
encode, decode and forward are SAELens's code, not a copy of the workbench's (the tests compare the two).

Importing this module imports sae_lens (an optional dependency: `pip install sae-lens`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from sae_lens import register_sae_class
from sae_lens.registry import SAE_CLASS_REGISTRY
from sae_lens.saes.topk_sae import TopK
from sae_lens.saes.transcoder import SkipTranscoder, SkipTranscoderConfig, Transcoder, TranscoderConfig

__all__ = ["TopKSkipTranscoder", "TopKSkipTranscoderConfig", "TopKTranscoder", "TopKTranscoderConfig", "register"]


@dataclass
class TopKTranscoderConfig(TranscoderConfig):
    k: int = 100

    @classmethod
    def architecture(cls) -> str:
        return "topk_transcoder"

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "k": self.k}


@dataclass
class TopKSkipTranscoderConfig(TopKTranscoderConfig, SkipTranscoderConfig):
    @classmethod
    def architecture(cls) -> str:
        return "topk_skip_transcoder"


class TopKTranscoder(Transcoder):
    """SAELens's `Transcoder` whose activation keeps the k largest pre-activations (ReLU applied to them)."""

    def get_activation_fn(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return TopK(self.cfg.k)


class TopKSkipTranscoder(TopKTranscoder, SkipTranscoder):
    """SAELens's `SkipTranscoder` (out = f @ W_dec + b_dec + x @ W_skip.T) with the TopK activation."""


CLASSES = {"topk_transcoder": (TopKTranscoder, TopKTranscoderConfig),
           "topk_skip_transcoder": (TopKSkipTranscoder, TopKSkipTranscoderConfig)}


def register() -> None:
    """Make `sae_lens.SAE.load_from_disk` load the workbench's TopK transcoders (idempotent)."""
    for architecture, (cls, cfg_cls) in CLASSES.items():
        if architecture not in SAE_CLASS_REGISTRY:
            register_sae_class(architecture, cls, cfg_cls)

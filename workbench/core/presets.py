"""Named model configurations, as functions (nanoGPT's config files, torchtitan's config functions)."""

from __future__ import annotations

import dataclasses

from .config import ModelConfig


def tiny(vocab: int = 96, **changes) -> ModelConfig:
    """2+2 layers, d=32, 4 heads: for tests and CPU experiments."""
    cfg = ModelConfig(
        src_vocab=vocab, tgt_vocab=vocab, d_model=32, n_heads=4, d_ff=64, enc_layers=2, dec_layers=2,
        max_positions=256,
    )
    return dataclasses.replace(cfg, **changes)


def base(vocab: int = 37000, **changes) -> ModelConfig:
    """The paper's base model (Table 3): N=6, d=512, d_ff=2048, h=8, P_drop=0.1, shared vocabulary."""
    cfg = ModelConfig(src_vocab=vocab, tgt_vocab=vocab, tie_embeddings="all")
    return dataclasses.replace(cfg, **changes)


def big(vocab: int = 37000, **changes) -> ModelConfig:
    """The paper's big model (Table 3): d=1024, d_ff=4096, h=16, P_drop=0.3 (0.1 for EN-FR)."""
    cfg = dataclasses.replace(base(vocab), d_model=1024, d_ff=4096, n_heads=16, dropout=0.3)
    return dataclasses.replace(cfg, **changes)


def multi30k_small(vocab: int = 8000, **changes) -> ModelConfig:
    """A small model that trains on Multi30k on two CPU cores (3+3 layers, d=256, pre-norm)."""
    cfg = ModelConfig(
        src_vocab=vocab, tgt_vocab=vocab, d_model=256, n_heads=4, d_ff=1024, enc_layers=3, dec_layers=3,
        dropout=0.1, attn_dropout=0.1, norm_first=True, tie_embeddings="all", max_positions=256,
    )
    return dataclasses.replace(cfg, **changes)


PRESETS = {"tiny": tiny, "base": base, "big": big, "multi30k_small": multi30k_small}


def preset(name: str, **changes) -> ModelConfig:
    try:
        return PRESETS[name](**changes)
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}") from None

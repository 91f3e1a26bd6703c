"""Helpers shared by test modules (import as `from model_helpers import ...`).

A plain module, not conftest: with several conftest.py files in the tree (tests/browser/ has its
own), `from model_helpers import ...` resolves to whichever was imported first.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from workbench import Transformer

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("WORKBENCH_DATA", ROOT.parent / "shared" / "data"))


def make_model(cfg, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg).eval()


def make_batch(cfg, batch=3, src_len=7, tgt_len=6, seed=1, pad=True):
    """Random ids above the specials, EOS-terminated sources, BOS-started targets, some padding."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, cfg.src_vocab, (batch, src_len), generator=g)
    tgt = torch.randint(4, cfg.tgt_vocab, (batch, tgt_len), generator=g)
    src[:, -1] = cfg.eos_id
    tgt[:, 0] = cfg.start_id
    if pad and batch > 1:
        src[0, src_len - 3] = cfg.eos_id
        src[0, src_len - 2 :] = cfg.pad_id
        tgt[1, tgt_len - 2 :] = cfg.pad_id
    return src, tgt


def graph_model(norm_first: bool, seed: int = 2):
    """A tiny model with every norm weight/bias and projection bias random, so bias paths are not zero (the
    attribution-graph tests)."""
    from workbench import presets

    return randomize_norms_and_biases(
        make_model(presets.tiny(vocab=50, norm_first=norm_first, enc_final_norm=True, dec_final_norm=True), seed=seed))


def randomize_norms_and_biases(m: Transformer) -> Transformer:
    """Every norm weight (1 + noise) and bias, and every projection bias, random (seeded): bias paths not zero."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return m


def tiny_model_and_corpus():
    """The tiny preset's model and 60 random sentence pairs of 3-11 ids (the dictionary-training tests)."""
    from workbench import presets
    from workbench.corpus.data import ParallelData

    cfg = presets.tiny()
    model = make_model(cfg)
    g = torch.Generator().manual_seed(3)
    lens = torch.randint(3, 12, (60, 2), generator=g)
    src = [torch.randint(4, cfg.src_vocab, (int(a),), generator=g).tolist() for a, _ in lens]
    tgt = [torch.randint(4, cfg.tgt_vocab, (int(b),), generator=g).tolist() for _, b in lens]
    return model, ParallelData(src, tgt)


def one_sentence(cfg, s=8, t=6, seed=1):
    """One unpadded (1, s) source ending in EOS and (1, t) decoder input starting with the start id."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, cfg.src_vocab, (1, s), generator=g)
    tgt = torch.randint(4, cfg.tgt_vocab, (1, t), generator=g)
    src[0, -1], tgt[0, 0] = cfg.eos_id, cfg.start_id
    return src, tgt

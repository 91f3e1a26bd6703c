"""Shared fixtures: tiny seeded models, the shared data folder, markers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from workbench import Transformer, presets

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("WORKBENCH_DATA", ROOT.parent / "shared" / "data"))

# Test models are tiny: one intra-op thread is faster than two fighting over small kernels, and it
# keeps the suite's time steady on CI's 2 cores. Tests that spawn processes (DDP) set their own.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def tiny_config():
    return presets.tiny(vocab=50)


def make_model(cfg, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg).eval()


@pytest.fixture
def tiny_model(tiny_config):
    return make_model(tiny_config)


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


@pytest.fixture
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data not found at {SHARED_DATA}; set WORKBENCH_DATA")
    return SHARED_DATA

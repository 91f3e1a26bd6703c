"""Shared fixtures: tiny seeded models, the shared data folder, markers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # model_helpers for tests in subfolders too

from model_helpers import SHARED_DATA, make_model  # noqa: E402

from workbench import presets  # noqa: E402

# Test models are tiny: one intra-op thread is faster than two fighting over small kernels, and it
# keeps the suite's time steady on CI's 2 cores. Tests that spawn processes (DDP) set their own.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def one_thread():
    """Every test starts on one thread, even after one that changed it (the trainer sets `threads`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def tiny_config():
    return presets.tiny(vocab=50)


@pytest.fixture
def tiny_model(tiny_config):
    return make_model(tiny_config)


@pytest.fixture
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data not found at {SHARED_DATA}; set WORKBENCH_DATA")
    return SHARED_DATA

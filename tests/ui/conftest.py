"""Fixtures shared by the UI tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint  # noqa: E402

from workbench.ui import loader, workers  # noqa: E402
from workbench.ui.requests import HEAVY_NICE  # noqa: E402


@pytest.fixture(autouse=True)
def no_answers_from_other_tests():
    """Pages share their answers through the process's one cache (`loader.CACHE`): each test starts without the
    answers another test's pages computed (patching, graphs, beam replays), so none depends on the order of tests.
    Models and dictionaries stay: loading them again would only cost time."""
    loader.CACHE.clear("patching", "graph", "replay", "confidence")
    yield


@pytest.fixture(scope="module")
def pool():
    """One worker process at the heavy work's niceness, as the served app places heavy jobs; closed after the module."""
    placement = workers.LocalPlacement(1, HEAVY_NICE)
    yield placement
    placement.close()


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    """The checkpoints found in a folder holding one untrained checkpoint, "alpha" (seed 0); a test module that needs
    other checkpoints defines its own `entries`."""
    root = tmp_path_factory.mktemp("ckpts")
    build_checkpoint(root / "alpha", seed=0, steps=0)
    return loader.discover([root], default=None)[0]

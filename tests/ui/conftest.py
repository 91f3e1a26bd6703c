"""Fixtures shared by the UI tests."""

from __future__ import annotations

import pytest

from workbench.ui import workers
from workbench.ui.requests import HEAVY_NICE


@pytest.fixture(scope="module")
def pool():
    """One worker process at the heavy work's niceness, as the served app places heavy jobs; closed after the module."""
    placement = workers.LocalPlacement(1, HEAVY_NICE)
    yield placement
    placement.close()

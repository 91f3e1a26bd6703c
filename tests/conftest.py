"""Shared fixtures: tiny seeded models, the shared data folder, markers, and the guard against leaked global state."""

from __future__ import annotations

import os
import shutil
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # model_helpers for tests in subfolders too

from model_helpers import SHARED_DATA, make_model  # noqa: E402

from workbench import presets  # noqa: E402

# Test models are tiny: one intra-op thread is faster than two fighting over small kernels, and it
# keeps the suite's time steady on CI's 2 cores. Tests that spawn processes (DDP) set their own.
torch.set_num_threads(1)

# urlopen() builds and keeps a process-wide opener on its first call, with the proxy variables of that
# moment (third-party code calls it: selenium's driver check, for one). Build it now, from the session's
# own environment, so no test's monkeypatched proxies can be baked into it; a test that replaces it with
# install_opener still fails the guard below.
urllib.request.install_opener(urllib.request.build_opener())

# Set once per process by libraries on first use, not by tests: joblib (imported by sacremoses) sets
# KMP_INIT_AT_FORK at import, torch sets TORCHINDUCTOR_CACHE_DIR at an optimizer's first step.
_SET_BY_LIBRARIES = {"PYTEST_CURRENT_TEST", "KMP_INIT_AT_FORK", "TORCHINDUCTOR_CACHE_DIR"}


def _global_state() -> dict:
    """Process-wide state a test could change for the tests after it (cheap to read: no deep copies of objects)."""
    return {
        "sys.path": list(sys.path),
        "os.environ": {k: v for k, v in os.environ.items() if k not in _SET_BY_LIBRARIES},
        "torch threads": torch.get_num_threads(),
        "torch default dtype": torch.get_default_dtype(),
        "urllib global opener": urllib.request._opener,  # set by urllib.request.install_opener
    }


def _restore(state: dict) -> None:
    sys.path[:] = state["sys.path"]
    for key in set(os.environ) - set(state["os.environ"]) - _SET_BY_LIBRARIES:
        del os.environ[key]
    os.environ.update(state["os.environ"])
    torch.set_num_threads(state["torch threads"])
    torch.set_default_dtype(state["torch default dtype"])
    urllib.request.install_opener(state["urllib global opener"])


def leaks(before: dict, after: dict) -> list[str]:
    """What differs between two `_global_state()` snapshots, one line per change, naming the values."""
    found = []
    added = [p for p in after["sys.path"] if p not in before["sys.path"]]
    removed = [p for p in before["sys.path"] if p not in after["sys.path"]]
    if added or removed or after["sys.path"] != before["sys.path"]:
        found.append(f"sys.path changed: added {added}, removed {removed}")
    env_b, env_a = before["os.environ"], after["os.environ"]
    for key in sorted(set(env_b) | set(env_a)):
        if env_b.get(key) != env_a.get(key):
            found.append(f"os.environ[{key!r}] changed: {env_b.get(key)!r} -> {env_a.get(key)!r}")
    for key in ("torch threads", "torch default dtype"):
        if before[key] != after[key]:
            found.append(f"{key} changed: {before[key]} -> {after[key]}")
    if before["urllib global opener"] is not after["urllib global opener"]:
        found.append(f"urllib global opener replaced (install_opener): {before['urllib global opener']!r} -> "
                     f"{after['urllib global opener']!r}")
    return found


@pytest.fixture(autouse=True)
def no_leaked_state():
    """Every test starts on one thread and must leave the process as it found it.

    Autouse fixtures are set up before the test's own (monkeypatch included) and torn down after them, so
    what monkeypatch restores is restored by the time this looks. A leak fails the test (an error at
    teardown, listing each change) and is undone, so the tests after it still start clean.
    """
    torch.set_num_threads(1)
    before = _global_state()
    yield
    after = _global_state()
    found = leaks(before, after)
    if found:
        _restore(before)
        pytest.fail("the test leaked global state (use monkeypatch or restore it):\n  " + "\n  ".join(found),
                    pytrace=False)


CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """pytest-playwright launches Debian's chromium (Playwright's own download host is unreachable)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: `make test` installs it (apt-get), or set CHROMIUM_PATH")
    return {**browser_type_launch_args, "executable_path": CHROMIUM}


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown (and unused) without it
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs two pytest-xdist workers with `--dist loadfile`: a test file goes to one worker whole (its
    module-scoped fixtures, trained models and servers, are built once), and here tests/browser/ goes as one unit
    too (one served app and one Chromium for all of it). pytest-xdist's own `loadgroup` cannot do this on pytest 9:
    it renames node ids through an attribute pytest no longer reads."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class BrowserAsOneFile(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "tests/browser/" if scope.startswith("tests/browser/") else scope

    return BrowserAsOneFile(config, log)


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

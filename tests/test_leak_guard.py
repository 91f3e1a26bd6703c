"""The conftest guard fails a test that leaves global state changed, and lets a clean one pass."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent

LEAKY = '''
import os
import sys
import urllib.request

import torch

SESSION_OPENER = urllib.request._opener  # conftest builds it at import


def test_clean(monkeypatch):
    monkeypatch.setenv("WORKBENCH_SOMETHING", "1")
    monkeypatch.syspath_prepend("/nonexistent-but-restored")


def test_sys_path():
    sys.path.insert(0, "/nonexistent-leaked")


def test_environ():
    os.environ["HTTPS_PROXY"] = "http://127.0.0.1:9"


def test_threads():
    torch.set_num_threads(2)


def test_dtype():
    torch.set_default_dtype(torch.float64)


def test_opener():
    urllib.request.install_opener(urllib.request.build_opener(urllib.request.ProxyHandler({})))


def test_after_the_leaks_everything_is_back():
    assert "/nonexistent-leaked" not in sys.path
    assert os.environ.get("HTTPS_PROXY") != "http://127.0.0.1:9"
    assert torch.get_num_threads() == 1 and torch.get_default_dtype() == torch.float32
    assert urllib.request._opener is SESSION_OPENER is not None
'''


def test_guard_fails_each_kind_of_leak_and_undoes_it(pytester):
    pytester.makeconftest((TESTS / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(model_helpers=(TESTS / "model_helpers.py").read_text(encoding="utf-8"), test_leaky=LEAKY)
    # -p no:randomly: the last test checks what the leaks before it left behind, so this run keeps file order
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=7, errors=5)
    out = result.stdout.str()
    for expected in ("sys.path changed: added ['/nonexistent-leaked']",
                     "os.environ['HTTPS_PROXY'] changed: None -> 'http://127.0.0.1:9'",
                     "torch threads changed: 1 -> 2",
                     "torch default dtype changed: torch.float32 -> torch.float64",
                     "urllib global opener replaced (install_opener)"):
        assert expected in out, out
    for name in ("test_sys_path", "test_environ", "test_threads", "test_dtype", "test_opener"):
        assert f"ERROR at teardown of {name}" in out or f"ERROR test_leaky.py::{name}" in out, out

"""Playwright against `panel serve apps/attention.py` with Debian's chromium (see ../shared/panel-browser-recipe.md).

One server for the whole module, started on a free port with small checkpoints built for it (one real,
one corrupt), so every browser test drives the same code a user gets.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "ui"))
from app_fixtures import build_checkpoint, corrupt_checkpoint  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/browser/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set CHROMIUM_PATH)")
    return {**browser_type_launch_args, "executable_path": CHROMIUM}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def app_server(tmp_path_factory):
    """(url, log lines so far): the served app; at teardown the server log must hold no traceback."""
    root = tmp_path_factory.mktemp("app_ckpts")
    build_checkpoint(root / "demo", steps=0)
    build_checkpoint(root / "other", seed=1, steps=0)
    corrupt_checkpoint(root / "zz_broken")
    port = _free_port()
    log_path = root / "server.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "panel", "serve", str(ROOT / "apps" / "attention.py"), "--port", str(port),
         "--address", "127.0.0.1", f"--allow-websocket-origin=127.0.0.1:{port}", "--args", "--checkpoints",
         str(root)],
        stdout=log, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}/attention"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                if r.status == 200:
                    break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("panel serve did not start:\n" + log_path.read_text())
            time.sleep(0.3)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    finally:
        log.close()
    errors = server_tracebacks(log_path.read_text())
    assert not errors, "\n\n".join(errors)


# A browser closing its page while the server writes to it makes tornado log this from its own task;
# it is transport noise, not an error of the app. Every other traceback fails the test run.
CLIENT_GONE = ("tornado.websocket.WebSocketClosedError", "tornado.iostream.StreamClosedError")


def server_tracebacks(log: str) -> list[str]:
    """The exception line of each traceback in a server log, except a client that went away mid-write."""
    lines = log.splitlines()
    found = []
    for i, line in enumerate(lines):
        if not line.startswith("Traceback (most recent call last):"):
            continue
        j = i + 1
        while j < len(lines) and lines[j].startswith(" "):
            j += 1
        exc = lines[j] if j < len(lines) else "(truncated traceback)"
        if not exc.startswith(CLIENT_GONE):
            found.append("\n".join(lines[max(0, i - 2): j + 1]))
    return found

"""Playwright against `panel serve apps/attention.py` with Debian's chromium (see ../shared/panel-browser-recipe.md).

One server for the whole run, started on a free port with small checkpoints built for it (de->en ones from
two runs, one of them with an early snapshot, an en->de one and a corrupt one), so every browser test drives
the same code a user gets. Every test using it also asserts that the server logged no traceback meanwhile.
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


class Served(str):
    """The app's URL, with the path of the server's log."""

    log: Path


@pytest.fixture(scope="session")
def app_server(tmp_path_factory):
    """The served app's URL (`.log`: its log); at teardown the whole log must hold no traceback."""
    root = tmp_path_factory.mktemp("app_ckpts")
    build_checkpoint(root / "demo", steps=0, run="runs/demo", step=150)
    build_checkpoint(root / "demo_early", steps=0, seed=2, run="runs/demo", step=10)
    build_checkpoint(root / "other", seed=1, steps=0, run="runs/other", step=150)
    build_checkpoint(root / "reverse", seed=3, steps=0, langs=("en", "de"))
    corrupt_checkpoint(root / "zz_broken")
    port = _free_port()
    log_path = root / "server.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "panel", "serve", str(ROOT / "apps" / "attention.py"), "--port", str(port),
         "--setup", str(ROOT / "apps" / "serve_setup.py"),
         "--address", "127.0.0.1", f"--allow-websocket-origin=127.0.0.1:{port}",
         # closed pages' sessions are destroyed within ~11 s. A page's own session must outlive its script loading:
         # at 5 s, a page that took longer to load (the suite's other worker and a busy machine beside it) found
         # its session gone (Bokeh's `assert self._session is not None` in the log, a page that never opens).
         "--check-unused-sessions", "1000", "--unused-session-lifetime", "10000",
         "--args", "--checkpoints", str(root)],
        stdout=log, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}/attention"
    deadline = time.monotonic() + 300  # a bound, not a goal: a busy 2-core machine (a training job beside) is slow
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
    served = Served(url)
    served.log = log_path
    yield served
    proc.terminate()
    try:
        proc.wait(timeout=60)  # a running model call finishes its batch first; on a loaded 2-core box that took >20 s
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)
        pytest.fail("panel serve did not stop within 60 s of SIGTERM")
    finally:
        log.close()
    errors = server_tracebacks(log_path.read_text())
    assert not errors, "\n\n".join(errors)


@pytest.fixture(autouse=True)
def no_server_traceback(request):
    """Each test that talks to the server: the log lines written during the test hold no traceback."""
    if "app_server" not in request.fixturenames:
        yield
        return
    log = request.getfixturevalue("app_server").log
    start = log.stat().st_size
    yield
    time.sleep(0.5)  # let the server finish writing what the test's last action caused
    with log.open(encoding="utf-8", errors="replace") as f:
        f.seek(start)
        errors = server_tracebacks(f.read())
    assert not errors, "the server logged:\n\n" + "\n\n".join(errors)


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

"""`panel serve apps/attention.py` (the README's app command) starts and serves a page without errors."""

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_app_serves_a_page():
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "panel", "serve", str(ROOT / "apps" / "attention.py"), "--port", str(port),
         "--setup", str(ROOT / "apps" / "serve_setup.py"),
         "--address", "127.0.0.1", f"--allow-websocket-origin=127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )
    try:
        deadline, body = time.monotonic() + 300, None  # a bound for a busy machine, not a goal
        while time.monotonic() < deadline and body is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/attention", timeout=30) as r:
                    assert r.status == 200
                    body = r.read().decode()
            except OSError:
                assert proc.poll() is None, "panel serve exited early"
                time.sleep(0.5)
        assert body is not None, "the app did not answer within 90 s"
        assert "Attention Workbench" in body
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert "Traceback" not in out, out

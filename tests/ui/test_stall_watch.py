"""The stall watchdog names the callback that holds the event loop, and starts from the server's setup script."""

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from workbench.ui.stall_watch import StallWatch

ROOT = Path(__file__).resolve().parents[2]


def _hold_the_loop_for(seconds: float) -> None:
    time.sleep(seconds)


def _run_loop(watch: StallWatch, work) -> None:
    """Run `work` on a fresh event loop in its own thread (another test may have left this thread's loop running)."""

    async def main():
        watch.start(asyncio.get_running_loop())
        await asyncio.sleep(0.3)  # the first beat, then a free-running loop
        await work()

    failures = []

    def run():
        try:
            asyncio.run(main())
        except BaseException as exc:  # re-raised in the test's thread
            failures.append(exc)

    thread = threading.Thread(target=run, name="test-loop")
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the test's event loop did not finish"
    if failures:
        raise failures[0]


def test_a_blocking_callback_is_named_with_the_loop_thread(tmp_path):
    log = tmp_path / "stalls.log"
    watch = StallWatch(log, threshold_s=0.3)

    async def block():
        _hold_the_loop_for(1.2)
        await asyncio.sleep(0.5)  # the loop beats again: the stall's end is written

    _run_loop(watch, block)
    text = log.read_text()
    assert text.startswith("watching the event loop")
    assert "=== stall 1" in text and "--- thread EVENT LOOP" in text
    loop_part = text.split("--- thread EVENT LOOP")[1].split("--- thread")[0]
    assert "_hold_the_loop_for" in loop_part
    ended = float(text.split("the loop was silent ")[1].split(" s")[0])
    assert ended > 0.9  # slept 1.2 s; no upper bound: a busy machine may add to it


def test_a_threshold_below_the_beat_is_refused(tmp_path):
    with pytest.raises(ValueError, match="must exceed the beat"):
        StallWatch(tmp_path / "x", threshold_s=0.01)


def test_serve_setup_starts_the_watch_when_asked(tmp_path):
    # the --setup script runs before the server's loop: the watch must start on that loop once it runs
    log = tmp_path / "stalls.log"
    code = ("import runpy, asyncio\n"
            "from tornado.ioloop import IOLoop\n"
            f"runpy.run_path({str(ROOT / 'apps' / 'serve_setup.py')!r})\n"
            "IOLoop.current().call_later(0.5, IOLoop.current().stop)\n"
            "IOLoop.current().start()\n")
    env = {**os.environ, "WORKBENCH_STALL_LOG": str(log), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60, cwd=tmp_path)
    assert log.read_text().startswith("watching the event loop")

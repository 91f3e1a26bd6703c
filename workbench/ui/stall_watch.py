"""Find what holds the server's event loop: a watchdog that writes every thread's stack while the loop is stalled.

The app's interactive latency under load had rare 1.5–2.7 s stalls whose source a whole-run profile could not
show (docs/app.md, issue 37): a profile averages over the run, a stall is one moment. This watches the moment. A
callback on the event loop beats every `BEAT_S`; a thread checks the beat, and while the last one is older than
`threshold_s` it writes the stacks of every Python thread to `path` every `SAMPLE_S` (at most `MAX_SAMPLES` per
stall), then one line with the stall's length when the loop beats again. A loop thread caught inside a callback
names the work that blocks it; a loop thread caught waiting in `select` while the beat is late means the process
was not scheduled or another thread held the interpreter lock — the other threads' stacks then say which.

Off unless asked: `WORKBENCH_STALL_LOG=PATH` (and optionally `WORKBENCH_STALL_S`, default 0.5) in the server's
environment, read by apps/serve_setup.py; `benchmarks/bench_app.py --stall-log` sets them for its server.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from pathlib import Path

BEAT_S = 0.05
SAMPLE_S = 0.2
MAX_SAMPLES = 10
STACK_FRAMES = 80  # deep enough to reach the app's own frame under Bokeh's model walks


class StallWatch:
    """The beat (on the event loop) and the watcher thread; `start(loop)` once, from any thread."""

    def __init__(self, path: str | Path, threshold_s: float = 0.5) -> None:
        if threshold_s <= BEAT_S:
            raise ValueError(f"threshold_s ({threshold_s}) must exceed the beat interval ({BEAT_S} s)")
        self.path, self.threshold_s = Path(path), threshold_s
        self.last_beat = time.monotonic()
        self.loop_thread: int | None = None
        self.stalls = 0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.call_soon_threadsafe(self._first_beat, loop)
        threading.Thread(target=self._watch, name="stall-watch", daemon=True).start()

    def _first_beat(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop_thread = threading.get_ident()
        self._write(f"watching the event loop of thread {self.loop_thread} from {time.strftime('%H:%M:%S')}: "
                    f"stacks of every thread when it is silent over {self.threshold_s} s\n")
        self._beat(loop)

    def _beat(self, loop: asyncio.AbstractEventLoop) -> None:
        self.last_beat = time.monotonic()
        loop.call_later(BEAT_S, self._beat, loop)

    def _watch(self) -> None:
        while True:
            time.sleep(BEAT_S)
            began = self.last_beat
            if self.loop_thread is None or time.monotonic() - began < self.threshold_s:
                continue
            self.stalls += 1
            samples = 0
            while self.last_beat == began:
                if samples < MAX_SAMPLES:
                    self._write_stacks(time.monotonic() - began)
                    samples += 1
                time.sleep(SAMPLE_S)
            self._write(f"stall {self.stalls} ended: the loop was silent {self.last_beat - began - BEAT_S:.2f} s "
                        f"({samples} samples)\n\n")

    def _write_stacks(self, silent_s: float) -> None:
        names = {t.ident: t.name for t in threading.enumerate()}
        lines = [f"=== stall {self.stalls}: loop silent {silent_s:.2f} s at {time.strftime('%H:%M:%S')}\n"]
        for ident, frame in sys._current_frames().items():
            if ident == threading.get_ident():
                continue
            role = "EVENT LOOP" if ident == self.loop_thread else names.get(ident, "?")
            lines.append(f"--- thread {role} ({ident})\n")
            lines.extend(traceback.format_stack(frame)[-STACK_FRAMES:])
        self._write("".join(lines))

    def _write(self, text: str) -> None:
        with self.path.open("a") as out:
            out.write(text)

"""The request path's rules, headless (issue 28): each rule once inline and once served-style (worker threads
and an asyncio loop), against `requests.Lane` directly and through the session and its views."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint  # noqa: E402

from workbench.ui import loader  # noqa: E402
from workbench.ui.requests import Cancelled, Requests  # noqa: E402
from workbench.ui.session import Session  # noqa: E402

SENTENCE = "Ein Hund läuft durch den Park."
WAIT = 60


def on_loop(main):
    """Run `main()` (a coroutine function) on a fresh event loop in a thread of its own (pytest-playwright's sync
    API may leave a loop running in this one)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result(timeout=120)


async def until(check, what: str):
    for _ in range(WAIT * 100):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_late_answer_is_dropped():
    applied, release = [], threading.Event()

    def slow(x):
        assert release.wait(WAIT)
        return x

    async def main():
        lane = Requests(background=True).lane("t")
        lane.submit(slow, "old", done=applied.append)
        lane.submit(lambda x: x, "new", done=applied.append)
        await until(lambda: applied, "the new answer")
        release.set()
        await asyncio.sleep(0.3)  # the old job finishes now; its answer must not land
        return lane

    lane = on_loop(main)
    assert applied == ["new"] and not lane.busy


def test_a_late_answer_is_dropped_inline_too():
    applied = []
    lane = Requests(background=False).lane("t")
    lane.submit(lambda x: x, "a", done=applied.append)
    lane.submit(lambda x: x, "b", done=applied.append)
    assert applied == ["a", "b"]  # inline: each answer lands before the next request is made


def test_a_cancelled_job_is_never_applied_and_stops_between_batches():
    applied, failed, batches = [], [], []
    started, release = threading.Event(), threading.Event()

    def sweep(n, ticket):
        for i in range(n):
            ticket.check()
            batches.append(i)
            if i == 0:
                started.set()
                assert release.wait(WAIT)
        return "finished"

    async def main():
        lane = Requests(background=True).lane("t", heavy=True)
        lane.submit(sweep, 100, done=applied.append, failed=failed.append)
        await asyncio.get_running_loop().run_in_executor(None, started.wait, WAIT)
        lane.cancel()  # the Stop button
        release.set()
        await asyncio.sleep(0.3)

    on_loop(main)
    assert applied == [] and failed == [] and batches == [0]


def test_a_queued_job_that_was_superseded_never_starts():
    ran, gate = [], threading.Event()

    def blocker(ticket):
        assert gate.wait(WAIT)

    async def main():
        requests = Requests(background=True)
        # fill both interactive workers, so the next job queues
        lanes = [requests.lane(f"busy{i}") for i in range(2)]
        for lane in lanes:
            lane.submit(blocker, done=lambda _a: None)
        lane = requests.lane("t")
        lane.submit(lambda: ran.append("old"), done=lambda _a: None)
        lane.submit(lambda: ran.append("new"), done=lambda _a: None)
        gate.set()
        await until(lambda: "new" in ran, "the new job")
        await asyncio.sleep(0.2)

    on_loop(main)
    assert ran == ["new"]


def test_progress_from_an_old_request_is_ignored():
    shown, release, reported = [], threading.Event(), threading.Event()
    stopped_at = []

    def reporting(tag, ticket):
        ticket.report(1, 2, tag)
        reported.set()
        if tag == "old":
            assert release.wait(WAIT)
            try:
                ticket.report(2, 2, tag)  # superseded meanwhile: raises, and nothing reaches the page
            except Cancelled:
                stopped_at.append(2)
                raise
        return tag

    async def main():
        lane = Requests(background=True).lane("t")
        lane.submit(reporting, "old", done=lambda _a: None, progress=lambda *a: shown.append(a))
        await asyncio.get_running_loop().run_in_executor(None, reported.wait, WAIT)
        await until(lambda: shown, "the first report")
        lane.submit(reporting, "new", done=lambda _a: None, progress=lambda *a: shown.append(a))
        release.set()
        await until(lambda: (1, 2, "new") in shown and stopped_at, "the new report")
        await asyncio.sleep(0.2)

    on_loop(main)
    assert shown == [(1, 2, "old"), (1, 2, "new")] and stopped_at == [2]


def test_progress_and_answers_are_applied_on_the_loop_with_the_callers_context():
    var = contextvars.ContextVar("var", default="unset")
    seen = {}

    def work(ticket):
        seen["worker"] = (var.get(), threading.current_thread().name)
        ticket.report(1, 1)
        return 2

    async def main():
        seen["loop"] = threading.current_thread()
        var.set("caller's")
        lane = Requests(background=True).lane("t")
        lane.submit(work, done=lambda a: seen.setdefault("done", threading.current_thread()),
                    progress=lambda *a: seen.setdefault("progress", threading.current_thread()))
        await until(lambda: "done" in seen, "the answer")

    on_loop(main)
    assert seen["worker"][0] == "caller's" and seen["worker"][1].startswith("workbench-ui")
    assert seen["progress"] is seen["loop"] and seen["done"] is seen["loop"]


def test_a_closed_page_gets_nothing_and_its_jobs_stop():
    applied, batches, started, release = [], [], threading.Event(), threading.Event()

    def sweep(ticket):
        for i in range(50):
            ticket.check()
            batches.append(i)
            started.set()
            if i == 0:
                assert release.wait(WAIT)

    async def main():
        requests = Requests(background=True)
        requests.lane("t", heavy=True).submit(sweep, done=applied.append)
        await asyncio.get_running_loop().run_in_executor(None, started.wait, WAIT)
        requests.close()  # on_session_destroyed
        release.set()
        await asyncio.sleep(0.3)

    on_loop(main)
    assert applied == [] and batches == [0]


def test_a_page_runs_one_heavy_job_and_interactive_work_never_waits_behind_heavy_work():
    gate, order, stopped = threading.Event(), [], []

    def heavy(tag, ticket):
        while not gate.wait(0.01):
            ticket.check()
        order.append(tag)
        return tag

    async def main():
        pages = [Requests(background=True) for _ in range(3)]
        first = pages[0].lane("why", heavy=True)
        first.submit(heavy, "page0-a", done=order.append, stopped=lambda: stopped.append("page0-a"))
        pages[0].lane("analysis", heavy=True).submit(heavy, "page0-b", done=order.append)
        for i, page in enumerate(pages[1:], 1):  # two more pages' sweeps: every heavy worker is taken
            page.lane("why", heavy=True).submit(heavy, f"page{i}", done=order.append)
        answers = []
        pages[0].lane("translate").submit(lambda: "translated", done=answers.append)
        await until(lambda: answers, "the interactive answer")  # while every heavy job still runs
        assert not gate.is_set() and stopped == ["page0-a"]
        gate.set()
        await until(lambda: order.count("page0-b") == 2, "the heavy answers")
        return answers

    assert on_loop(main) == ["translated"]
    assert "page0-a" not in order  # the superseded heavy job was stopped, never applied


# ------------------------------------------------------------------------------ through the session


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    build_checkpoint(root / "alpha", seed=0, steps=0)
    found, _ = loader.discover([root], default=None)
    return found


def test_a_result_applied_while_the_views_are_built_is_shown(entries):
    """The first answer may land before, during or after the views are built: each way the view draws it."""
    from workbench.ui.views import AttentionView

    async def main():
        s = Session(entries, checkpoint="alpha", sentence=SENTENCE, background=True)
        early = AttentionView(session=s)  # built while the job runs
        await until(lambda: s.result is not None, "the first answer")
        late = AttentionView(session=s)  # built after it landed
        return early, late

    early, late = on_loop(main)
    assert early.figure is not None and late.figure is not None
    assert early.figure.title.text == late.figure.title.text


def test_a_session_drops_stale_translations_and_stops_on_close(entries):
    async def main():
        s = Session(entries, checkpoint="alpha", sentence=SENTENCE, autorun=False, background=True)
        s.autorun = True
        for i in range(5):
            s.sentence = f"Satz Nummer {i}."
        await until(lambda: not s.busy and s.result is not None, "the last answer")
        version = s.version
        s.sentence = "Noch ein Satz."
        s.close()
        await asyncio.sleep(0.5)
        return s, version

    s, version = on_loop(main)
    assert version == 1 and s.result is None and s.version == version  # closed: the last request never landed


def test_a_running_job_stops_when_the_process_exits(tmp_path):
    """A sweep still running when the server stops must not hold the process (it used to run to its end).

    Counted, not timed: the sweep writes each batch it starts to a file, and after the process has exited
    the file holds far fewer than its 600 batches (at 50 ms each, running to the end would take 30 s)."""
    import subprocess
    import sys as _sys

    log = tmp_path / "batches.txt"
    code = f"""
import asyncio, time
from workbench.ui.requests import Requests
def sweep(ticket):
    with open({str(log)!r}, "a") as out:
        for i in range(600):
            ticket.check()
            out.write(f"{{i}}\\n")
            out.flush()
            time.sleep(0.05)
async def main():
    Requests(background=True).lane("t", heavy=True).submit(sweep, done=print)
    await asyncio.sleep(0.3)
asyncio.run(main())
"""
    subprocess.run([_sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True)
    started = len(log.read_text().splitlines())
    assert 0 < started < 600, started

"""Heavy work in worker processes (workers.py) and through the request path: the job runs in another process at a
lower priority, its progress reaches the page on the loop, and a superseded, stopped or closed page's job stops in
its worker (the worker reports the batch it stopped at; no duration is asserted). The same on a Dask LocalCluster.
Patching computed in a worker equals patching computed in the server's process."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_requests import on_loop, until  # noqa: E402

from workbench.ui import why_view, workers  # noqa: E402
from workbench.ui.requests import HEAVY_NICE, Cancelled, Requests  # noqa: E402
from workbench.ui.session import Session  # noqa: E402

SENTENCE = "Ein Hund läuft durch den Park."
WAIT = 120


def _wait(check, what: str) -> None:
    for _ in range(WAIT * 20):
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _swapped(session) -> str:
    """The sentence with its first two pieces swapped: the same token count (the tiny tokenizer keeps it)."""
    tm = session.model
    ids, _ = tm.encode_source(SENTENCE)
    swapped = tm.src_tokenizer.decode([ids[1], *ids[:1], *ids[2:-1]])
    assert len(tm.encode_source(swapped)[0]) == len(ids) and tm.encode_source(swapped)[0] != ids
    return swapped


def test_a_job_runs_in_another_process_at_a_lower_priority(pool):
    reports = []
    job = pool.submit(workers.probe, (3, 0.0), report=lambda *a: reports.append(a))
    pid, nice = job.future.result(timeout=WAIT)
    assert pid != os.getpid() and nice >= HEAVY_NICE
    _wait(lambda: len(reports) == 3, "the progress reports")
    assert reports == [(0, 3, ""), (1, 3, ""), (2, 3, "")]  # in order, through the queue: `Progress` calls


def test_a_cancelled_job_stops_at_its_next_batch_and_says_where(pool):
    reports = []
    job = pool.submit(workers.probe, (10_000, 0.01), report=lambda *a: reports.append(a))
    _wait(lambda: len(reports) >= 3, "the first batches")
    seen = reports[-1][0]  # the last batch the server had heard of when it cancelled
    job.cancel()
    with pytest.raises(Cancelled):
        job.future.result(timeout=WAIT)
    _wait(lambda: job.stopped_at is not None, "the worker's stop report")
    # the worker stops at its next report: at the batch the server last saw (the cancel came before the next
    # report, as on a busy machine) or later, and long before the end
    assert 2 <= seen <= job.stopped_at[0] < 10_000 - 1


def test_a_job_nobody_wants_any_more_is_cancelled_by_the_poller(pool):
    wanted = threading.Event()
    wanted.set()
    reports = []
    job = pool.submit(workers.probe, (10_000, 0.01), report=lambda *a: reports.append(a), wanted=wanted.is_set)
    _wait(lambda: reports, "the first batch")
    wanted.clear()  # as a ticket of a closed page: the poller notices and cancels
    with pytest.raises(Cancelled):
        job.future.result(timeout=WAIT)
    _wait(lambda: job.stopped_at is not None, "the worker's stop report")
    assert job.stopped_at[0] < 10_000 - 1


def test_through_the_request_path_progress_lands_on_the_loop_and_superseded_or_closed_jobs_stop(pool, monkeypatch):
    monkeypatch.setattr(workers, "_PLACEMENT", pool)
    loop_thread, progress, answers = [], [], []

    async def main():
        loop_thread.append(threading.current_thread())
        requests = Requests(background=True)
        lane = requests.lane("why", heavy=True)
        lane.submit(workers.probe, 10_000, 0.01, done=answers.append,
                    progress=lambda *a: progress.append((threading.current_thread(), a)), offload=True)
        first = lane._job
        await until(lambda: len(progress) >= 2, "the first job's progress")
        lane.submit(workers.probe, 2, 0.0, done=answers.append, offload=True)  # supersedes the first
        await until(lambda: answers, "the second job's answer")
        await until(lambda: first.stopped_at is not None, "the first job's stop in its worker")
        lane.submit(workers.probe, 10_000, 0.01, done=answers.append, progress=lambda *a: None, offload=True)
        third = lane._job
        await until(lambda: third.reports >= 1, "the third job's first batch")
        requests.close()  # the page is gone
        await until(lambda: third.stopped_at is not None, "the closed page's job stopping in its worker")
        return first, third

    first, third = on_loop(main)
    assert all(t is loop_thread[0] for t, _ in progress)
    assert len(answers) == 1 and answers[0][0] != os.getpid()  # only the current job's answer, from a worker
    assert first.stopped_at[0] < 10_000 - 1 and third.stopped_at[0] < 10_000 - 1


def test_patching_in_a_worker_equals_patching_here_and_the_estimate_comes_first(pool, entries, monkeypatch):
    monkeypatch.setattr(workers, "_PLACEMENT", pool)
    s = Session(entries, checkpoint="alpha", sentence=SENTENCE)
    r = s.result
    changed = _swapped(s)
    here = why_view.patch(r, changed, exact=True)
    reports, partial = [], []
    job = pool.submit(why_view.patch, (why_view.PatchInput.of(r), changed, True), report=lambda *a: reports.append(a),
                      partial=lambda p: partial.append((len(reports), p)))
    there = job.future.result(timeout=WAIT)
    assert there.exact and there.corrupted == here.corrupted
    for a, b in zip(here.maps, there.maps, strict=True):
        assert np.allclose(a[1], b[1], equal_nan=True, atol=1e-6)
    _wait(lambda: len(reports) >= 2, "the progress")
    assert len(partial) == 1 and partial[0][0] == 0 and not partial[0][1].exact  # the estimate, before any report
    assert reports[0][0] == 0 and reports[0][2] == ""  # then the sweep, from its first site
    assert [d for d, *_ in reports] == sorted(d for d, *_ in reports)
    assert there.agreement is not None and there.agreement.cells == here.agreement.cells


def test_without_a_pool_the_job_runs_in_the_servers_threads_and_the_log_says_so(monkeypatch, caplog):
    def refuse(*a, **k):
        raise OSError("no semaphores here")

    monkeypatch.setattr(workers, "_PLACEMENT", None)
    monkeypatch.setattr(workers, "_REFUSED", False)
    monkeypatch.setattr(workers, "DASK", "")
    monkeypatch.setattr(workers, "LocalPlacement", refuse)
    answers = []

    async def main():
        lane = Requests(background=True).lane("why", heavy=True)
        lane.submit(workers.probe, 1, 0.0, done=answers.append, offload=True)
        await until(lambda: answers, "the answer")

    with caplog.at_level(logging.WARNING, logger="workbench.ui.workers"):
        on_loop(main)
    assert answers[0][0] == os.getpid()
    assert "heavy work runs in the server's threads" in caplog.text


def test_the_same_jobs_run_on_a_dask_cluster(entries, monkeypatch):
    distributed = pytest.importorskip("distributed", reason="the optional Dask placement needs `distributed`")
    for name in ("MALLOC_TRIM_THRESHOLD_", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                 "PYTHONHASHSEED", "__DASK_PARENT_PID"):  # Dask's nanny sets these in this process: restored after
        monkeypatch.setenv(name, os.environ.get(name, ""))
        if not os.environ[name]:
            monkeypatch.delenv(name)
    # a worker process, as a real cluster has: the job, its arguments and its answer cross by pickling
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as c, \
            distributed.Client(c, set_as_default=False) as client:
        p = workers.DaskPlacement(client, HEAVY_NICE)
        pid, nice = p.submit(workers.probe, (1, 0.0)).future.result(timeout=WAIT)
        assert pid != os.getpid() and nice >= HEAVY_NICE  # another process, at the heavy work's lower priority
        reports = []
        job = p.submit(workers.probe, (10_000, 0.01), report=lambda *a: reports.append(a))
        _wait(lambda: len(reports) >= 3, "progress from the Dask worker")
        job.cancel()
        with pytest.raises(Cancelled):
            job.future.result(timeout=WAIT)
        _wait(lambda: job.stopped_at is not None, "the Dask worker's stop report")
        assert 3 <= job.stopped_at[0] < 10_000 - 1
        s = Session(entries, checkpoint="alpha", sentence=SENTENCE)
        r, changed = s.result, _swapped(s)
        there = p.submit(why_view.patch, (why_view.PatchInput.of(r), changed, False)).future.result(timeout=WAIT)
        here = why_view.patch(r, changed, exact=False)
        assert not there.exact and np.allclose(there.maps[0][1], here.maps[0][1], equal_nan=True, atol=1e-6)
        p.closed = True


def _exit_unless_in(pid: int) -> str:
    """Kill the worker process it runs in (a crash), or answer when it runs in process `pid` (the server's)."""
    if os.getpid() != pid:
        os._exit(1)
    return "ran in the server's threads"


def test_a_dead_worker_hands_its_job_to_the_servers_threads_and_the_log_says_so(monkeypatch, caplog):
    doomed = workers.LocalPlacement(1, HEAVY_NICE)
    monkeypatch.setattr(workers, "_PLACEMENT", doomed)
    monkeypatch.setattr(workers, "_REFUSED", False)
    answers = []

    async def main():
        lane = Requests(background=True).lane("why", heavy=True)
        lane.submit(_exit_unless_in, os.getpid(), done=answers.append, offload=True)
        await until(lambda: answers, "the answer from the fallback")

    with caplog.at_level(logging.WARNING, logger="workbench.ui.workers"):
        on_loop(main)
    assert answers == ["ran in the server's threads"] and workers._PLACEMENT is None
    assert "the worker pool broke" in caplog.text


def test_starting_the_pool_never_blocks_the_caller_and_a_close_waits_for_the_start(monkeypatch):
    """The pool starts its processes inside its own `submit` (the forkserver imports torch: seconds); the server's
    loop must not wait for that. Here the pool's submit is held until the test lets it go: `submit` and `warm`
    return at once, a job cancelled meanwhile never reaches the pool, and a `close` queued behind the start shuts
    the pool down only after it (a server stopped during the start had logged a forkserver traceback)."""
    placement = workers.LocalPlacement(1, HEAVY_NICE)
    held, calls = threading.Event(), []
    real_submit = placement.pool.submit

    def held_submit(fn, *args):
        held.wait(WAIT)
        calls.append(fn)
        return real_submit(fn, *args)

    monkeypatch.setattr(placement.pool, "submit", held_submit)
    monkeypatch.setattr(workers, "_PLACEMENT", placement)
    monkeypatch.setattr(workers, "_WARMED", set())
    kept = placement.submit(workers.probe, (1, 0.0))
    dropped = placement.submit(workers.probe, (1, 0.0))
    warming = workers.warm("/nowhere/checkpoint")  # returns its futures while the pool is held
    assert len(warming) == 1 and not any(f.done() for f in warming)
    assert not kept.future.done() and calls == []  # submit returned before the pool was called
    dropped.cancel()
    assert dropped.inner.cancelled()
    held.set()
    pid, _nice = kept.future.result(timeout=WAIT)
    assert pid != os.getpid()
    assert calls.count(workers._run_local) == 1  # the cancelled job never reached the pool
    with pytest.raises(Exception, match="nowhere|No such|not found|exist"):
        warming[0].result(timeout=WAIT)  # a missing checkpoint fails in the worker, and says so
    held.clear()
    late = placement.submit(workers.probe, (1, 0.0))
    placement.close()  # queued behind the held call: the pool shuts down after it
    held.set()
    done, _ = futures.wait([late.inner], timeout=WAIT)  # run or cancelled by the shutdown: never left hanging
    assert done
    placement._calls.shutdown(wait=True)
    assert placement.pool._shutdown_thread


def test_a_lost_connection_stops_the_pages_job_at_once_and_a_later_request_still_runs(pool, monkeypatch):
    """Bokeh destroys a closed page's session only after its unused-session lifetime (seconds); the app stops the
    page's jobs at the websocket's close, on the document's `ConnectionLost` event (`stop_work_when_the_page_goes`).
    The job stops in its worker at its next batch; the session is not closed, so a request after it still runs."""
    from bokeh.document import Document
    from bokeh.events import ConnectionLost

    from workbench.ui.workbench_app import stop_work_when_the_page_goes

    monkeypatch.setattr(workers, "_PLACEMENT", pool)
    answers = []

    class Page:  # what the hook needs of a Session: its requests
        requests = None

    async def main():
        page = Page()
        page.requests = Requests(background=True)
        doc = Document()
        stop_work_when_the_page_goes(doc, page)
        lane = page.requests.lane("why", heavy=True)
        lane.submit(workers.probe, 10_000, 0.01, done=answers.append, progress=lambda *a: None, offload=True)
        job = lane._job
        await until(lambda: job.reports >= 1, "the job's first batch")
        doc.callbacks.trigger_event(ConnectionLost())  # what Bokeh's websocket handler does when the page closes
        assert job.cancelled  # at once, not when the session is destroyed
        await until(lambda: job.stopped_at is not None, "the job stopping in its worker")
        lane.submit(workers.probe, 2, 0.0, done=answers.append, offload=True)
        await until(lambda: answers, "a later request's answer")
        return job

    job = on_loop(main)
    assert job.stopped_at[0] < 10_000 - 1 and len(answers) == 1 and answers[0][0] != os.getpid()


def test_a_job_cancelled_before_the_pool_had_it_settles_once(caplog):
    """Cancelled before the pool's future existed, while the pool had already started it: when that future ends,
    the job (cancelled and told so) is left alone; a second notice had raised "Future in unexpected state" in the
    pool's callback thread (a server traceback under the link round-trip test)."""
    from concurrent.futures import Future

    from workbench.ui.workers import _Deferred

    job = _Deferred()
    assert job.cancel()
    started = Future()
    assert started.set_running_or_notify_cancel()
    job.attach(started)  # too late to cancel: it runs to its end
    with caplog.at_level("ERROR", logger="concurrent.futures"):
        started.set_result(1)
    assert job.cancelled() and not caplog.records

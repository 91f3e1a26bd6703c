"""Where heavy work runs: worker processes at a lower priority, not the server's interpreter.

    job = workers.submit(fn, args, report=on_progress)   # None: no pool here (the caller runs it in a thread)
    job.future                                            # a concurrent.futures.Future of fn's answer
    job.cancel()                                          # the worker stops at its next ticket.check()
    job.stopped_at                                        # what the worker last reported before it stopped

A job is a module-level function and picklable arguments (`why_view.patch` with a `PatchInput`, never a model):
the worker calls `fn(*args, ticket=...)` with a `WorkerTicket` whose `check()` and `report(...)` act as the
request path's `Ticket` does, across the process boundary. Models are loaded once per worker process and kept
there by checkpoint path (`model(path)`, `loader.load_model`'s per-process cache).

Placement, chosen once per server process (`placement()`):
- **A Dask cluster** when `WORKBENCH_DASK_SCHEDULER` holds a scheduler's address (`tcp://host:8786`; the optional
  dependency `distributed`). Progress travels through a `distributed.Queue`, cancellation through a
  `distributed.Event` per job, so workers on other machines need nothing but the scheduler (and the checkpoints
  at the same paths).
- **A local process pool** otherwise: `ProcessPoolExecutor` with the 'forkserver' context on Linux ('spawn'
  elsewhere: the server has threads, and forking a threaded process can deadlock),
  `WORKBENCH_APP_HEAVY_PROCESSES` workers (2), each at nice `requests.HEAVY_NICE` with one torch thread. Progress
  comes back through a multiprocessing queue that a server thread polls; cancellation is a flag in shared memory
  (one byte per job slot) that the worker reads at every check, so no manager process is needed.
- **The server's own threads** (`requests.HEAVY`) when `WORKBENCH_APP_HEAVY_PROCESSES=0`, or when the pool cannot
  start (no shared memory, no semaphores, a worker that dies at start-up): said once in the log.

The poller thread also cancels the job of a ticket that stopped wanting it by any road (superseded, Stop, page
closed, server shutting down), at most `POLL` seconds later; a worker checks between batches (a patching batch
takes well under a second), which keeps "closing a page stops its work within 2 s".
"""

from __future__ import annotations

import inspect
import itertools
import logging
import multiprocessing as mp
import os
import queue as queue_mod
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import process as _cf_process
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import torch

from . import work

log = logging.getLogger(__name__)

STOPPED = "workbench: the job stopped"  # what a stopped Dask job returns (the server raises Cancelled for it)
POLL = 0.1  # seconds between the poller's looks at progress and at cancelled tickets
SLOTS = 4096  # cancellation flags in shared memory; a job uses slot id % SLOTS (one heavy job per page)
PROCESSES = int(os.environ.get("WORKBENCH_APP_HEAVY_PROCESSES", "2"))
DASK = os.environ.get("WORKBENCH_DASK_SCHEDULER", "")
# Nice 10 for heavy work, threads and worker processes alike: a translation (nice 0) gets ~90 % of a contended core;
# 19 starved the sweeps entirely on a machine other jobs kept busy (benchmarks/bench_app.py --contention).
HEAVY_NICE = int(os.environ.get("WORKBENCH_APP_HEAVY_NICE", "10"))


class Cancelled(Exception):
    """Raised in a worker by `WorkerTicket.check` (the request path's `Cancelled` is this class)."""


# ------------------------------------------------------------------------------------------- the worker side


def model(path: str):
    """The checkpoint at `path` as a TranslationModel, loaded once per process (the worker's cache)."""
    return work.model(str(path))


class WorkerTicket:
    """What a job sees in a worker: `check()` raises `Cancelled` once the server cancelled it, `report(...)` sends
    progress to the page (and checks). `last` is the last report, sent back when the job stops."""

    def __init__(self, cancelled: Callable[[], bool], send: Callable[[tuple], None]):
        self._cancelled = cancelled
        self._send = send
        self.last: tuple = ()
        self.checks = 0

    @property
    def cancelled(self) -> bool:
        return self._cancelled()

    def check(self) -> None:
        if self._cancelled():
            raise Cancelled(f"stopped after {self.checks} checks, last report {self.last[:2]}")
        self.checks += 1

    def report(self, done: int, total: int, what: str = "") -> None:
        """A `Progress` call, sent to the server's ticket; also a check."""
        self.check()
        self.last = (done, total, what)
        self._send(("progress", self.last))

    def partial(self, answer: Any) -> None:
        """An interim answer (it must pickle), sent to the server's ticket; also a check."""
        self.check()
        self._send(("partial", answer))


def _call(fn: Callable, args: tuple, ticket: WorkerTicket, send: Callable[[tuple], None]) -> Any:
    try:
        if _takes_ticket(fn):
            return fn(*args, ticket=ticket)
        return fn(*args)
    except Cancelled:
        send(("stopped", ticket.last))  # the batch it stopped at, for the server's log and the tests
        raise
    finally:
        send(("end", ()))  # after its last report: the server hands the answer on only once its progress is in


# local pool: the queue and the flags come with the process (initargs), as multiprocessing requires
_QUEUE = None
_FLAGS = None


def _init_worker(progress, flags, nice: int) -> None:
    global _QUEUE, _FLAGS
    _QUEUE, _FLAGS = progress, flags
    _lower_priority(nice)
    torch.set_num_threads(int(os.environ.get("WORKBENCH_TORCH_THREADS", "1")))


def _lower_priority(nice: int) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError):  # not Linux, or not permitted: the separate processes still hold
        pass


def _run_local(job_id: int, fn: Callable, args: tuple) -> Any:
    slot = job_id % SLOTS
    send = lambda msg: _QUEUE.put((job_id, *msg))  # noqa: E731
    return _call(fn, args, WorkerTicket(lambda: _FLAGS[slot] == 1, send), send)


def _run_dask(job_id: int, fn: Callable, args: tuple, queue_name: str, event_name: str, nice: int) -> Any:
    from distributed import Event, Queue  # optional dependency: only with a Dask scheduler

    _lower_priority(nice)  # this Dask worker thread; it stays low, as the heavy pool's threads do
    progress, cancel = Queue(queue_name), Event(event_name)
    send = lambda msg: progress.put((job_id, *msg))  # noqa: E731
    try:
        return _call(fn, args, WorkerTicket(cancel.is_set, send), send)
    except Cancelled:
        return STOPPED  # not an exception: Dask would log a stopped job as "Compute Failed"


def probe(batches: int, pause: float, ticket=None) -> tuple[int, int]:
    """A job of `batches` steps of `pause` seconds that reports each: the placement's own check (tests, benchmark).
    Returns the process id and niceness it ran with."""

    for i in range(batches):
        if ticket is not None:
            ticket.report(i, batches)
        time.sleep(pause)
    return os.getpid(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _warm(path: str) -> int:
    model(path)
    return os.getpid()


# ------------------------------------------------------------------------------------------- the server side


@dataclass
class Job:
    """One submitted job, as the server sees it. `future` settles after the worker's last progress report was
    handled (the worker's "end" message), so an answer never lands before its own progress."""

    id: int
    inner: Future  # the pool's (or Dask's) future
    report: Callable[..., None] | None
    cancel_fn: Callable[[], None]
    wanted: Callable[[], bool] = lambda: True
    partial: Callable[[Any], None] | None = None
    future: Future = field(default_factory=Future)
    stopped_at: tuple | None = None  # set when the worker reported that it stopped (and its last report)
    cancelled: bool = False
    ended: bool = False  # the worker's "end" message arrived
    reports: int = 0
    grace: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def cancel(self) -> None:
        """Stop the job: a queued one never starts, a running one ends at its next check."""
        if not self.cancelled:
            self.cancelled = True
            self.inner.cancel()
            self.cancel_fn()

    def settle(self) -> None:
        """Copy the worker's outcome to `future` once it is in and (if the job ran) its messages are handled.
        Called from the pool's thread and the poller's; the lock makes one of them do it."""
        with self._lock:
            f = self.inner
            if self.future.done() or not f.done():
                return
            if f.cancelled():
                self.future.cancel()
                return
            exc = f.exception()
            if exc is None and not self.ended:
                return
            if exc is not None and not self.ended and not isinstance(exc, BrokenProcessPool) and not self.cancelled:
                return  # the job's own exception: its "end" message is on its way
            if not self.future.set_running_or_notify_cancel():  # the caller cancelled it meanwhile
                return
            if exc is None:
                self.future.set_result(f.result())
            else:
                self.future.set_exception(exc)


class Placement:
    """A pool of workers plus the thread that brings their progress back and forwards cancellations."""

    kind = "threads"

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._jobs: dict[int, Job] = {}
        self._lock = threading.Lock()
        self._poller: threading.Thread | None = None
        self.closed = False

    def submit(self, fn: Callable, args: tuple, report: Callable[..., None] | None = None,
               wanted: Callable[[], bool] = lambda: True, partial: Callable[[Any], None] | None = None) -> Job:
        raise NotImplementedError

    def _track(self, job: Job) -> Job:
        with self._lock:
            self._jobs[job.id] = job
        job.inner.add_done_callback(lambda _f: job.settle())
        if self._poller is None:
            self._poller = threading.Thread(target=self._poll, name=f"workbench-{self.kind}-poller", daemon=True)
            self._poller.start()
        return job

    def _poll(self) -> None:
        while not self.closed:
            try:
                    messages = self._get(POLL)
            except Exception as exc:  # the queue went away (shutdown)
                log.info("heavy work poller ends: %s", exc)
                return
            for msg in messages:
                self._handle(msg)
            with self._lock:
                jobs = list(self._jobs.values())
            # the server is stopping (its atexit handlers run): running jobs stop too, or the pool's exit waits on them
            stopping = getattr(threading, "_SHUTTING_DOWN", False) or getattr(_cf_process, "_global_shutdown", False)
            for job in jobs:
                if not job.cancelled and not job.inner.done() and (stopping or not job.wanted()):
                    job.cancel()
                if job.inner.done():  # messages may trail the answer: kept 5 s, settled at the latest then
                    job.grace += 1
                    if job.grace > 5 / POLL:
                        job.ended = True
                        job.settle()
                        with self._lock:
                            self._jobs.pop(job.id, None)

    def _handle(self, msg: tuple) -> None:
        job_id, kind, payload = msg
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            return
        if kind == "stopped":
            job.stopped_at = payload
            log.info("heavy job %d stopped in its worker after the report %s", job_id, payload[:2])
        elif kind == "end":
            job.ended = True
            job.settle()
        elif kind == "progress" and job.report is not None and not job.cancelled:
            job.reports += 1
            try:
                job.report(*payload)
            except Exception as exc:  # a cancelled ticket refuses progress: the worker hears at its next check
                log.debug("progress of job %d dropped: %s", job_id, exc)
        elif kind == "partial" and job.partial is not None and not job.cancelled:
            try:
                job.partial(payload)
            except Exception as exc:  # as progress
                log.debug("interim answer of job %d dropped: %s", job_id, exc)

    def _get(self, timeout: float) -> list:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True


class LocalPlacement(Placement):
    """A local ProcessPoolExecutor; see the module docstring."""

    kind = "processes"

    def __init__(self, processes: int, nice: int) -> None:
        super().__init__()
        method = "forkserver" if sys.platform.startswith("linux") else "spawn"
        ctx = mp.get_context(method)
        if method == "forkserver":
            ctx.set_forkserver_preload(["torch", "workbench.ui.why_view"])  # each worker starts with them imported
        self._queue = ctx.Queue()
        self._flags = ctx.RawArray("b", SLOTS)
        self.processes = processes
        self.pool = ProcessPoolExecutor(max_workers=processes, mp_context=ctx, initializer=_init_worker,
                                        initargs=(self._queue, self._flags, nice))
        # The pool starts its processes inside `pool.submit`, under its lock: the first one starts the forkserver,
        # which imports torch (seconds). Every call into the pool therefore runs in this one thread, in order, never
        # on the server's event loop (a first sweep had stalled every page for 6 s); `close` queues behind a start
        # still under way, so a server stopped meanwhile shuts the pool down only once its processes exist.
        self._calls = ThreadPoolExecutor(max_workers=1, thread_name_prefix="workbench-pool-calls")

    def submit(self, fn, args, report=None, wanted=lambda: True, partial=None) -> Job:
        job_id = next(self._ids)
        slot = job_id % SLOTS
        self._flags[slot] = 0

        def cancel() -> None:
            self._flags[slot] = 1

        return self._track(Job(job_id, self.pool_submit(_run_local, job_id, fn, args), report, cancel, wanted,
                               partial))

    def pool_submit(self, fn: Callable, *args: Any) -> Future:
        """`self.pool.submit(fn, *args)` without waiting for it: a future that follows the pool's once the call
        thread has made it (a cancel before then means the pool never sees the job)."""
        deferred = _Deferred()

        def call() -> None:
            if deferred.cancelled():  # cancelled while it waited for the call thread: the pool never sees it
                return
            try:
                deferred.attach(self.pool.submit(fn, *args))
            except BaseException as exc:  # a broken or shut-down pool: the job fails with it, as pool.submit would
                deferred.fail(exc)

        try:
            self._calls.submit(call)
        except RuntimeError as exc:  # closed: as the pool's own submit after shutdown
            deferred.fail(exc)
        return deferred

    def _get(self, timeout: float) -> list:
        try:
            messages = [self._queue.get(timeout=timeout)]
        except queue_mod.Empty:
            return []
        try:
            while len(messages) < 1000:
                messages.append(self._queue.get_nowait())
        except queue_mod.Empty:
            pass
        return messages

    def close(self) -> None:
        super().close()
        try:
            self._calls.submit(self.pool.shutdown, wait=False, cancel_futures=True)
            self._calls.shutdown(wait=False)
        except RuntimeError:  # closed twice
            pass


class DaskPlacement(Placement):
    """The same jobs on a Dask cluster (`distributed.Client(address)`); see the module docstring."""

    kind = "dask"

    def __init__(self, address, nice: int) -> None:
        from distributed import Client, Queue  # optional dependency: only with a Dask scheduler

        super().__init__()
        self.client = address if isinstance(address, Client) else Client(address, set_as_default=False)
        self.nice = nice
        self._queue_name = f"workbench-progress-{uuid.uuid4().hex}"
        self._queue = Queue(self._queue_name, client=self.client)

    def submit(self, fn, args, report=None, wanted=lambda: True, partial=None) -> Job:
        from distributed import Event  # optional dependency: only with a Dask scheduler

        job_id = next(self._ids)
        event_name = f"{self._queue_name}-cancel-{job_id}"
        event = Event(event_name, client=self.client)
        remote = self.client.submit(_run_dask, job_id, fn, args, self._queue_name, event_name, self.nice,
                                    pure=False, key=f"workbench-{fn.__name__}-{uuid.uuid4().hex}")
        inner: Future = Future()
        inner.set_running_or_notify_cancel()

        def landed(f) -> None:
            try:
                answer = f.result()
                if isinstance(answer, str) and answer == STOPPED:
                    inner.set_exception(Cancelled(f"job {job_id} stopped in its Dask worker"))
                else:
                    inner.set_result(answer)
            except BaseException as exc:  # the job's own exception, Cancelled included
                if not inner.done():
                    inner.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))

        remote.add_done_callback(landed)
        # Dask's own cancel does not stop a running task: the Event does, at the job's next check
        return self._track(Job(job_id, inner, report, event.set, wanted, partial))

    def _get(self, timeout: float) -> list:
        # No blocking get with a timeout: the scheduler logs every expired one as an error. All that is waiting, or
        # a pause.
        messages = self._queue.get(batch=True)
        if not messages:
            time.sleep(timeout)
        return list(messages)

    def close(self) -> None:
        super().close()
        self.client.close()


_PLACEMENT: Placement | None = None
_REFUSED = False
_LOCK = threading.Lock()


def placement() -> Placement | None:
    """This server process's placement, started on first use; None: heavy work stays in the server's threads."""
    global _PLACEMENT, _REFUSED
    with _LOCK:
        if _PLACEMENT is not None or _REFUSED:
            return _PLACEMENT
        try:
            if DASK:
                _PLACEMENT = DaskPlacement(DASK, HEAVY_NICE)
                log.info("heavy work runs on the Dask cluster at %s", DASK)
            elif PROCESSES > 0:
                _PLACEMENT = LocalPlacement(PROCESSES, HEAVY_NICE)
                log.info("heavy work runs in %d worker processes at nice %d", PROCESSES, HEAVY_NICE)
            else:
                _REFUSED = True
                log.info("heavy work runs in the server's threads (WORKBENCH_APP_HEAVY_PROCESSES=0)")
        except Exception as exc:
            _REFUSED = True
            log.warning("no worker pool (%s: %s): heavy work runs in the server's threads", type(exc).__name__, exc)
        return _PLACEMENT


def use(new: Placement | None) -> Placement | None:
    """Put `new` in place (None: the server's threads); returns the previous one (tests, the benchmark)."""
    global _PLACEMENT, _REFUSED
    with _LOCK:
        old, _PLACEMENT, _REFUSED = _PLACEMENT, new, new is None
    return old


def broken(exc: BaseException) -> None:
    """The pool failed (a worker died at start-up, BrokenProcessPool): from now on, the server's threads."""
    global _PLACEMENT, _REFUSED
    with _LOCK:
        old, _PLACEMENT, _REFUSED = _PLACEMENT, None, True
    log.warning("the worker pool broke (%s: %s): heavy work runs in the server's threads from now on",
                type(exc).__name__, exc)
    if old is not None:
        old.close()


def submit(fn: Callable, args: tuple, report: Callable[..., None] | None = None,
           wanted: Callable[[], bool] = lambda: True, partial: Callable[[Any], None] | None = None) -> Job | None:
    """`fn(*args)` in a worker; None when there is no pool (run it in the server's threads instead). `report`
    gets the job's `Progress` calls, `partial` its interim answers."""
    p = placement()
    return None if p is None else p.submit(fn, args, report, wanted, partial)


def warm(path: str) -> list[Future]:
    """Load the checkpoint in the local workers ahead of the first job (once per path; no-op without a local pool):
    one load job per worker, which spread over the workers as each takes a while. Returns their futures."""
    p = placement()
    if not isinstance(p, LocalPlacement) or path in _WARMED:
        return []
    _WARMED.add(path)
    return [p.pool_submit(_warm, path) for _ in range(p.processes)]


class _Deferred(Future):
    """A pool future before the pool has made it (`LocalPlacement.pool_submit`): it settles as the pool's does,
    and its `cancel` is the pool future's once there is one (a running job is not cancelled: its worker stops at
    its next check, as with the pool's own future)."""

    def __init__(self) -> None:
        super().__init__()
        self._gate = threading.Lock()
        self._pool_future: Future | None = None

    def cancel(self) -> bool:
        with self._gate:
            if self._pool_future is None:
                return self._cancel_here()
            pool_future = self._pool_future
        return pool_future.cancel()

    def attach(self, pool_future: Future) -> None:
        with self._gate:
            if super().cancelled():  # cancelled before the pool had it: it never runs
                pool_future.cancel()
            self._pool_future = pool_future
        pool_future.add_done_callback(self._follow)

    def fail(self, exc: BaseException) -> None:
        with self._gate:
            if self.set_running_or_notify_cancel():
                self.set_exception(exc)

    def _cancel_here(self) -> bool:
        """Cancel this future and tell its waiters (`concurrent.futures.wait`) at once, as a pool does when it
        drops a cancelled job."""
        if not super().cancel():
            return False
        self.set_running_or_notify_cancel()
        return True

    def _follow(self, pool_future: Future) -> None:
        with self._gate:
            if self.done():  # cancelled before the pool had it (the pool may have started it anyway), or failed:
                return  # its waiters were told then (a second notice raised "Future in unexpected state")
            if pool_future.cancelled():
                self._cancel_here()
                return
            running = self.set_running_or_notify_cancel()
        if running:
            exc = pool_future.exception()
            if exc is None:
                self.set_result(pool_future.result())
            else:
                self.set_exception(exc)


_WARMED: set[str] = set()


def _takes_ticket(fn: Callable[..., Any]) -> bool:
    try:
        return "ticket" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False

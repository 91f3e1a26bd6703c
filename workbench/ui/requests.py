"""The app's one request path: every job a page starts goes through a `Lane` of its session's `Requests`.

    requests = Requests(background=True)          # one per page (the session owns it)
    lane = requests.lane("translate")             # interactive: translation, trace, selection-driven work
    sweep = requests.lane("why", heavy=True)      # analysis work: its own threads, one at a time per page
    lane.submit(work, request, done=show, failed=show_error, progress=show_progress)

`work(request, ticket=...)` runs off the event loop (inline in notebooks and tests); a work function that
takes a `ticket` parameter gets the job's `Ticket`: `ticket.check()` between batches stops a job that is no
longer wanted, `ticket.report(done, total, what)` sends progress to the page (the project's one progress shape,
`core.protocols.Progress`), and `ticket.partial(answer)` an answer to show before the final one (the Why tab's
estimate while its exact sweep runs). The rules, each tested in
tests/ui/test_requests.py:

- **Generations.** A submit supersedes the lane's previous job: its answer, its error and its progress are
  dropped, whenever they arrive. A queued job that was superseded never starts.
- **Cancellation.** A superseded job, a job of a closed page (`Requests.close`, on session destroyed) and a
  stopped one (`Lane.cancel`, the Stop button) end at their next `ticket.check()` with `Cancelled`.
- **Context.** The job runs in a copy of the caller's contextvars (hooks and interventions entered around the
  change apply in the worker; Panel's current document comes along).
- **On the loop, under the lock.** Answers and progress are applied on the event loop, in the page's
  document lock (a Bokeh next-tick callback of that document when served), never from the worker thread
  and never for a closed page. Views may still be under construction when an answer lands: whatever they
  read from the store when they render is the answer's state, so nothing is lost.
- **No user stalls another.** Interactive lanes run in `INTERACTIVE`; heavy lanes in `HEAVY`, whose threads
  run at a lower OS scheduling priority (nice 10), so a translation gets the CPU first.
  A page has at most one heavy job: a new heavy submit stops the page's running one (its lane is told).
- **Out of the server's interpreter.** A heavy submit with `offload=True` (a module-level function, picklable
  arguments) runs in a worker process (`workers.py`: a local pool, or Dask), its ticket's `check()`/`report()`
  crossing over; every rule above holds for it (tests/ui/test_workers.py). Without a pool, it runs in HEAVY.
  A tab whose `compute` is `work.Offloaded(fn)` (Graph, Evidence, Features, Model analysis) is offloaded so: `fn`
  gets the tab's inputs (a `work.Snapshot` of the page's result, never its model).
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread as _cf_thread
import contextvars
import inspect
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Any

import panel as pn
from panel.io.state import set_curdoc

from ..core.protocols import Progress
from . import work, workers
from .workers import (  # Cancelled: the job is no longer wanted (`Ticket.check`, here or in a worker)
    HEAVY_NICE,
    Cancelled,
)

log = logging.getLogger(__name__)


def _lower_priority() -> None:
    """Worker initializer for HEAVY: this thread at a lower scheduling priority (Linux: nice is per thread).

    Nice 10: a translation thread (nice 0) gets ~90 % of a contended core; 19 starved the sweeps entirely on a
    machine other jobs kept busy (0 sites patched in 12 s windows, benchmarks/bench_app.py --contention)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HEAVY_NICE)
    except (AttributeError, OSError):  # not Linux, or not permitted: the separate queue still holds
        pass


# A heavy job's progress is shown at most this often (seconds; its first and last report always): each shown report
# is a message to the page, written on the event loop every page shares (the Graph and Why tabs).
PROGRESS_EVERY = 0.25

# Two workers each: the machine this targets has 2 cores and every model call uses one intra-op thread
# (loader.configure_torch_threads). Separate pools so a translation never queues behind a patching sweep.
INTERACTIVE = ThreadPoolExecutor(max_workers=int(os.environ.get("WORKBENCH_APP_WORKERS", "2")),
                                 thread_name_prefix="workbench-ui")
HEAVY = ThreadPoolExecutor(max_workers=int(os.environ.get("WORKBENCH_APP_HEAVY_WORKERS", "2")),
                           thread_name_prefix="workbench-heavy", initializer=_lower_priority)


class Ticket:
    """What a running job sees of its request: whether it is still wanted, and where its progress and interim
    answers go."""

    def __init__(self, lane: Lane, generation: int, report: Progress | None,
                 partial: Callable[[Any], None] | None = None):
        self._lane = lane
        self.generation = generation
        self._report = report
        self._partial = partial
        self.stopped = False  # set by another heavy job of the page, or the Stop button

    @property
    def cancelled(self) -> bool:
        # The interpreter is shutting down (the server was stopped) once concurrent.futures starts joining its
        # workers: a running sweep stops at its next batch instead of holding the process until it ends. (Its
        # private shutdown flags, threading's and concurrent.futures', are the only signals set before it.)
        return (self.stopped or self._lane.generation != self.generation or self._lane.requests.closed
                or getattr(threading, "_SHUTTING_DOWN", False) or getattr(_cf_thread, "_shutdown", False))

    def check(self) -> None:
        """Raise `Cancelled` when the job is no longer wanted: call it between batches."""
        if self.cancelled:
            raise Cancelled(f"{self._lane.name} job {self.generation} is no longer wanted")

    def report(self, done: int, total: int, what: str = "") -> None:
        """Progress for the page, a `Progress` call (applied on the event loop while this job is current); also a
        check."""
        self.check()
        if self._report is not None:
            self._lane.requests._deliver(self, self._report, (done, total, what))

    def partial(self, answer: Any) -> None:
        """An answer to show while the job goes on (applied on the event loop while this job is current); also a
        check."""
        self.check()
        if self._partial is not None:
            self._lane.requests._deliver(self, self._partial, (answer,))


class Lane:
    """One stream of requests whose latest one alone counts (the translation; one tab's content)."""

    def __init__(self, requests: Requests, name: str, heavy: bool):
        self.requests = requests
        self.name = name
        self.heavy = heavy
        self.generation = 0
        self._ticket: Ticket | None = None
        self._future: Future | None = None
        self._job: workers.Job | None = None
        self._stopped: Callable[[], None] | None = None

    @property
    def busy(self) -> bool:
        return self._ticket is not None

    def submit(self, fn: Callable[..., Any], *args: Any, done: Callable[[Any], None],
               failed: Callable[[Exception], None] | None = None, progress: Progress | None = None,
               stopped: Callable[[], None] | None = None, offload: bool = False,
               interim: Callable[[Any], None] | None = None) -> Ticket:
        """Run `fn(*args)` (with `ticket=` if it takes one) for this lane, superseding its previous job.

        `done(answer)` or `failed(exc)` follow on the event loop if the job is still current; `stopped()` when
        another heavy job of the page stopped this one (not when this lane superseded or cancelled it).
        `progress(done, total, what)` and `interim(answer)` get the job's reports and interim answers there too.
        `offload` (heavy lanes): `fn` is a module-level function and `args` pickle, so when served the job runs in
        a worker process (`workers.py`), its ticket's checks and reports crossing over; without a pool, in HEAVY."""
        if isinstance(fn, work.Offloaded):  # a tab's `compute = Offloaded(fn)`: fn is a module-level function
            fn, offload = fn.fn, True
        self.cancel()
        self.generation += 1
        ticket = Ticket(self, self.generation, progress, interim)
        self._ticket, self._stopped = ticket, stopped
        if self.heavy:
            self.requests._take_heavy(self, ticket)
        call = partial(fn, *args, ticket=ticket) if _takes_ticket(fn) else partial(fn, *args)
        if self.requests.closed:
            return ticket
        if not self.requests.background:
            try:
                answer = call()
            except Cancelled:
                return ticket
            except Exception as exc:
                self._finish(ticket, done, failed, None, exc)
            else:
                self._finish(ticket, done, failed, answer, None)
            return ticket
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        self.requests._remember(loop, ctx)
        if offload and self.heavy:
            job = workers.submit(fn, args, report=ticket.report, wanted=lambda: not ticket.cancelled,
                                 partial=ticket.partial)
            if job is not None:
                self._job, self._future = job, job.future
                job.future.add_done_callback(partial(self._landed, ticket, done, failed, call, ctx))
                return ticket
        pool = HEAVY if self.heavy else INTERACTIVE
        self._future = future = pool.submit(ctx.copy().run, _guarded, ticket, call)
        future.add_done_callback(partial(self._landed, ticket, done, failed, None, ctx))
        return ticket

    def _landed(self, ticket: Ticket, done, failed, rerun, ctx, f: Future) -> None:
        """A worker's future is done (any thread): hand its answer to the loop if the job is still current."""
        if f.cancelled() or ticket.cancelled:
            return
        exc = f.exception()
        if isinstance(exc, Cancelled):
            return
        if isinstance(exc, BrokenProcessPool) and rerun is not None and ticket is self._ticket:
            workers.broken(exc)  # a worker died (at start-up, or killed): this job and the next ones in threads
            self._job = None
            self._future = future = HEAVY.submit(ctx.copy().run, _guarded, ticket, rerun)
            future.add_done_callback(partial(self._landed, ticket, done, failed, None, ctx))
            return
        answer = None if exc is not None else f.result()
        self.requests._deliver(ticket, lambda: self._finish(ticket, done, failed, answer, exc), ())

    def cancel(self) -> None:
        """Drop the current job: a queued one never starts, a running one stops at its next check."""
        if self._ticket is not None:
            self.generation += 1
            if self._future is not None:
                self._future.cancel()
            if self._job is not None:
                self._job.cancel()
        self._ticket = self._future = self._job = None
        self._stopped = None
        self.requests._release_heavy(self)

    def _stop_for_another(self) -> None:
        """Another heavy job of the page took over: stop this one and tell the lane's owner."""
        ticket, stopped = self._ticket, self._stopped
        if ticket is None:
            return
        ticket.stopped = True
        if self._future is not None:
            self._future.cancel()
        if self._job is not None:
            self._job.cancel()
        self._ticket = self._future = self._job = None
        self._stopped = None
        if stopped is not None:
            self.requests._deliver(None, stopped, ())

    def _finish(self, ticket: Ticket, done, failed, answer, exc) -> None:
        """On the loop (under the document lock when served): apply the answer if the job is still current."""
        if ticket.cancelled or ticket is not self._ticket:
            return
        self._ticket = self._future = self._job = None
        self._stopped = None
        self.requests._release_heavy(self)
        if exc is None:
            try:
                done(answer)
                return
            except Exception as e:  # a view failing to update is a message on the page, not a server traceback
                log.warning("%s: updating the page failed: %s: %s", self.name, type(e).__name__, e)
                exc = e
        if failed is not None:
            failed(exc)
        else:
            log.warning("%s failed: %s: %s", self.name, type(exc).__name__, exc)


class Requests:
    """The request path of one page: its lanes, its heavy job, and whether the page is still open."""

    def __init__(self, background: bool = False):
        self.background = background
        self.closed = False
        self._lanes: dict[str, Lane] = {}
        self._heavy: Lane | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ctx: contextvars.Context | None = None
        self._doc = None

    def lane(self, name: str, *, heavy: bool = False) -> Lane:
        """The lane called `name` (created on first use; `heavy` work runs in HEAVY, one at a time per page)."""
        if name not in self._lanes:
            self._lanes[name] = Lane(self, name, heavy)
        return self._lanes[name]

    @property
    def heavy_lane(self) -> Lane | None:
        """The lane whose heavy job is running now, if any."""
        return self._heavy

    def close(self) -> None:
        """The page is gone: every job stops at its next check and nothing more is applied."""
        self.closed = True
        self.stop_all()

    def stop_all(self) -> None:
        """Every lane's job stops at its next check (the page's connection was lost: Bokeh destroys its session only
        after the unused-session lifetime, seconds later); a later request of the page still runs."""
        for lane in self._lanes.values():
            lane.cancel()

    # -- internals ------------------------------------------------------------------------------
    def _take_heavy(self, lane: Lane, ticket: Ticket) -> None:
        if self._heavy is not None and self._heavy is not lane:
            self._heavy._stop_for_another()
        self._heavy = lane

    def _release_heavy(self, lane: Lane) -> None:
        if self._heavy is lane:
            self._heavy = None

    def _remember(self, loop: asyncio.AbstractEventLoop, ctx: contextvars.Context) -> None:
        self._loop, self._ctx = loop, ctx
        doc = pn.state.curdoc
        self._doc = doc if doc is not None and doc.session_context is not None else None

    def _deliver(self, ticket: Ticket | None, fn: Callable[..., None], args: tuple) -> None:
        """Run fn(*args) on the event loop (under the page's document lock when served) if still wanted."""

        def apply() -> None:
            if self.closed or (ticket is not None and ticket.cancelled):
                return
            fn(*args)

        if not self.background or self._loop is None:
            apply()
            return
        if _on_loop(self._loop):
            self._on_loop(apply)
            return
        self._loop.call_soon_threadsafe(self._on_loop, apply, context=self._ctx)

    def _on_loop(self, apply: Callable[[], None]) -> None:
        doc = self._doc
        if doc is None:
            apply()
            return
        if self.closed:
            return
        with set_curdoc(doc):
            if not pn.state.loaded:
                # The page's websocket is not open yet: Panel would hold the model changes and replay them at
                # connection, a window in which about 1 load in 10 lost the attention view (issue 28). Applied
                # once the page has loaded instead, in its on-load callbacks (document lock held).
                pn.state.onload(apply)
                return
        try:
            # A next-tick callback runs with the document's lock held; Panel then writes model changes directly.
            doc.add_next_tick_callback(pn.state._handle_exception_wrapper(apply, doc))
        except Exception as exc:  # the session was destroyed between the check and the call
            log.info("page closed before an answer could be applied: %s", exc)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _guarded(ticket: Ticket, call: Callable[[], Any]) -> Any:
    ticket.check()  # superseded while queued: never starts
    return call()


def _takes_ticket(fn: Callable[..., Any]) -> bool:
    try:
        return "ticket" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False

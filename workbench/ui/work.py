"""The model work behind one request, and where it runs.

`compute(Request)` is a pure function of a frozen request: it loads the (cached) model and calls the
library (`TranslationModel.score`, `decoding.generate`, `analysis.ablation.ablation_effect`); it never raises,
so a failing request becomes a message. `run()` calls any such function inline (tests, notebooks without a
server) or in the process's worker threads with the caller's contextvars (hooks, interventions) copied in,
and hands the answer back on the event loop, so a model call never blocks the server for other sessions.
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis.ablation import AblationEffect, ablation_effect
from ..core.hooks import submit
from ..core.trace import Trace
from ..decoding.search import generate
from . import loader

log = logging.getLogger(__name__)

MAX_CHARS = 5000  # longer input is cut here (the model's max_positions cuts tokens after that)


@dataclass(frozen=True)
class Request:
    """Everything a model run depends on; equal requests give equal results."""

    path: str
    sentence: str
    target: str = ""
    beam: int = 1
    alpha: float = 1.0
    ablate: tuple[tuple[str, int, int], ...] = ()
    target_ids: tuple[int, ...] = ()
    """Teacher-force these output ids (EOS-terminated) instead of `target` (comparing models that share a vocab)."""

    @property
    def translate_key(self) -> tuple:
        return (self.path, self.sentence, self.target, self.beam, self.alpha, self.target_ids)


@dataclass(frozen=True)
class Result:
    """One sentence's translation (or teacher-forced target) with its attention, compact and CPU-only."""

    request: Request
    text: str
    src_pieces: tuple[str, ...]
    out_pieces: tuple[str, ...]
    out_ids: tuple[int, ...]
    src_ids: tuple[int, ...]
    log_prob: float
    trace: Trace
    forced: bool = False
    notes: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def n_tokens(self) -> int:
        return len(self.out_pieces)

    def depth(self, kind: str) -> int:
        return self.trace.layers(kind)

    def n_heads(self, kind: str) -> int:
        return self.trace.attention(kind, 0).size(1) if self.depth(kind) else 0

    def queries(self, kind: str) -> tuple[str, ...]:
        """The query tokens of an attention kind (cross-attention rows are named by the token produced)."""
        return self.src_pieces if kind == "enc_self" else self.out_pieces


Ablation = AblationEffect


@dataclass
class Outcome:
    result: Result | None = None
    ablation: Ablation | None = None
    error: str = ""
    notes: list[str] = field(default_factory=list)


def compute(req: Request, previous: Result | None = None) -> Outcome:
    """The model work of one request; never raises (errors become `Outcome.error`, logged without traceback)."""
    out = Outcome()
    try:
        tm = loader.load_model(req.path)
    except Exception as exc:  # a corrupt or unreadable checkpoint must not take the page down
        log.warning("cannot load checkpoint %s: %s", req.path, exc)
        out.error = f"Cannot load this checkpoint: {exc}"
        return out
    try:
        if previous is not None and previous.request.translate_key == req.translate_key:
            out.result = previous
        else:
            out.result = translate(tm, req)
        if out.result is not None and req.ablate:
            r = out.result
            out.ablation = ablation_effect(tm, r.src_ids, r.out_ids, req.ablate, beam=req.beam, alpha=req.alpha)
    except Exception as exc:
        log.warning("model run failed for %r: %s: %s", req.sentence[:80], type(exc).__name__, exc)
        out.error = f"The model could not process this input ({type(exc).__name__}: {exc})"
    return out


def source_ids(tm, sentence: str) -> tuple[list[int], list[str]]:
    """The sentence's source ids and notes on what was cut (characters, then the model's max_positions)."""
    notes = []
    text = sentence
    if len(text) > MAX_CHARS:
        notes.append(f"The sentence has {len(text):,} characters; only the first {MAX_CHARS:,} were used.")
        text = text[:MAX_CHARS]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids, cut = tm.encode_source(text, where="the sentence")
    if cut:
        notes.append(f"The sentence was cut to the model's limit of {tm.model.cfg.max_positions - 1} source tokens.")
    else:
        notes.extend(str(w.message) for w in caught)
    return ids, notes


def translate(tm, req: Request) -> Result | None:
    """Translate (or teacher-force the target of) one request, keeping its attention as float16 on the CPU."""
    start = time.perf_counter()
    src_ids, notes = source_ids(tm, req.sentence)
    if not src_ids:
        return None
    forced = bool(req.target_ids or req.target.strip())
    if forced:
        out_ids = list(req.target_ids)
        if not out_ids:
            out_ids, target_notes = _target_ids(tm, req.target)
            notes += target_notes
        scored = tm.score(src_ids, out_ids, trace=True)
        log_prob, trace = scored.log_prob, scored.trace
    else:
        src = torch.tensor([src_ids], dtype=torch.long, device=tm.device)
        with torch.no_grad():
            gen = generate(tm.model, src, tm.config_with(beam=req.beam, alpha=req.alpha, n_best=1), trace=True)
        best = gen.hypotheses[0][0]
        out_ids, log_prob, trace = list(best.tokens), float(best.log_prob), gen.traces[0]
    cfg = tm.model.cfg
    src_pieces = tm.src_tokenizer.pieces(src_ids)
    out_pieces = tm.tgt_tokenizer.pieces(out_ids)
    # float16 on CPU: a 200-token sentence through a 6+6-layer, 8-head model stays ~10 MB per session.
    compact = trace.to("cpu", torch.float16)
    compact.meta.update(src_pieces=src_pieces, tgt_pieces=tm.tgt_tokenizer.pieces([cfg.start_id, *out_ids[:-1]]),
                        out_pieces=out_pieces, pad_id=cfg.pad_id, eos_id=cfg.eos_id)
    return Result(req, tm.detokenize(out_ids), tuple(src_pieces), tuple(out_pieces), tuple(out_ids), tuple(src_ids),
                  log_prob, compact, forced, tuple(notes), time.perf_counter() - start)


def _target_ids(tm, target: str) -> tuple[list[int], list[str]]:
    notes = []
    ids = tm.tgt_tokenizer.encode(target[:MAX_CHARS])
    room = tm.model.cfg.max_positions - 1
    if len(ids) > room:
        notes.append(f"The target was cut to the model's limit of {room} tokens.")
        ids = ids[:room]
    return ids + [tm.model.cfg.eos_id], notes


# ------------------------------------------------------------------------------------------ where it runs


class Job:
    """One submitted call; `cancel()` stops it if still queued and drops its answer either way."""

    def __init__(self, future=None):
        self._future = future
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        if self._future is not None:
            self._future.cancel()


def run(fn: Callable[..., Any], *args: Any, background: bool, done: Callable[[Any], None],
        failed: Callable[[Exception], None]) -> Job:
    """Call fn(*args), then done(answer) or failed(exception), both on the caller's thread.

    background=False: now, inline. background=True: in a worker thread with a copy of the caller's contextvars
    (so hooks and interventions entered around the call apply there too); the answer comes back as a task on
    the running event loop, never blocking it.
    """
    if not background:
        try:
            answer = fn(*args)
        except Exception as exc:
            failed(exc)
        else:
            done(answer)
        return Job()
    future = submit(loader.EXECUTOR, fn, *args)  # the caller's hooks come along (hooks.submit)
    job = Job(future)

    async def finish():
        try:
            answer = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            return
        except Exception as exc:
            if not job.cancelled:
                failed(exc)
            return
        if job.cancelled:
            return
        try:
            done(answer)
        except Exception as exc:  # a view failing to update must not end up as a traceback in the server log
            log.warning("updating the page failed: %s: %s", type(exc).__name__, exc)
            failed(exc)

    asyncio.ensure_future(finish())
    return job

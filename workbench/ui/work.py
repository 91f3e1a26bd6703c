"""The model work behind one page request: a pure function of a frozen `Request` and a `TranslationModel`.

`compute(Request)` gets the (cached) model and calls the library: `TranslationModel.trace` (a sentence in,
translation + trace + notes out) and `analysis.ablation.ablation_effect`; it never raises, so a failing request
becomes a message. Where it runs (inline, or off the event loop) is `requests.Lane.submit`'s business.

Heavy work of the analysis tabs (graphs, evidence, feature dashboards; the Why tab's sweeps) gets a `Snapshot` of
the page's `Result` instead (small, picklable: the worker process loads the model from its path, `model(path)`), and
a tab names such work as its `compute` with `Offloaded(fn)`: the request path then runs `fn` in a worker process
(`workers.py`) rather than in the server's interpreter.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis.circuits.ablation import AblationEffect, ablation_effect
from ..analysis.training_dynamics.confidence import Familiarity, checkpoint_confidence, source_hints
from ..charts.compare import compare_blocks
from ..core.heads import Head
from ..core.model import evaluating
from ..core.trace import Trace
from ..decoding.translator import Translation, TranslationModel
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
    ablate: tuple[Head, ...] = ()
    target_ids: tuple[int, ...] = ()
    """Teacher-force these output ids (EOS-terminated) instead of `target` (comparing models that share a vocab)."""

    @property
    def translate_key(self) -> tuple:
        return (self.path, self.sentence, self.target, self.beam, self.alpha, self.target_ids)


@dataclass(frozen=True)
class Result:
    """What the page keeps of one request: the library's `Translation`, its trace compacted to float16 on the
    CPU, the notes the page adds (input cut to MAX_CHARS), the time it took, and the model that made it (the
    store hands it to the views, so no view turns a path back into a model)."""

    request: Request
    translation: Translation
    trace: Trace
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    model: TranslationModel | None = field(default=None, compare=False, repr=False)
    hints_pending: bool = False
    """Made while its checkpoint's yardstick was being measured: its wrong-language hint, if one applies, comes
    later (`pending_hints`)."""

    @property
    def text(self) -> str:
        return self.translation.text

    @property
    def log_prob(self) -> float:
        return self.translation.log_prob

    @property
    def forced(self) -> bool:
        return self.translation.forced

    @property
    def src_ids(self) -> tuple[int, ...]:
        return tuple(self.translation.source_tokens)

    @property
    def out_ids(self) -> tuple[int, ...]:
        return tuple(self.translation.tokens)

    @property
    def src_pieces(self) -> tuple[str, ...]:
        return tuple(self.trace.meta["src_pieces"])

    @property
    def out_pieces(self) -> tuple[str, ...]:
        return tuple(self.translation.pieces)

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


def model(path: str) -> TranslationModel:
    """The checkpoint at `path`, loaded once per process: the page's store in the server, and the model cache of a
    worker process that runs heavy jobs (`workers.py`), which get a path, never a model."""
    return loader.load_model(str(path))


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
            out.notes += pending_hints(previous)  # the hint that arrived after it was made
        else:
            out.result = translate(tm, req)
        if out.result is not None and req.ablate:
            r = out.result
            out.ablation = ablation_effect(tm, r.src_ids, r.out_ids, req.ablate, beam=req.beam, alpha=req.alpha)
    except Exception as exc:
        log.warning("model run failed for %r: %s: %s", req.sentence[:80], type(exc).__name__, exc)
        out.error = f"The model could not process this input ({type(exc).__name__}: {exc})"
    return out


def translate(tm: TranslationModel, req: Request) -> Result | None:
    """`tm.trace` of one request (translation, or teacher-forced target), its attention as float16 on the CPU."""
    start = time.perf_counter()
    notes = []
    text = req.sentence
    if len(text) > MAX_CHARS:
        notes.append(f"The sentence has {len(text):,} characters; only the first {MAX_CHARS:,} were used.")
        text = text[:MAX_CHARS]
    target = list(req.target_ids) or (req.target[:MAX_CHARS] if req.target.strip() else None)
    t = tm.trace(text, target=target, beam=req.beam, alpha=req.alpha, n_best=1)
    if t.trace is None:
        return None
    cfg = tm.model.cfg
    # float16 on CPU: a 200-token sentence through a 6+6-layer, 8-head model stays ~10 MB per session.
    compact = t.trace.to("cpu", torch.float16)
    compact.meta.update(pad_id=cfg.pad_id, eos_id=cfg.eos_id)
    t.trace = None  # the page keeps the compact copy only
    known = loader.familiarity_of(str(req.path), tm)
    notes += source_notes(text, t, known)
    pending = known is None and loader.measuring_familiarity(str(req.path))
    return Result(req, t, compact, tuple(notes + t.notes), time.perf_counter() - start, tm, pending)


def source_notes(text: str, t: Translation, known: Familiarity | None) -> list[str]:
    """`source_hints` for translation `t` of `text` (a given, teacher-forced output has no confidence to judge)."""
    mean_log_prob = None if t.forced or not t.tokens else t.log_prob / len(t.tokens)
    return source_hints(text, mean_log_prob, known)


HINT_WAIT_S = 300.0  # a bound, not a goal: a large checkpoint's yardstick on a busy machine


def pending_hints(r: Result, wait: float = 0.0) -> list[str]:
    """The hints answer `r` went without (`Result.hints_pending`), once its checkpoint's yardstick is measured
    (waiting up to `wait` seconds for it); [] when none applies or the yardstick never comes.

    Why late rather than first: measuring the yardstick before the first answer would hold the first page for
    ~40 greedy translations: 2.6 s for the default checkpoint (general-en-de) on one core, 14 times its first
    translation (0.18 s); 0.4 s for the Multi30k one. Shipping it in the checkpoint would spare that (and serve
    machines without the validation text), but every trainer, averager and importer would have to write it and
    keep it in step with the weights, and a stale number would go unnoticed. So the answer comes at once and its
    hint follows when the yardstick does (the `Workbench` adds it to the page's notes; an answer that reuses `r`,
    an ablation, carries it)."""
    if not r.hints_pending or r.model is None:
        return []
    known = loader.wait_familiarity(str(r.request.path), r.model, wait)
    return [h for h in source_notes(r.request.sentence[:MAX_CHARS], r.translation, known) if h not in r.notes]


def confidence(tm: TranslationModel, sentences: int):
    """(`Confidence`, data name) of model `tm` on its own validation text (its first `sentences`), or why it could not
    be measured: the Internals tab's label-smoothing view. Once per checkpoint and process, shared by every page
    (`loader.load_derived`, evicted with the model); a failure is kept, not retried."""

    def measure():
        try:
            return checkpoint_confidence(tm, limit=sentences)
        except Exception as exc:  # no validation text beside this checkpoint: said on the page
            return exc

    return loader.load_derived("confidence", tm, measure, sentences)


def encoder_input(tm: TranslationModel, src_ids: Sequence[int]) -> dict[str, Any]:
    """The source as the encoder receives it, read at the model's own hook points (`enc` stream): each token's
    embedding times its scale (`hook_tok`), its position's encoding (`hook_pos`) and the encoder's input
    (`hook_embed`: their sum, after the embedding norm where the model has one), each (S, d) float32 numpy, with
    the scale and whether a norm follows the sum. The embedding step alone (`embed_source`), no encoder layer."""
    model = tm.model
    enc = model.stream("enc")
    names = {"tok": enc.hook_tok.name, "pos": enc.hook_pos.name, "embed": enc.hook_embed.name}
    src = torch.tensor([list(src_ids)], device=tm.device)
    got: dict[str, torch.Tensor] = {}

    def keep(x: torch.Tensor, hook) -> None:
        got[hook.name] = x.detach()

    with torch.no_grad(), evaluating(model), model.hooks({name: keep for name in names.values()}):
        model.embed_source(src)
    n, d = src.size(1), model.cfg.d_model
    out = {k: got[name].float().reshape(-1, d)[-n:].cpu().numpy() for k, name in names.items()}
    return {**out, "scale": float(model.embed_scale), "normed": enc.emb_norm is not None}


def measured_confidence(r: Snapshot, sentences: int):
    """The Internals tab's heavy work: `confidence` of the page's checkpoint (its model loaded where this runs: a
    worker process when the server has a pool), cached there as everywhere."""
    return confidence(r.model, sentences)


def read_by(r: Result | Snapshot, path: str) -> Result:
    """A's output (result `r`, or its `Snapshot`) as checkpoint `path` reads it, teacher-forced: the Compare tab's B.
    B reads A's exact pieces when both share a target vocabulary (so the rows line up one to one), else A's text in
    its own pieces. B comes from this process's checkpoint cache (`loader.load_model`)."""
    tm = loader.load_model(path)
    try:
        same_vocab = tm.tgt_tokenizer.pieces(list(r.out_ids)) == list(r.out_pieces)
    except Exception:  # noqa: BLE001 - an id beyond B's vocabulary (sentencepiece raises its own error types)
        same_vocab = False
    b = translate(tm, Request(str(tm.meta.get("path", path)), r.request.sentence, target=r.text or r.request.target
                              or ".", target_ids=tuple(r.out_ids) if same_vocab else ()))
    if b is None:
        raise ValueError("checkpoint B produced no result for this sentence")
    return b


def compare_reading(a: Snapshot, trace_a: Trace, path_b: str, kind: str, layer: int, head: int, words: bool) -> dict:
    """The Compare tab's numbers: checkpoint `path_b` reads A's output (`read_by`), and the block of A's `trace_a`
    and of B's trace that the tab draws (B's deepest layer if it has fewer; all heads if it lacks A's head), on one
    token grid. A module-level function of picklable arguments, answering in numbers and tokens (`Attention`s and
    B's log-probability), so the tab runs it as `Offloaded` work in a worker process and draws it on the page."""
    b = read_by(a, path_b)
    heads = None if head < 0 else head
    att_a, att_b = compare_blocks(
        trace_a, b.trace, kind, layer, heads, layer_b=min(layer, b.depth(kind) - 1),
        heads_b=None if heads is None or heads >= b.n_heads(kind) else heads, words=words,
        # cross-attention rows are named by the token each step produced (the alignment reading)
        select_a={"tgt_tokens": list(a.out_pieces)} if kind == "cross" else {},
        select_b={"tgt_tokens": list(b.out_pieces)} if kind == "cross" else {})
    return {"a": att_a, "b": att_b, "log_prob_b": b.log_prob}


@dataclass(frozen=True)
class Snapshot:
    """What heavy work reads of a page's `Result` (its request, text, ids and pieces), small and picklable: a worker
    process gets this and loads the model from the request's path itself (`model`, once per process); in the
    server's process the result's own model comes along (never pickled). The analyses take it where they take a
    `Result`."""

    request: Request
    text: str
    src_ids: tuple[int, ...]
    out_ids: tuple[int, ...]
    src_pieces: tuple[str, ...]
    out_pieces: tuple[str, ...]
    tm: TranslationModel | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, r: Result) -> Snapshot:
        return cls(r.request, r.text, r.src_ids, r.out_ids, r.src_pieces, r.out_pieces, r.model)

    @property
    def model(self) -> TranslationModel:
        return self.tm if self.tm is not None else model(str(self.request.path))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "tm": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


@dataclass(frozen=True)
class Offloaded:
    """A tab's heavy work as `compute = Offloaded(fn)`: `fn` is a module-level function of picklable arguments
    (a `Snapshot`, never a model), so `requests.Lane.submit` runs it in a worker process when the server has a pool
    (in the server's heavy threads otherwise, or inline in notebooks and tests: called like `fn`)."""

    fn: Callable[..., Any]

    def __call__(self, *args: Any, ticket: Any = None) -> Any:
        if ticket is not None and "ticket" in inspect.signature(self.fn).parameters:
            return self.fn(*args, ticket=ticket)
        return self.fn(*args)

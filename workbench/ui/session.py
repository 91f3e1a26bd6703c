"""The per-session store: what one browser tab (or notebook) is looking at, and the results derived from it.

Inputs are params (checkpoint label, sentence, decoding settings, optional target, selection, ablated
heads); outputs are params too (`result`, `ablation`, `message`, `busy`), set only by `_apply` on the
session's own thread. Model work is a pure function of a frozen `Request` (`compute`), so it can run
inline (tests, notebooks without a server) or in the process's worker threads (`background=True`, the
served app) with the same code. Every request carries a generation number: a result that comes back
after a newer request was made is dropped, and a queued stale request is cancelled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import param
import torch

from ..decoding import generate
from ..heads import KINDS, Head
from ..hooks import submit
from ..interventions import ablate_heads
from ..trace import Trace
from ..translator import decode_config_from_meta
from . import loader

log = logging.getLogger(__name__)

VIEWS = ("heatmap", "lines", "grid")
MAX_CHARS = 5000  # longer input is cut here (the model's max_positions cuts tokens after that)
EXAMPLES = {  # the first sentence shown, in the checkpoint's source language
    "en": "The animal didn't cross the street because it was too tired.",
    "de": "Ein Mann mit einem orangefarbenen Hut starrt auf etwas.",
    "fr": "L'animal n'a pas traversé la rue parce qu'il était trop fatigué.",
}
EXAMPLE = EXAMPLES["de"]


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
    log_prob: float
    trace: Trace
    forced: bool = False
    notes: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def n_tokens(self) -> int:
        return len(self.out_pieces)


@dataclass(frozen=True)
class Ablation:
    """The same request with heads zeroed: its own output, and the original output's new log-probability."""

    heads: tuple[tuple[str, int, int], ...]
    text: str
    log_prob: float
    """Log-probability of the ablated model's own output."""
    original_log_prob: float
    """Log-probability the ablated model gives the ORIGINAL output (or forced target)."""
    delta: float
    """original_log_prob minus the unablated model's log-probability of that same output."""


@dataclass
class Outcome:
    result: Result | None = None
    ablation: Ablation | None = None
    error: str = ""
    notes: list[str] = field(default_factory=list)


def parse_head(spec: str) -> tuple[str, int, int]:
    """'cross:1:2' -> ('cross', 1, 2); a clear ValueError otherwise."""
    return tuple(Head.parse(str(spec)))  # type: ignore[return-value]


def head_label(kind: str, layer: int, head: int) -> str:
    return str(Head(kind, layer, head))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ model work


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
            out.result = _translate(tm, req)
        if out.result is not None and req.ablate:
            out.ablation = _ablate(tm, req, out.result)
    except Exception as exc:
        log.warning("model run failed for %r: %s: %s", req.sentence[:80], type(exc).__name__, exc)
        out.error = f"The model could not process this input ({type(exc).__name__}: {exc})"
    return out


def _source(tm, sentence: str) -> tuple[list[int], list[str]]:
    notes = []
    text = sentence
    if len(text) > MAX_CHARS:
        notes.append(f"The sentence has {len(text):,} characters; only the first {MAX_CHARS:,} were used.")
        text = text[:MAX_CHARS]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids, cut = tm.encode_source(text, where="the sentence")
    if cut:
        room = tm.model.cfg.max_positions - 1
        notes.append(f"The sentence was cut to the model's limit of {room} source tokens.")
    notes.extend(str(w.message) for w in caught if not cut)
    return ids, notes


def _translate(tm, req: Request) -> Result | None:
    start = time.perf_counter()
    src_ids, notes = _source(tm, req.sentence)
    if not src_ids:
        return None
    src = torch.tensor([src_ids], dtype=torch.long, device=tm.device)
    if req.target_ids:
        out_ids = list(req.target_ids)
        log_prob, trace = _forced(tm, src, out_ids)
        forced = True
    elif req.target.strip():
        out_ids, target_notes = _target_ids(tm, req.target)
        notes += target_notes
        log_prob, trace = _forced(tm, src, out_ids)
        forced = True
    else:
        cfg = tm.config_with(beam=req.beam, alpha=req.alpha, n_best=1)

        with torch.no_grad():
            gen = generate(tm.model, src, cfg, trace=True)
        best = gen.hypotheses[0][0]
        out_ids, log_prob, trace = list(best.tokens), float(best.log_prob), gen.traces[0]
        forced = False
    src_pieces = tm.src_tokenizer.pieces(src_ids)
    out_pieces = tm.tgt_tokenizer.pieces(out_ids)
    in_pieces = tm.tgt_tokenizer.pieces([tm.model.cfg.start_id, *out_ids[:-1]])
    # float16 on CPU: a 200-token sentence through a 6+6-layer, 8-head model stays ~10 MB per session.
    compact = trace.to("cpu", torch.float16)
    compact.meta.update(src_tokens=src_pieces, tgt_tokens=in_pieces, out_tokens=out_pieces,
                        pad_id=tm.model.cfg.pad_id)
    return Result(req, tm.detokenize(out_ids), tuple(src_pieces), tuple(out_pieces), tuple(out_ids), log_prob,
                  compact, forced, tuple(notes), time.perf_counter() - start)


def _target_ids(tm, target: str) -> tuple[list[int], list[str]]:
    notes = []
    ids = tm.tgt_tokenizer.encode(target[:MAX_CHARS])
    room = tm.model.cfg.max_positions - 1
    if len(ids) > room:
        notes.append(f"The target was cut to the model's limit of {room} tokens.")
        ids = ids[:room]
    return ids + [tm.model.cfg.eos_id], notes


def _forced(tm, src: torch.Tensor, out_ids: list[int]) -> tuple[float, Trace]:
    """Teacher forcing: the log-probability of `out_ids` and the attention while reading them."""
    cfg = tm.model.cfg
    tgt_in = torch.tensor([[cfg.start_id, *out_ids[:-1]]], dtype=torch.long, device=src.device)
    with torch.no_grad():
        logits, trace = tm.model.run_with_cache(src, tgt_in, "*.hook_probs", device="cpu")
    return _sum_log_prob(logits, out_ids), trace


def _sum_log_prob(logits: torch.Tensor, out_ids: list[int]) -> float:
    lp = torch.log_softmax(logits[0].float(), dim=-1)
    idx = torch.tensor(out_ids, device=lp.device)
    return float(lp[torch.arange(len(out_ids), device=lp.device), idx].sum())


def _ablate(tm, req: Request, base: Result) -> Ablation:
    cfg = tm.model.cfg
    spec: dict[tuple[str, int], list[int]] = {}
    for kind, layer, head in req.ablate:
        Head(kind, layer, head).check(cfg)  # a clear error naming the head the model lacks
        spec.setdefault((kind, layer), []).append(head)
    src_ids, _ = _source(tm, req.sentence)
    src = torch.tensor([src_ids], dtype=torch.long, device=tm.device)
    # The hooks live in this worker thread's context only: other sessions' runs never see them.
    with tm.model.intervene(ablate_heads(spec)), torch.no_grad():
        gen = generate(tm.model, src, tm.config_with(beam=req.beam, alpha=req.alpha, n_best=1))
        best = gen.hypotheses[0][0]
        tgt_in = torch.tensor([[cfg.start_id, *base.out_ids[:-1]]], dtype=torch.long, device=src.device)
        logits = tm.model(src, tgt_in)
    original = _sum_log_prob(logits, list(base.out_ids))
    return Ablation(tuple(req.ablate), tm.detokenize(best.tokens), float(best.log_prob), original,
                    original - base.log_prob)


# ------------------------------------------------------------------------------------------ the store


class Session(param.Parameterized):
    """One user's state. Views read it and set its inputs; only `_apply` writes the outputs."""

    checkpoint = param.Selector(default=None, objects=[], doc="Label of the checkpoint (from the discovered list)")
    sentence = param.String(default=EXAMPLE, doc="Source sentence")
    target = param.String(default="", doc="Optional target for teacher-forced inspection ('' = translate)")
    beam = param.Integer(default=1, bounds=(1, 10), doc="Beam size (1 = greedy)")
    alpha = param.Number(default=1.0, bounds=(0.0, 2.0), step=0.1, doc="Length-penalty exponent")

    kind = param.Selector(default="cross", objects=list(KINDS))
    layer = param.Integer(default=0, bounds=(0, None))
    head = param.Integer(default=-1, bounds=(-1, None), doc="-1: mean of all heads")
    words = param.Boolean(default=False, doc="Merge sub-word pieces into words")
    view = param.Selector(default="heatmap", objects=list(VIEWS))
    token = param.Integer(default=-1, bounds=(-1, None), doc="Selected query token (-1: none), highlighted in views")
    ablate = param.List(default=[], item_type=str, doc="Ablated heads as kind:layer:head")

    result = param.Parameter(default=None, doc="Result of the current request (read-only for views)")
    ablation = param.Parameter(default=None, doc="Ablation of the current request, if any heads are ablated")
    message = param.String(default="", doc="What went wrong or was adjusted, in words")
    busy = param.Boolean(default=False)
    version = param.Integer(default=0, doc="Bumped each time a result is applied")

    def __init__(self, entries: list[loader.Entry] | None = None, *, problems: list[str] | None = None,
                 background: bool = False, autorun: bool = True, **params):
        self._entries = {e.label: e for e in (entries if entries is not None else [])}
        self._problems = list(problems or [])
        self.background = background
        self._generation = 0
        self._pending = None
        self._autorun = False
        self.notes_once: list[str] = []  # shown with the next result (e.g. ignored link settings)
        super().__init__(**{k: v for k, v in params.items() if k != "checkpoint"})
        self.param.checkpoint.objects = list(self._entries)
        self.param.checkpoint.check_on_set = True  # off by default when the class declares no objects
        default = params.get("checkpoint")
        if default is None and self._entries:
            default = first_loadable(list(self._entries.values()))
        if default is not None:
            if default not in self._entries:
                raise ValueError(f"checkpoint {default!r} is not in the list: {sorted(self._entries)}")
            self.checkpoint = default
            if "sentence" not in params:
                self._match_example()
        self._alpha_for = (self.checkpoint, self.default_alpha())  # the checkpoint whose default alpha is shown
        if "alpha" not in params:
            self.alpha = self._alpha_for[1]
        self._autorun = autorun
        if autorun:
            self.refresh()

    # -- inputs ---------------------------------------------------------------------------------
    @property
    def entries(self) -> list[loader.Entry]:
        return list(self._entries.values())

    @property
    def model(self):
        """The shared TranslationModel of the current checkpoint (None if it cannot be loaded)."""
        if self.checkpoint is None:
            return None
        try:
            return loader.load_model(str(self._entries[self.checkpoint].path))
        except Exception:
            return None

    def entries_by_label(self, label: str) -> Path:
        """The directory of a listed checkpoint (KeyError for anything not in the list)."""
        return self._entries[label].path

    def heads(self) -> list[tuple[str, int, int]]:
        out = []
        for spec in self.ablate:
            try:
                out.append(parse_head(spec))
            except ValueError:
                continue
        return sorted(set(out))

    def request(self) -> Request | None:
        if self.checkpoint is None:
            return None
        return Request(str(self._entries[self.checkpoint].path), self.sentence, self.target, self.beam,
                       float(self.alpha), tuple(self.heads()))

    def toggle_head(self, kind: str | None = None, layer: int | None = None, head: int | None = None) -> None:
        """Add the head to the ablation set, or remove it if present (defaults: the selected head)."""
        kind = kind or self.kind
        layer = self.layer if layer is None else layer
        head = self.head if head is None else head
        if head < 0:
            self.message = "Pick one head (not the mean of all heads) to ablate it."
            return
        label = head_label(kind, layer, head)
        self.ablate = [h for h in self.ablate if h != label] if label in self.ablate else [*self.ablate, label]

    def reset_ablation(self) -> None:
        self.ablate = []

    # -- running --------------------------------------------------------------------------------
    def _meta(self) -> dict:
        """The current checkpoint's meta.json (cheap: no model load); {} when unreadable."""
        if self.checkpoint is None:
            return {}
        try:
            meta = json.loads((self._entries[self.checkpoint].path / "meta.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return meta if isinstance(meta, dict) else {}

    def source_lang(self) -> str | None:
        """The current checkpoint's source language from its meta.json."""
        return self._meta().get("src_lang")

    def default_alpha(self) -> float:
        """The checkpoint's own length-penalty exponent (meta["generation"], read as loading the model reads it;
        chosen on validation data when shipped or imported), clipped to the slider's range; 1.0 if unreadable."""
        try:
            value = decode_config_from_meta(self._meta().get("generation") or {}).alpha
        except (TypeError, ValueError, AttributeError):  # malformed: loading the model reports it
            return 1.0
        if math.isnan(value):
            return 1.0
        low, high = self.param.alpha.bounds
        return float(min(max(value, low), high))

    def _match_alpha(self) -> bool:
        """After a checkpoint switch, show the new checkpoint's default alpha; True if it changed alpha.

        Only an alpha still at the previous checkpoint's default follows: a value the user chose is kept."""
        if self._alpha_for[0] == self.checkpoint:
            return False
        old, new = self._alpha_for[1], self.default_alpha()
        self._alpha_for = (self.checkpoint, new)
        if abs(self.alpha - old) > 1e-9 or abs(self.alpha - new) <= 1e-9:
            return False
        self.alpha = new  # its own change event runs the model
        return True

    def _match_example(self) -> bool:
        """Swap a built-in example for the one in the checkpoint's source language; True if it did.

        Typed sentences are never touched: only one of EXAMPLES is replaced, so switching from the
        German multi30k model to the English default does not feed it German."""
        if self.sentence not in EXAMPLES.values():
            return False  # typed text: no need to read meta.json on every keystroke
        want = EXAMPLES.get(self.source_lang() or "")
        if want is None or want == self.sentence:
            return False
        self.sentence = want  # its own change event runs the model
        return True

    @param.depends("checkpoint", "sentence", "target", "beam", "alpha", "ablate", watch=True)
    def _inputs_changed(self) -> None:
        if self._autorun and not self._match_example() and not self._match_alpha():
            self.refresh()

    def refresh(self) -> None:
        """Start the model work for the current inputs (inline, or in a worker thread when background)."""
        self._generation += 1
        gen = self._generation
        bad = [h for h in self.ablate if not _is_head(h)]
        if not self._entries:
            self._apply(gen, Outcome(error=self._no_checkpoints()))
            return
        req = self.request()
        notes = [f"Ignored {b!r}: heads are written kind:layer:head, e.g. cross:0:1." for b in bad]
        notes += self.notes_once
        self.notes_once = []
        if not req.sentence.strip():
            self._apply(gen, Outcome(error="Type a sentence to translate.", notes=notes))
            return
        previous = self.result
        if not self.background:
            self._apply(gen, compute(req, previous), notes)
            return
        if self._pending is not None:
            self._pending.cancel()  # only succeeds while still queued: a stale request never starts
        self.busy = True
        future = submit(loader.EXECUTOR, compute, req, previous)  # hooks active here reach the worker
        self._pending = future
        asyncio.ensure_future(self._await(gen, future, notes))

    async def _await(self, gen: int, future, notes: list[str]) -> None:
        try:
            outcome = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            return
        try:
            self._apply(gen, outcome, notes)
        except Exception as exc:  # a view failing to update must not end up as a traceback in the server log
            log.warning("updating the page failed: %s: %s", type(exc).__name__, exc)
            self.param.update(busy=False, message=f"The page could not be updated ({type(exc).__name__}: {exc})")

    def _apply(self, gen: int, outcome: Outcome, notes: list[str] | None = None) -> None:
        if gen != self._generation:
            return  # superseded by a newer request
        self._pending = None
        notes = list(notes or []) + list(outcome.notes)
        if outcome.result is not None:
            notes = list(outcome.result.notes) + notes
        self.param.update(
            result=outcome.result if not outcome.error or outcome.result is not None else None,
            ablation=outcome.ablation,
            message="\n".join([outcome.error, *notes]).strip(),
            busy=False,
            version=self.version + 1,
        )
        self._clamp_selection()

    def _clamp_selection(self) -> None:
        r = self.result
        if r is None:
            return
        depth = r.trace.layers(self.kind)
        n_heads = r.trace.attention(self.kind, 0).size(1) if depth else 0
        changes = {}
        if depth and self.layer >= depth:
            changes["layer"] = depth - 1
        if self.head >= n_heads:
            changes["head"] = -1
        if self.token >= self.query_count():
            changes["token"] = -1
        if changes:
            self.param.update(**changes)

    def query_count(self) -> int:
        r = self.result
        if r is None:
            return 0
        return len(r.src_pieces) if self.kind == "enc_self" else len(r.out_pieces)

    def _no_checkpoints(self) -> str:
        where = "; ".join(self._problems) or f"nothing under {loader.DEFAULT_DIR}"
        return ("No workbench checkpoint found (" + where + "). Start the app with "
                "`panel serve apps/attention.py --args --checkpoints DIR` pointing at a checkpoint directory.")

    def close(self) -> None:
        """The session ended: cancel queued work, drop late results, release the trace (no redraws)."""
        self._generation += 1
        self._autorun = False
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        with param.parameterized.discard_events(self):
            self.result = None
            self.ablation = None

    @param.depends("kind", watch=True)
    def _kind_changed(self) -> None:
        self._clamp_selection()


def first_loadable(entries: list[loader.Entry]) -> str:
    """The default checkpoint if it loads, else the first one that does (else the default, to show its error)."""
    first = loader.default_entry(entries)
    for e in [first, *[e for e in entries if e != first]]:
        try:
            loader.load_model(str(e.path))
            return e.label
        except Exception:
            continue
    return first.label


def _is_head(spec: str) -> bool:
    try:
        parse_head(spec)
        return True
    except ValueError:
        return False


def fmt_logp(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.3f}"

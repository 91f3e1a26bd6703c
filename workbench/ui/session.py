"""The per-session store: what one browser tab (or notebook) is looking at, and the results derived from it.

State only. Inputs are params (checkpoint label, sentence, decoding settings, optional target, selection,
ablated heads); outputs are params too (`result`, `ablation`, `error`, `notes`, `busy`, `version`), written
only when an answer is applied. The model work is `work.compute`, submitted on the session's request path
(`self.requests`, see `requests.py`): inline in tests and notebooks, in worker threads under `panel serve`
(`background=True`); an answer that comes back after a newer request was made is dropped. Tabs submit their
own work on lanes of the same request path (`session.lane(name, heavy=...)`). The store hands out the model
that made the current result (`session.model`); no view turns a path into a model.

The selection's choices follow the current result: `layer`, `head` and `token` are Selectors whose objects
(with display names) are the current model's layers and heads and the current sentence's tokens, so a view
is `pn.widgets.Select.from_param(session.param.head)` and an impossible value is refused, not clamped later.
"""

from __future__ import annotations

import logging
import math

import param

from ..core.heads import Head
from . import loader
from .requests import Lane, Requests
from .work import Outcome, Request, Result, compute

VIEWS = ("heatmap", "lines", "grid")
EXAMPLES = {  # the first sentence shown, in the checkpoint's source language
    "en": "The animal didn't cross the street because it was too tired.",
    "de": "Ein Mann mit einem orangefarbenen Hut starrt auf etwas.",
    "fr": "L'animal n'a pas traversé la rue parce qu'il était trop fatigué.",
}
EXAMPLE = EXAMPLES["de"]


class Session(param.Parameterized):
    """One user's state. Views read it and set its inputs; only an applied answer writes the outputs."""

    checkpoint = param.Selector(default=None, objects=[], doc=("The trained model to look inside. Models found under "
                                                               "checkpoints/ and the folders given at start."))
    sentence = param.String(default=EXAMPLE, doc=("The sentence to translate, in the model's source language. Press "
                                                  "Translate or leave the box to run it."))
    target = param.String(default="", doc=("Leave empty to let the model translate. Type a translation to see how the "
                                           "model reads that one instead (teacher forcing)."))
    beam = param.Integer(default=1, bounds=(1, 10), doc=("How many candidate translations the search keeps at each "
                                                         "step. 1 = greedy: always the single best next word."))
    alpha = param.Number(default=1.0, bounds=(0.0, 2.0), step=0.1, doc=("How much longer translations are favoured "
                                                                        "when candidates are compared: 0 = not at "
                                                                        "all, 1 = by average score per word."))

    kind = param.Selector(default="cross", objects={"encoder self": "enc_self", "decoder self": "dec_self",
                                                     "cross": "cross"},
                          doc="Which attention to show: source words reading each other (encoder self), the output "
                              "so far (decoder self), or the output reading the source (cross).")
    layer = param.Selector(default=0, objects={"0": 0},
                           doc="Which layer: low layers sit near the words, high layers near the output.")
    head = param.Selector(default=-1, objects={"all (mean)": -1}, doc=("One attention head, or the mean of all heads "
                                                                       "of the layer. Each head can attend to "
                                                                       "different things."))
    token = param.Selector(default=-1, objects={"none": -1}, doc=("Highlight one row: what this token attends to (also "
                                                                  "set by tapping a heatmap row)."))
    words = param.Boolean(default=False, doc=("Show whole words instead of the sub-word pieces the model reads "
                                              "(attention summed over each word's pieces)."))
    view = param.Selector(default="heatmap", objects={"heatmap": "heatmap", "head view (lines)": "lines",
                                                      "model view (grid)": "grid"},
                          doc="Heatmap: one cell per (query, key), darker = more attention. Lines: the same as links. "
                              "Grid: every layer and head at once.")
    ablate = param.List(default=[], item_type=str, doc=("Heads switched off (their output set to zero), to see how the "
                                                        "translation changes without them."))

    autorun = param.Boolean(default=True, doc="Run the model whenever an input changes")
    background = param.Boolean(default=False, doc="Run model work in worker threads (served) instead of inline")

    result = param.ClassSelector(class_=Result, default=None, doc="Result of the current request")
    ablation = param.Parameter(default=None, doc="Ablation effect of the current request, if heads are ablated")
    error = param.String(default="", doc="Why there is no result, in words ('' when there is one)")
    notes = param.List(default=[], item_type=str, doc="What was adjusted or ignored on the way to the result")
    busy = param.Boolean(default=False, doc="Model work is running")
    version = param.Integer(default=0, doc="Bumped each time an answer is applied")

    def __init__(self, entries: list[loader.Entry] | None = None, *, problems: list[str] | None = None, **params):
        self._entries = {e.label: e for e in (entries if entries is not None else [])}
        self._problems = list(problems or [])
        self._pending_notes: list[str] = []  # shown with the next answer (e.g. ignored link settings)
        self._ready = False  # input watchers wait for the end of __init__
        autorun = params.pop("autorun", True)
        default = params.pop("checkpoint", None)
        super().__init__(autorun=False, **params)
        self.requests = Requests(background=self.background)
        self._lane = self.requests.lane("translate")
        self.param.checkpoint.objects = list(self._entries)
        self.param.checkpoint.check_on_set = True  # off by default when the class declares no objects
        if default is None and self._entries:
            # Served (background), loading a model here would hold the event loop: the default is taken as
            # named, and `Workbench` falls back to the first loadable one off the loop.
            listed = list(self._entries.values())
            default = loader.default_entry(listed).label if params.get("background") else first_loadable(listed)
        if default is not None:
            if default not in self._entries:
                raise ValueError(f"checkpoint {default!r} is not in the list: {sorted(self._entries)}")
            self.checkpoint = default
            if "sentence" not in params:
                self._match_example()
        self._alpha_for = (self.checkpoint, self.default_alpha())  # the checkpoint whose default alpha is shown
        if "alpha" not in params:
            self.alpha = self._alpha_for[1]
        self._ready = True
        self.autorun = autorun
        if autorun:
            self.refresh()

    # -- reading ----------------------------------------------------------------------------------
    @property
    def entries(self) -> list[loader.Entry]:
        return list(self._entries.values())

    @property
    def entry(self) -> loader.Entry | None:
        return self._entries.get(self.checkpoint)

    @property
    def message(self) -> str:
        """The error (if any) and the notes, one per line: what the page shows under the output."""
        return "\n".join([self.error, *self.notes]).strip()

    def entries_by_label(self, label: str):
        """The directory of a listed checkpoint (KeyError for anything not in the list)."""
        return self._entries[label].path

    @property
    def model(self):
        """The TranslationModel that made the current result (None before the first one)."""
        return self.result.model if self.result is not None else None

    def translation_model(self):
        """The shared TranslationModel of the current checkpoint (loads it if needed: call off the event loop)."""
        if self.entry is None:
            raise LookupError("no checkpoint is selected")
        return loader.load_model(str(self.entry.path))

    def languages(self, label: str | None) -> tuple[str | None, str | None]:
        """(source, target) language of a listed checkpoint from its meta.json ((None, None) when unknown)."""
        entry = self._entries.get(label) if label is not None else None
        meta = loader.read_meta(entry.path) if entry is not None else {}
        return meta.get("src_lang"), meta.get("tgt_lang")

    def train_log(self, label: str) -> list[dict]:
        """The training log of a listed checkpoint ([] when it has none or it cannot be read)."""
        try:
            return loader.load_train_log(str(self._entries[label].path))
        except Exception as exc:  # a checkpoint without a readable log just shows none
            logging.getLogger(__name__).info("no training log for %s: %s", label, exc)
            return []

    def lane(self, name: str, *, heavy: bool = False) -> Lane:
        """A lane of this page's request path for a tab's work (`heavy`: analysis, one at a time per page)."""
        return self.requests.lane(name, heavy=heavy)

    def heads(self) -> list[Head]:
        """The ablated heads as `Head`s (the list's text is the URL and widget spelling; bad entries skipped)."""
        out = []
        for spec in self.ablate:
            try:
                out.append(Head.parse(spec))
            except ValueError:
                continue
        return sorted(set(out))

    def head_exists(self, spec: str) -> bool:
        """Whether `spec` (kind:layer:head) names a head of the current result's model."""
        try:
            head = Head.parse(spec)
        except ValueError:
            return False
        r = self.result
        return r is not None and head.layer < r.depth(head.kind) and head.head < r.n_heads(head.kind)

    def request(self) -> Request | None:
        if self.entry is None:
            return None
        return Request(str(self.entry.path), self.sentence, self.target, self.beam, float(self.alpha),
                       tuple(self.heads()))

    def query_count(self) -> int:
        return len(self.result.queries(self.kind)) if self.result is not None else 0

    def source_lang(self) -> str | None:
        """The current checkpoint's source language (meta.json)."""
        return loader.read_meta(self.entry.path).get("src_lang") if self.entry else None

    def default_alpha(self) -> float:
        """The checkpoint's own length-penalty exponent, clipped to the slider's range; 1.0 if it names none."""
        value = loader.default_alpha(self.entry.path) if self.entry else 1.0
        low, high = self.param.alpha.bounds
        return 1.0 if math.isnan(value) else float(min(max(value, low), high))

    # -- changing ---------------------------------------------------------------------------------
    def toggle_head(self, kind: str | None = None, layer: int | None = None, head: int | None = None) -> None:
        """Add the head to the ablation set, or remove it if present (defaults: the selected head)."""
        kind = kind or self.kind
        layer = self.layer if layer is None else layer
        head = self.head if head is None else head
        if head < 0:
            self.notes = [*self.notes, "Pick one head (not the mean of all heads) to ablate it."]
            return
        label = str(Head(kind, layer, head))
        self.ablate = [h for h in self.ablate if h != label] if label in self.ablate else [*self.ablate, label]

    def reset_ablation(self) -> None:
        self.ablate = []

    def note_next(self, note: str) -> None:
        """A note to show with the next answer (e.g. settings of a link that were ignored)."""
        self._pending_notes.append(note)

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
            return False
        want = EXAMPLES.get(self.source_lang() or "")
        if want is None or want == self.sentence:
            return False
        self.sentence = want  # its own change event runs the model
        return True

    @param.depends("sentence", watch=True)
    def _new_sentence(self) -> None:
        """A highlighted token belongs to the sentence it was picked in."""
        if self._ready:
            self.token = -1

    @param.depends("checkpoint", "sentence", "target", "beam", "alpha", "ablate", watch=True)
    def _inputs_changed(self) -> None:
        if self._ready and not self._match_example() and not self._match_alpha() and self.autorun:
            self.refresh()

    def refresh(self) -> None:
        """Start the model work for the current inputs (inline, or in a worker thread when background)."""
        notes = [f"Ignored {b!r}: heads are written kind:layer:head, e.g. cross:0:1." for b in self.ablate
                 if not _is_head(b)]
        notes += self._pending_notes
        self._pending_notes = []
        if not self._entries:
            self._lane.cancel()
            self._apply(Outcome(error=self._no_checkpoints()), notes)
            return
        req = self.request()
        if not req.sentence.strip():
            self._lane.cancel()
            self._apply(Outcome(error="Type a sentence to translate."), notes)
            return
        self.busy = True
        self._lane.submit(compute, req, self.result, done=lambda outcome: self._apply(outcome, notes),
                          failed=lambda exc: self._apply(Outcome(error=f"{type(exc).__name__}: {exc}"), notes))

    def _apply(self, outcome: Outcome, notes: list[str]) -> None:
        # Notes asked for while this answer was on its way come with it (a link's refused values, named when the
        # link's own ablation had just started this request).
        late, self._pending_notes = self._pending_notes, []
        notes = [*(outcome.result.notes if outcome.result is not None else ()), *notes, *outcome.notes, *late]
        result = outcome.result if outcome.result is not None or not outcome.error else None
        # The pickers' choices first, each event on its own: a link's selection, applied when `version` fires,
        # must find its value among the widget's options (in one batch the options event came after the value's,
        # and the widget fell back to its first option while the figure drew the link's: issue 28).
        self._follow_result(result)
        with param.parameterized.batch_call_watchers(self):
            self.param.update(result=result, ablation=outcome.ablation, error=outcome.error, notes=notes, busy=False,
                              version=self.version + 1)

    @param.depends("kind", watch=True)
    def _kind_changed(self) -> None:
        self._follow_result(self.result)

    def _follow_result(self, r: Result | None) -> None:
        """The selection's choices from result `r`; a value it no longer offers falls back (first, so the
        widgets never hold a value outside their options)."""
        if r is None:
            return
        depth, n_heads, queries = r.depth(self.kind), r.n_heads(self.kind), r.queries(self.kind)
        changes = {}
        if self.layer >= max(depth, 1):
            changes["layer"] = max(depth, 1) - 1
        if self.head >= n_heads:
            changes["head"] = -1
        if self.token >= len(queries):
            changes["token"] = -1
        self.param.update(**changes)
        layers = {str(i): i for i in range(max(depth, 1))}
        heads = {"all (mean)": -1, **{f"head {h}": h for h in range(n_heads)}}
        tokens = {"none": -1, **{f"{i}: {t}": i for i, t in enumerate(queries)}}
        for p, objects in ((self.param.layer, layers), (self.param.head, heads), (self.param.token, tokens)):
            if p.names != objects:  # unchanged choices send no event (and no widget update)
                p.objects = objects

    def _no_checkpoints(self) -> str:
        where = "; ".join(self._problems) or f"nothing under {loader.DEFAULT_DIR}"
        return ("No workbench checkpoint found (" + where + "). Start the app with "
                "`panel serve apps/attention.py --args --checkpoints DIR` pointing at a checkpoint directory.")

    def close(self) -> None:
        """The session ended: stop its jobs, drop late answers, release the trace (no redraws)."""
        self.autorun = False
        self.requests.close()
        with param.parameterized.discard_events(self):
            self.result = None
            self.ablation = None


def first_loadable(entries: list[loader.Entry]) -> str:
    """The default checkpoint if it loads, else the first one that does (else the default, to show its error)."""
    first = loader.default_entry(entries)
    for e in [first, *[e for e in entries if e != first]]:
        try:
            loader.load_model(str(e.path))
            return e.label
        except Exception:  # noqa: S112 - an unloadable checkpoint is skipped here and reported when picked
            continue
    return first.label


def _is_head(spec: str) -> bool:
    try:
        Head.parse(spec)
        return True
    except ValueError:
        return False


def fmt_logp(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.3f}"

"""Small Panel components over one `Session`; each owns its widgets and redraws only what it shows.

Widgets are built with `from_param`, so the store stays the one source of truth (and the URL syncs to it).
Charts come from `workbench.charts` (data in, Bokeh out), sized to the page's width and to the sentence.
Tabs whose content costs more than a translation are `LazyTab`s: they compute only while shown, off the
event loop, with a loading indicator. Every view shows a failure as text: a view may fail, the page does not.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from io import StringIO
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import panel as pn
import param
import torch
from bokeh import events
from bokeh.models import LayoutDOM
from bokeh.plotting import figure

from ..analysis.attention.head_stats import head_stats
from ..analysis.attention.rollout import decoder_rollout
from ..charts import (
    attention_heatmap,
    compare_attention,
    head_view,
    mask_view,
    model_view,
    positional_encoding_view,
    to_html,
    training_curves_chart,
)
from ..charts.analysis import decoder_rollout_view, head_stats_view
from ..charts.heatmap import attention_heatmap_values, show_matrix_values
from ..charts.internals import confidence_chart, embedding_view, label_smoothing_chart, schedule_vs_log_chart
from ..core.batching import decoder_input, pad_sequences
from ..core.heads import KINDS, Head
from ..training.config import TrainConfig
from ..training.setup import lr_at, lr_schedule
from . import loader
from .learn import link_terms, term
from .session import Session, fmt_logp
from .work import Offloaded, Snapshot, compare_reading, encoder_input, measured_confidence

log = logging.getLogger(__name__)


def _fail(what: str, exc: Exception) -> pn.pane.Alert:
    log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
    return pn.pane.Alert(f"{what} could not be drawn: {_md_escape(str(exc))}", alert_type="warning",
                         css_classes=["view-error"], sizing_mode="stretch_width")


def _stretch(obj, height: int | None = None, min_width: int | None = None):
    """Let a Bokeh figure (or every figure of a layout) take the page's width; `height` in px if given, and each
    figure at least `min_width` px wide if given (side by side, they share the width)."""
    figs = [obj] if isinstance(obj, figure) else list(obj.select({"type": figure}))
    for f in figs:
        f.sizing_mode = "stretch_width"
        if height is not None:
            f.height = height
        if min_width is not None:
            f.min_width = min_width
    if isinstance(obj, LayoutDOM) and not isinstance(obj, figure):
        obj.sizing_mode = "stretch_width"
    return obj


def in_its_document(model, change: Callable[[], Any]) -> None:
    """Run `change`, which edits the Bokeh `model` in place, where the model's page allows it: at once when the model
    is on no served page (tests, notebooks), else in a next-tick callback of the model's own document, which Bokeh
    runs under that document's lock.

    A Panel callback may run without the lock: when a click arrives within a widget change's debounce (50 ms), the
    click's handler applies the change first, in a callback Panel schedules `nolock` (Panel's own models then write
    to the page through `pn.io.unlocked`). A shown Bokeh model changed there raised Bokeh's "_pending_writes should
    be non-None when we have a document lock" (tests/ui/test_served_attention.py). Bokeh's rule for unlocked
    callbacks is to make such changes from a next-tick callback (`bokeh.document.locking.without_document_lock`).
    A change scheduled so runs after the current callback, in order with the page's other next-tick changes."""
    doc = model.document
    if doc is None or doc.session_context is None:
        change()
        return
    doc.add_next_tick_callback(change)


def matrix_height(rows: int) -> int:
    """Height of a heatmap of `rows` query tokens: rows readable at a glance (14-36 px each), at most 900 px."""
    cell = max(14, min(36, 720 // max(rows, 1)))
    return min(900, max(260, rows * cell + 130))


class SourcePanel(pn.viewable.Viewer):
    """Checkpoint picker, sentence, decoding settings and the optional teacher-forced target."""

    session = param.ClassSelector(class_=Session)

    def __panel__(self):
        s = self.session
        longest = max((len(label) for label in s.param.checkpoint.objects), default=10)
        picker = pn.widgets.Select.from_param(s.param.checkpoint, name="Checkpoint", css_classes=["ckpt-picker"],
                                              width=min(520, max(200, 8 * longest + 60)))
        # A multi-line box (a paragraph fits); it commits when it loses focus, so the button only has to take
        # the focus. max_length above the store's own cut, so the store's message about the cut shows.
        sentence = pn.widgets.TextAreaInput.from_param(s.param.sentence, name="Source sentence", max_length=50_000,
                                                       css_classes=["sentence-input"], auto_grow=True, rows=2,
                                                       max_rows=8, sizing_mode="stretch_width", min_width=300)
        go = pn.widgets.Button(label="Translate", color="primary", css_classes=["translate-btn"], align="end",
                               width=110)
        target = pn.widgets.TextInput.from_param(
            s.param.target, name="Target for teacher forcing (empty: translate)", max_length=50_000,
            css_classes=["target-input"], sizing_mode="stretch_width", min_width=300)
        beam = pn.widgets.IntSlider.from_param(s.param.beam, name="Beam size (1 = greedy)", width=170,
                                               css_classes=["beam-slider"])
        alpha = pn.widgets.FloatSlider.from_param(s.param.alpha, name="Length penalty α", width=170,
                                                  css_classes=["alpha-slider"])
        return pn.Column(pn.Row(picker, sentence, go, sizing_mode="stretch_width"),
                         pn.Row(target, beam, alpha, sizing_mode="stretch_width"), sizing_mode="stretch_width")


class OutputPanel(pn.viewable.Viewer):
    """The translation, its log-probability, timing, the error or notes about the input, and a busy spinner."""

    session = param.ClassSelector(class_=Session)

    def __panel__(self):
        s = self.session
        text = pn.pane.Markdown(pn.bind(_translation_md, s.param.result), css_classes=["translation"],
                                sizing_mode="stretch_width")
        spinner = pn.indicators.LoadingSpinner(value=s.param.busy, visible=s.param.busy, width=24, height=24,
                                               css_classes=["busy"])
        # Hidden: tests and scripts wait on it ("an answer was applied"), people do not need to see it.
        status = pn.pane.Markdown(pn.bind(lambda v: f"version={v}", s.param.version), css_classes=["status"],
                                  visible=False)
        message = pn.pane.Alert(pn.bind(_message_md, s.param.error, s.param.notes), css_classes=["message"],
                                alert_type=pn.bind(lambda e: "danger" if e else "info", s.param.error),
                                visible=pn.bind(lambda e, n: bool(e or n), s.param.error, s.param.notes),
                                sizing_mode="stretch_width")
        return pn.Column(pn.Row(text, spinner, status, sizing_mode="stretch_width"), message,
                         sizing_mode="stretch_width")


def _translation_md(r) -> str:
    if r is None:
        return "**Translation:** –"
    label = "Target (teacher-forced)" if r.forced else "Translation"
    return (f"**{label}:** {_md_escape(r.text) or '(empty output)'}  \n"
            f"<small>log p = {fmt_logp(r.log_prob)} over {r.n_tokens} tokens · "
            f"{len(r.src_pieces)} source tokens · {r.seconds * 1000:.0f} ms</small>")


def _message_md(error: str, notes: list[str]) -> str:
    return "  \n".join(_md_escape(line) for line in [error, *notes] if line)


class AttentionView(pn.viewable.Viewer):
    """Encoder self / decoder self / cross attention per layer and head, as heatmap, lines or grid.

    Tapping a heatmap row or choosing a token selects it (highlighted in every view); tapping a grid
    tile selects that layer and head, which the ablation panel then acts on.
    """

    session = param.ClassSelector(class_=Session)

    def __init__(self, **params):
        super().__init__(**params)
        self._pane = pn.pane.Bokeh(None, css_classes=["attention-figure"], sizing_mode="stretch_width")
        self._box = pn.Column(self._pane, sizing_mode="stretch_width")
        self.figure = None
        self._heatmap_of = None  # (result, kind, words) of the shown heatmap: what fixes its tokens and layout
        self.session.param.watch(self._redraw, ["version", "kind", "layer", "head", "token", "words", "view"])
        self._redraw()

    def _redraw(self, *_):
        r = self.session.result
        if r is None:
            self.figure = None
            self._box.objects = [pn.pane.Markdown("*No attention to show yet.*")]
            return
        s = self.session
        shows = (r, s.kind, s.words)
        same = self._heatmap_of is not None and self._heatmap_of[0] is r and self._heatmap_of[1:] == shows[1:]
        try:
            if s.view == "heatmap" and same and self.figure is not None and self._box.objects == [self._pane]:
                # another head, layer or token of the same heatmap: its values change in place, no figure is built
                # (building one to compare took 0.7-1.7 s of the event loop under load: docs/app.md, run 15)
                values = self.heatmap_values(r)
                shown = self.figure
                in_its_document(shown, lambda: show_matrix_values(shown, values) if self.figure is shown else None)
                return
            fig = self.build(r, interactive=True)
        except Exception as exc:
            self.figure = self._heatmap_of = None
            self._box.objects = [_fail("This view", exc)]
            return
        self._heatmap_of = shows if s.view == "heatmap" else None
        self.figure = fig
        self._pane.object = fig
        if self._box.objects != [self._pane]:  # re-setting the same children re-renders the column
            self._box.objects = [self._pane]

    def build(self, r, *, interactive: bool = False):
        """The current view as a new Bokeh model (interactive: with the taps that select rows and tiles)."""
        s = self.session
        heads = None if s.head < 0 else s.head
        token = None if s.token < 0 else s.token
        select = _select(r, s.kind)
        if s.view == "heatmap":
            rows = len(r.queries(s.kind))
            fig = attention_heatmap(r.trace, s.kind, s.layer, heads, words=s.words, highlight=token, select=select,
                                    width=900, height=matrix_height(rows))
            fig.name = "attn_fig"
            fig.title.text_font_size = "13px"
            if interactive:
                fig.on_event(events.Tap, self._tapped_row)
            return _stretch(fig)
        if s.view == "lines":  # the lines take the view's width (issue 37: the page's width at 1000-1500 px)
            return _stretch(head_view(r.trace, s.kind, s.layer, heads, words=s.words, highlight=token,
                                      select=select, top_k=8 if len(r.src_pieces) > 60 else None, width=720),
                            min_width=360)
        # the grid and the enlarged tile share the view's width (tiles 96 px tall, as wide as the half they get)
        grid = _stretch(model_view(r.trace, s.kind, words=s.words, select=select, tile_px=96), min_width=300)
        tiles = grid.select_one({"name": f"model_view_tiles_{s.kind}"})
        if interactive and tiles is not None:
            tiles.selected.on_change("indices", lambda attr, old, new, src=tiles: self._tapped_tile(src, new))
        return grid

    def heatmap_values(self, r):
        """The current heatmap's values (`charts.heatmap.MatrixValues`), as `build` would draw them."""
        s = self.session
        return attention_heatmap_values(r.trace, s.kind, s.layer, None if s.head < 0 else s.head, words=s.words,
                                        highlight=None if s.token < 0 else s.token, select=_select(r, s.kind))

    def _tapped_row(self, event) -> None:
        if event.y is None:
            return
        row = int(round(event.y))
        if 0 <= row < self.session.query_count() and not self.session.words:
            self.session.token = -1 if self.session.token == row else row

    def _tapped_tile(self, src, indices) -> None:
        if indices:
            i = indices[0]
            self.session.param.update(layer=int(src.data["layer"][i]), head=int(src.data["head"][i]))

    def export_name(self) -> str:
        """`<checkpoint>_<view>_<kind>-L<layer>-H<head>.html` (H = mean for the mean of all heads)."""
        s = self.session
        ckpt = re.sub(r"[^A-Za-z0-9._-]+", "-", s.checkpoint or "none").strip("-")
        layer = "all" if s.view == "grid" else s.layer
        head = "all" if s.view == "grid" else ("mean" if s.head < 0 else s.head)
        return f"{ckpt}_{s.view}_{s.kind}-L{layer}-H{head}.html"

    def export_html(self) -> StringIO:
        """The current view as one offline HTML file with a caption: a fresh figure, not the one the page shows."""
        s, r = self.session, self.session.result
        if r is None:
            return StringIO("<p>nothing to export</p>")
        caption = (f"Sentence: {r.request.sentence}\n{'Target (teacher-forced)' if r.forced else 'Translation'}: "
                   f"{r.text}\nCheckpoint: {s.checkpoint}")
        return StringIO(to_html(self.build(r), title=self.export_name()[:-5], caption=caption))

    def __panel__(self):
        s = self.session
        controls = pn.FlexBox(
            pn.widgets.RadioButtonGroup.from_param(s.param.kind, name="", css_classes=["kind-picker"]),
            pn.widgets.Select.from_param(s.param.layer, name="Layer", width=90, css_classes=["layer-picker"]),
            pn.widgets.Select.from_param(s.param.head, name="Head", width=120, css_classes=["head-picker"]),
            pn.widgets.Select.from_param(s.param.token, name="Highlight token", width=190,
                                         css_classes=["token-picker"]),
            pn.widgets.Checkbox.from_param(s.param.words, name="words (merge sub-words)",
                                           css_classes=["words-toggle"], align="end", margin=(5, 0, 12, 10)),
            # a checkbox draws no "?" of its own: its parameter's sentence in a tooltip icon beside it
            pn.widgets.TooltipIcon(value=s.param.words.doc, css_classes=["words-help"], align="end",
                                   margin=(5, 10, 12, 0)),
            align_items="end", sizing_mode="stretch_width")
        export = pn.widgets.FileDownload(callback=self.export_html, filename=self.export_name(),
                                         label="Export view (offline HTML)", color="light",
                                         css_classes=["export-html"], width=220)
        s.param.watch(lambda *_events: setattr(export, "filename", self.export_name()),
                      ["checkpoint", "view", "kind", "layer", "head"])
        modes = pn.widgets.RadioButtonGroup.from_param(s.param.view, name="", css_classes=["view-picker"])
        return pn.Column(controls, pn.Row(modes, export), self._box, sizing_mode="stretch_width")


class AblationPanel(pn.viewable.Viewer):
    """Zero heads (picked on the grid or from the list); the new output beside the original, Δ log p."""

    session = param.ClassSelector(class_=Session)

    def _options(self, result, ablate) -> list[str]:
        if result is None:
            return list(ablate)
        found = [str(Head(k, layer, h)) for k in KINDS for layer in range(result.depth(k))
                 for h in range(result.n_heads(k))]
        return found + [h for h in ablate if h not in found]

    def __panel__(self):
        s = self.session
        choice = pn.widgets.MultiChoice.from_param(
            s.param.ablate, name="Ablated heads (kind:layer:head)", css_classes=["ablate-choice"],
            options=pn.bind(self._options, s.param.result, s.param.ablate), sizing_mode="stretch_width")
        add = pn.widgets.Button(label="Ablate the selected head", color="primary", css_classes=["ablate-btn"])
        reset = pn.widgets.Button(label="Reset", css_classes=["reset-btn"])
        add.on_click(lambda e: self.session.toggle_head())
        reset.on_click(lambda e: self.session.reset_ablation())
        out = pn.pane.Markdown(pn.bind(_ablation_md, s.param.ablate, s.param.ablation, s.param.result),
                               css_classes=["ablation-out"], sizing_mode="stretch_width")
        return pn.Column(pn.pane.Markdown("### Ablate heads", css_classes=["ablate-heading"], margin=(0, 10)),
                         pn.Row(add, reset), choice, out, sizing_mode="stretch_width")


def _ablation_md(ablate, a, r) -> str:
    if not ablate or r is None:
        return link_terms("Select a head (grid view: tap a tile; or the layer/head pickers) and press **Ablate**, or "
                          f"choose heads in the list. {term('ablation', 'Ablated')} heads output zeros.")
    if a is None:
        return "*Ablating…*"
    same = "same as the original" if a.text == r.text else "**changed**"
    return (f"| | output | log p |\n|---|---|---|\n"
            f"| original | {_md_escape(r.text) or '(empty)'} | {fmt_logp(r.log_prob)} |\n"
            f"| ablated ({len(a.heads)} heads) | {_md_escape(a.text) or '(empty)'} ({same}) | "
            f"{fmt_logp(a.log_prob)} |\n\n"
            f"Log-probability of the original output under ablation: {fmt_logp(a.original_log_prob)} "
            f"(**Δ = {a.delta:+.3f}**)")


# ------------------------------------------------------------------------------------------ lazy tabs


class LazyTab(pn.viewable.Viewer):
    """A tab that works only while shown, on the page's request path (`requests.py`): `inputs()` on the event
    loop, `compute(*inputs)` off it (in the session's worker threads when served; a `ticket` parameter gets
    the job's `Ticket` for `check()` between batches and `report()` of progress), `render(answer)` back on it,
    under the page's lock. A newer refresh supersedes the older job; its answer is never shown.

    Subclasses name the session params that make the content stale (`follows`), their own (`redraws`), and
    whether their work is `heavy` (analysis: its own pool, at most one such job per page).
    """

    session = param.ClassSelector(class_=Session)
    active = param.Boolean(default=False, doc="The tab is on screen; hidden tabs do no work")

    title: ClassVar[str] = "This tab"
    follows: ClassVar[tuple[str, ...]] = ("version",)
    redraws: ClassVar[tuple[str, ...]] = ()
    heavy: ClassVar[bool] = False
    url: ClassVar[dict[str, str]] = {}  # param -> its key in the page's URL (`bind_link`; docs/app.md lists them)
    url_late: ClassVar[tuple[str, ...]] = ()  # params read from a link after the first answer (choices follow it)

    def __init__(self, **params):
        super().__init__(**params)
        self._box = pn.Column(sizing_mode="stretch_width", min_height=120)
        self._stale = True
        self.lane = self.session.lane(f"{type(self).__name__}-{id(self)}", heavy=self.heavy)
        self.session.param.watch(self._changed, list(self.follows))
        if self.redraws:
            self.param.watch(self._changed, list(self.redraws))

    def bind_link(self, link) -> None:
        """Put the tab's `url` params in the page's URL (`link.Link`); subclasses add checks."""
        for name, key in self.url.items():
            link.bind(key, self, name, late=name in self.url_late)

    @property
    def content(self) -> list:
        """What the tab shows now (the Panel objects of its body)."""
        return list(self._box.objects)

    def show(self) -> None:
        self.active = True

    @param.depends("active", watch=True)
    def _activated(self) -> None:
        if self.active and self._stale:
            self.refresh()

    def _changed(self, *_) -> None:
        self._stale = True
        if self.active:
            self.refresh()

    def refresh(self) -> None:
        self._stale = False
        self.lane.cancel()
        try:
            inputs = self.inputs()
        except Exception as exc:
            self._box.loading = False
            self._box.objects = [_fail(self.title, exc)]
            return
        if isinstance(inputs, str):  # nothing to compute: a placeholder line
            self._box.loading = False
            self._box.objects = [pn.pane.Markdown(inputs)]
            return
        self._box.loading = True
        self.lane.submit(self.compute, *inputs, done=self._done, failed=self._done, progress=self.progress,
                         stopped=self.stopped)

    def _done(self, answer: Any) -> None:
        self._box.loading = False
        if isinstance(answer, Exception):
            self._box.objects = [_fail(self.title, answer)]
            return
        try:
            self._box.objects = list(self.render(answer))
        except Exception as exc:
            self._box.objects = [_fail(self.title, exc)]

    def progress(self, done: int, total: int, what: str = "") -> None:
        """A `Progress` report of the current job (on the event loop); tabs that report override it."""

    def stopped(self) -> None:
        """Another heavy job of the page stopped this tab's job: say so (it runs again when asked)."""
        self._stale = True
        self._box.loading = False
        self._box.objects = [pn.pane.Markdown(f"*{self.title}: stopped, another analysis of this page started.*")]

    def inputs(self) -> tuple | str:
        """The compute arguments, read from the store now; a string instead means 'show this, compute nothing'."""
        raise NotImplementedError

    def compute(self, *inputs):
        """The work (model calls, analyses, figure building); runs off the event loop, so it reads no params."""
        raise NotImplementedError

    def render(self, answer) -> list:
        """Panel objects for the answer (on the event loop)."""
        raise NotImplementedError

    def __panel__(self):
        return self._box


EMBEDDINGS_HOW_TO_READ = (
    "What the encoder receives for this sentence, as the Annotated Transformer builds it: each source token's "
    "embedding, multiplied by √d_model, plus the positional encoding of where it stands. One row per token, one "
    "column per dimension, one colour scale for all three (blue negative, red positive). The bars compare the two "
    "vectors' lengths: scaled by √d_model, the word is louder than its position, so the position nudges the word "
    "rather than drowning it.")
POSITIONS_HOW_TO_READ = (
    "Attention alone does not know word order, so each position adds a fixed vector, its positional encoding, to "
    "its word's embedding. "
    "Left: that vector (one row per position, one column per dimension; colour = value from −1, blue, to +1, red). "
    "Middle: a few dimensions as waves over positions — low dimensions oscillate fast, high ones slowly. Right: "
    "how alike two positions' vectors are (cosine); nearby positions look alike, so the model can tell distance.")
MASKS_HOW_TO_READ = (
    "Blue cells may be attended to, grey ones are masked out (their attention weight is forced to 0). Left: the "
    "source padding of a batch of three sentences padded to one length. Middle: the decoder's causal mask — each "
    "output position sees only itself and earlier positions, so training can't peek at the next word. Right: "
    "cross-attention — every output position may read every real source token, never the padding.")


ANALYSIS_HOW_TO_READ = (
    "*Head statistics*: how each head spreads its attention over this sentence (entropy: how spread out, 0 = on one "
    "token; distance: how far from its own position it looks; prev, next, first, eos, punct: the share on that "
    "token), one table row per head, and the chosen statistic per layer and head. *Decoder rollout*: attention "
    "multiplied through the decoder's layers (rollout), how much each output token draws on each source token and "
    "on the target prefix.")


class InternalsView(LazyTab):
    """Positional encodings, the masks of a padded batch (labelled with this sentence's pieces), the checkpoint's
    own LR schedule (from its stored training config) over the LR its log recorded, its label smoothing (the
    smoothed target, the loss against confidence, and the model's real confidence on its validation text), and
    its training and validation curves."""

    title = "Internals"
    follows = ("checkpoint", "version")
    CONFIDENCE_SENTENCES = 200
    """Validation sentences the confidence histogram is measured on (about a second for the shipped models)."""

    def inputs(self):
        s, r = self.session, self.session.result
        if r is None or s.checkpoint is None:
            return "*Load a checkpoint to see its internals.*"
        return r, s.checkpoint

    def compute(self, r, label):
        tm = r.model
        cfg = tm.model.cfg
        log_rows = self.session.train_log(label)
        parts = {"log": log_rows}
        try:  # the encoder's input for this sentence, read at the model's hook points
            e = encoder_input(tm, r.src_ids)
            parts["embeddings"] = embedding_view(e["tok"], e["pos"], e["embed"], list(r.src_pieces),
                                                 scale=e["scale"], normed=e["normed"])
        except Exception as exc:
            parts["embeddings"] = exc
        try:
            length = min(cfg.max_positions, max(50, len(r.src_ids)))
            parts["positions"] = positional_encoding_view(cfg, length=length, model=tm.model)
        except Exception as exc:
            parts["positions"] = exc
        try:
            src_ids, out_ids = list(r.src_ids)[:40], list(r.out_ids)[:40]
            body = src_ids[:-1] if src_ids and src_ids[-1] == cfg.eos_id else src_ids
            rows = [body + [cfg.eos_id], body[: len(body) // 2] + [cfg.eos_id], body[:2] + [cfg.eos_id]]
            tgt = decoder_input(out_ids, cfg.start_id)
            tgt_rows = [tgt, tgt[: max(1, len(tgt) // 2)], tgt[:2]]
            parts["masks"] = mask_view(pad_sequences(rows, cfg.pad_id), pad_sequences(tgt_rows, cfg.pad_id),
                                       pad_id=cfg.pad_id, src_pieces=tm.src_tokenizer.pieces(rows[0]),
                                       tgt_pieces=tm.tgt_tokenizer.pieces(tgt))
        except Exception as exc:
            parts["masks"] = exc
        try:
            parts["schedule"] = checkpoint_schedule(tm.meta.get("train_config"), log_rows)
        except Exception as exc:
            parts["schedule"] = exc
        parts["smoothing"] = float((tm.meta.get("train_config") or {}).get("label_smoothing", 0.0))
        # model work (200 sentences teacher-forced): measured by `_measured`'s heavy job, once per checkpoint
        parts["confidence"] = loader.CACHE.peek("confidence", r.request.path, self.CONFIDENCE_SENTENCES)
        parts["snapshot"] = Snapshot.of(r)
        return parts

    def render(self, parts):
        schedule = parts["schedule"]
        if isinstance(schedule, Exception):
            lr = [_fail("Learning-rate schedule", schedule)]
        else:
            frame, words = schedule
            lr = [pn.pane.Markdown(link_terms(words), css_classes=["lr-schedule-note"], sizing_mode="stretch_width"),
                  pn.pane.Vega(schedule_vs_log_chart(frame), sizing_mode="stretch_width")]
        return [pn.pane.Markdown("### Embeddings of this sentence"),
                pn.pane.Markdown(link_terms(EMBEDDINGS_HOW_TO_READ)), _wrapped(parts["embeddings"], "Embeddings"),
                pn.pane.Markdown("### Positional encodings"), pn.pane.Markdown(link_terms(POSITIONS_HOW_TO_READ)),
                _wrapped(parts["positions"], "Positional encodings"),
                pn.pane.Markdown("### Masks of a padded batch (this sentence + two shorter ones)"),
                pn.pane.Markdown(link_terms(MASKS_HOW_TO_READ)), _wrapped(parts["masks"], "Masks"),
                pn.pane.Markdown("### Learning-rate schedule"), *lr,
                pn.pane.Markdown("### Label smoothing"), *self._smoothing(parts["smoothing"]),
                self._measured(parts["snapshot"], parts["confidence"]),
                pn.pane.Markdown("### Training and validation curves stored in the checkpoint"),
                self._curves(parts["log"])]

    def _measured(self, snapshot: Snapshot, measured) -> pn.Column:
        """Where the trained model really puts its probability on held-out text: shown at once when this
        checkpoint's was measured, else measured by a heavy job (a worker process when the server has a pool; the
        page's one heavy job, as the other analyses) and shown when it lands."""
        box = pn.Column(sizing_mode="stretch_width", css_classes=["confidence-box"])
        if measured is not None:
            box.objects = self._confidence(measured)
            return box
        box.objects = [pn.pane.Markdown("*Measuring the model's confidence on its validation text…*")]

        def landed(value) -> None:
            if not isinstance(value, Exception | tuple):
                value = ValueError(f"unexpected answer {type(value).__name__}")
            if isinstance(value, tuple):  # the page's process keeps it for every page, as a worker keeps its own
                loader.CACHE.put("confidence", snapshot.request.path, value, self.CONFIDENCE_SENTENCES)
            box.objects = self._confidence(value)

        if not hasattr(self, "_confidence_lane"):
            self._confidence_lane = self.session.lane(f"InternalsConfidence-{id(self)}", heavy=True)
        def stopped() -> None:  # another analysis of the page took its one heavy slot: measured when reopened
            self._stale = True
            box.objects = [pn.pane.Markdown("*The confidence measurement stopped: another analysis of this page "
                                            "started. Open the tab again to measure it.*")]

        self._confidence_lane.submit(Offloaded(measured_confidence), snapshot, self.CONFIDENCE_SENTENCES,
                                     done=landed, failed=landed, stopped=stopped)
        return box

    @staticmethod
    def _confidence(measured) -> list:
        if isinstance(measured, Exception):
            return [pn.pane.Markdown(f"*The model's confidence could not be measured: {measured}*")]
        confidence, name = measured
        return [pn.pane.Markdown(f"Measured on {name}: {confidence.summary()}.", css_classes=["confidence-note"],
                                 sizing_mode="stretch_width"),
                pn.pane.Vega(confidence_chart(confidence), sizing_mode="stretch_width")]

    @staticmethod
    def _smoothing(smoothing: float) -> list:
        """The smoothed target and loss for this checkpoint's ε (on a 10-word vocabulary, to be readable); below
        it (`_measured`), where the trained model really puts its probability on held-out text."""
        words = (f"This model was trained with label smoothing ε = {smoothing:g}: instead of asking for probability 1 "
                 f"on the reference word, the target keeps 1 − ε and spreads ε over the whole vocabulary (left, on "
                 f"a 10-word vocabulary). The loss (right) is then lowest at that mass, not at 1, so the model is "
                 f"taught not to be over-confident. Below: the probability the trained model really gives the "
                 f"reference word, and its own first choice, token by token on validation text.")
        if smoothing == 0:
            words = ("This model was trained without label smoothing (ε = 0): its target is one-hot, and the loss "
                     "keeps falling until the reference word gets probability 1 (right). Below: where the trained "
                     "model really puts its probability on validation text.")
        out = [pn.pane.Markdown(link_terms(words), css_classes=["smoothing-note"], sizing_mode="stretch_width")]
        try:
            out.append(pn.pane.Vega(label_smoothing_chart(vocab=10, smoothing=smoothing), sizing_mode="stretch_width"))
        except Exception as exc:
            out.append(_fail("Label smoothing", exc))
        return out

    def _curves(self, log_rows):
        if not log_rows:
            return pn.pane.Markdown("*This checkpoint stores no training log.*")
        try:
            return pn.pane.Vega(training_curves_chart(log_rows), sizing_mode="stretch_width")
        except Exception as exc:
            return _fail("Training curves", exc)


def checkpoint_schedule(train_config: dict | None, log_rows: list[dict]) -> tuple[pd.DataFrame, str]:
    """(step, lr, source) rows of the checkpoint's own schedule, evaluated at its logged steps (and their run
    time, which the time-budget cosine needs) or over its max_steps when it logged none, next to the logged LR;
    and a sentence saying which schedule it is."""
    if not train_config:
        raise ValueError("this checkpoint stores no training config (meta.json train_config), so its schedule "
                         "is unknown")
    cfg = TrainConfig.from_dict(dict(train_config))
    fn = lr_schedule(cfg)
    logged = [r for r in log_rows if "lr" in r and "step" in r]
    if logged:
        points = [(int(r["step"]), lr_at(cfg, fn, int(r["step"]), float(r.get("time", 0.0)))) for r in logged]
    else:
        last = cfg.max_steps or 20_000
        points = [(int(x), lr_at(cfg, fn, int(x))) for x in np.unique(np.linspace(1, last, 400).astype(int))]
    name = "schedule " + cfg.schedule
    frame = pd.DataFrame([{"step": x, "lr": y, "source": name} for x, y in points]
                         + [{"step": r["step"], "lr": r["lr"], "source": "logged (checkpoint)"} for r in logged])
    budget = cfg.schedule == "warmup_cosine" and not cfg.max_steps
    words = (f"{cfg.schedule}: warm-up {cfg.warmup} steps, "
             + (f"d_model^-0.5 × factor {cfg.noam_factor}" if cfg.schedule == "noam" else f"peak {cfg.lr:g}")
             + (f", cosine decay over the {cfg.max_minutes:g}-minute time budget (read at each logged step's run "
                "time)" if budget else (f", {cfg.max_steps} steps" if cfg.max_steps else ""))
             + ". The line is the schedule from the stored training config; the dots are the LR the log recorded.")
    return frame, words


def _pane(obj, what: str):
    return _fail(what, obj) if isinstance(obj, Exception) else pn.pane.Bokeh(obj, sizing_mode="stretch_width")


def _wrapped(grid, what: str):
    """A Bokeh row, or column of rows, of fixed-size figures as one wrapping box: as many a row as the page fits."""
    if isinstance(grid, Exception):
        return _fail(what, grid)
    figs = [f for r in grid.children for f in getattr(r, "children", [r])]
    return pn.FlexBox(*[pn.pane.Bokeh(f) for f in figs], flex_wrap="wrap", sizing_mode="stretch_width")


class _NoneSelect(pn.widgets.Select):
    """A Select whose first drawing shows the option of value None when that is its value (Panel leaves None values
    out of a widget's first model, so the browser showed no option at all until the value changed)."""

    def _init_params(self) -> dict[str, Any]:
        params = super()._init_params()
        if self.value is None and any(v is None for v in self.values):
            params["value"] = None  # mapped to that option's key by `_process_param_change`
        return params


class CompareView(LazyTab):
    """Two checkpoints on the same sentence: B is teacher-forced on A's output, so the rows line up.

    B starts as a compatible checkpoint (same source and target languages; another snapshot of the same
    run when there is one, see `loader.partner`), and the tab says why it was chosen, or that none fits. Then
    the picker offers an empty first choice, `CHOOSE`, so that any checkpoint picked from it, A's own included,
    is a change.

    The work (loading B, teacher-forcing it, selecting both blocks) is `work.compare_reading`, run in a worker
    process when served; the page draws its answer.
    """

    CHOOSE: ClassVar[str] = "(choose B)"
    TITLE_CHARS: ClassVar[int] = 30
    """Characters per title line: three figures share a 1000 px page, about 220 px of title each at 12 px."""
    PANE_MIN_WIDTH: ClassVar[int] = 300
    """The narrowest a figure gets (token axes, a matrix, a colour bar); narrower, the row wraps."""

    other = param.Selector(default=None, objects=[], allow_None=True, doc=("The model to compare with: it reads the "
                                                                           "same output, so both attention maps line "
                                                                           "up row by row."))

    title = "Comparison"
    follows = ("version", "kind", "layer", "head", "words")
    redraws = ("other",)
    heavy = True  # loads a second model and runs it: off the interactive threads, in a worker process when served
    url = {"other": "cmp"}

    def __init__(self, **params):
        super().__init__(**params)
        self.param.other.check_on_set = True  # off by default when the class declares no objects
        self._offer()
        self._why = ""
        self._shown: tuple = ()  # what the page says beside the current job's figures (set with its inputs)
        self._chosen_by_user = False
        self._picking = False  # the tab itself is setting `other` (the partner of a new A)
        self.param.watch(self._offer, ["other"], precedence=1)  # after the picker's own watcher: value, then choices
        self._pick_partner()
        self.session.param.watch(lambda e: self._pick_partner(), ["checkpoint"])

    def _offer(self, *_, choose: bool | None = None) -> None:
        """The picker's choices: every listed checkpoint, after `CHOOSE` while there is no B (else the picker showed
        its first name, A's, and choosing that name changed nothing).

        Order matters to the picker (Panel's Select shows its first option for a value it does not offer, and that
        becomes the value): a chosen B is set first and `CHOOSE` goes after (this method watches `other` after the
        picker does); `CHOOSE` comes back before B is set to None (`choose=True`)."""
        labels = list(self.session.param.checkpoint.objects)
        choose = self.other is None if choose is None else choose
        self.param.other.objects = {self.CHOOSE: None, **{x: x for x in labels}} if choose else labels

    def _pick_partner(self) -> None:
        """B follows A until someone picks B. Set with its event, so the picker shows B (set inside
        `discard_events`, the picker kept showing its first option, A, and choosing that name changed nothing)."""
        s = self.session
        if s.checkpoint is None or self._chosen_by_user:
            return
        entry, self._why = loader.partner(s.entries, s.checkpoint)
        self._picking = True
        try:
            if entry is None:
                self._offer(choose=True)
            self.other = entry.label if entry is not None else None
        finally:
            self._picking = False
        self._changed()

    def _changed(self, *events) -> None:
        picked = [e for e in events if getattr(e, "name", None) == "other" and e.new is not None]
        if picked and not self._picking:  # a person (or a link) chose B: the reason first, then the refresh
            self._chosen_by_user = True
            self._why = "chosen by you"
        if self._picking:
            return  # `_pick_partner` refreshes once, after its reason is set
        super()._changed(*events)

    def direction_note(self) -> str:
        """A sentence when B does not translate the direction A does (meta.json languages), else ''."""
        a, b = self.session.languages(self.session.checkpoint), self.session.languages(self.other)
        if None in a or None in b or a == b:
            return ""
        return (f"Note: B translates {b[0]}→{b[1]}, A {a[0]}→{a[1]}; B is teacher-forced on A's output anyway, "
                "so its attention reads text in languages it was not trained on.")

    def inputs(self):
        s, r = self.session, self.session.result
        if r is None:
            return "*Nothing to compare yet.*"
        if self.other is None:
            return f"*No checkpoint to compare with by default: {self._why}. Pick one above to compare anyway.*"
        self._shown = ((s.checkpoint, self.other), r.log_prob, self._why, self.direction_note())
        return Snapshot.of(r), r.trace, str(s.entries_by_label(self.other)), s.kind, s.layer, s.head, s.words

    # Heavy: in a worker process when the server has a pool (`workers.py`), which loads B there; the worker sends
    # the two blocks back and the figures are drawn here (Bokeh models do not pickle).
    compute = Offloaded(compare_reading)

    def render(self, answer):
        names, log_prob_a, why, direction = self._shown
        a, b = answer["a"], answer["b"]
        fig = compare_attention(a, b, names=names, wrap=self.TITLE_CHARS, height=matrix_height(len(a.queries)))
        panes = []
        for child in fig.children:  # one pane each, side by side while they fit, else wrapped (ranges stay linked)
            child.title.text_font_size = "12px"
            # the column is the flex item (Panel draws a Bokeh pane as the figure itself, whose width is 100 %)
            panes.append(pn.Column(pn.pane.Bokeh(_stretch(child), min_width=0, sizing_mode="stretch_width"),
                                   sizing_mode="stretch_width", min_width=0,
                                   styles={"flex": f"1 1 {self.PANE_MIN_WIDTH}px", "min-width": "0"}))
        note = (f"B reads A's output (teacher forcing): log p(A's output | B) = {fmt_logp(answer['log_prob_b'])} vs "
                f"{fmt_logp(log_prob_a)} under A. B = {names[1]}: {why}.")
        out = [pn.pane.Markdown(link_terms(_md_escape(note)), css_classes=["compare-note"],
                                sizing_mode="stretch_width")]
        if direction:
            out.append(pn.pane.Alert(_md_escape(direction), alert_type="warning", css_classes=["compare-direction"],
                                     sizing_mode="stretch_width"))
        return [*out, pn.FlexBox(*panes, flex_wrap="wrap", sizing_mode="stretch_width", css_classes=["compare-row"])]

    def __panel__(self):
        labels = list(self.session.param.checkpoint.objects)
        picker = _NoneSelect.from_param(self.param.other, name="Compare with (B)", css_classes=["compare-picker"],
                                        width=min(520, max(220, 8 * max(map(len, [*labels, self.CHOOSE])) + 60)))
        return pn.Column(picker, self._box, sizing_mode="stretch_width")


class AnalysisView(LazyTab):
    """Analyses of this sentence's trace from `workbench.analysis`: head statistics and decoder rollout."""

    analysis = param.Selector(default="head statistics", objects=["head statistics", "decoder rollout"], doc=(
        "What to show of every head at once: one statistic per head (table and heatmaps), or attention rolled out "
        "through the decoder's layers."))
    stat = param.Selector(default="entropy", objects=["entropy", "entropy_norm", "max", "distance", "diag_distance",
                                                      "self", "prev", "next", "first", "eos", "punct", "monotonic"],
                          doc=("Which head statistic colours the heatmaps: how spread its attention is (entropy), its "
                               "largest weight, how far it looks, or how much goes to itself, the previous or next "
                               "token, the first, the end, punctuation, or in order."))

    title = "Analysis"
    redraws = ("analysis", "stat")
    url = {"analysis": "an", "stat": "stat"}

    def inputs(self):
        r = self.session.result
        return "*Nothing to analyse yet.*" if r is None else (r, self.analysis, self.stat)

    def compute(self, r, analysis, stat):
        trace = r.trace.to(dtype=torch.float32)
        if analysis == "head statistics":
            table = head_stats(trace, pad_id=trace.meta.get("pad_id", 0), eos_id=trace.meta.get("eos_id", 2))
            return head_stats_view(table, stat if stat in table.summary().columns else "entropy")
        return decoder_rollout_view(decoder_rollout(trace), src_tokens=list(r.src_pieces),
                                    tgt_tokens=list(r.out_pieces))

    def render(self, fig):
        return [pn.pane.Markdown(link_terms(ANALYSIS_HOW_TO_READ), css_classes=["analysis-note"],
                                 sizing_mode="stretch_width"), pn.pane.Bokeh(fig, sizing_mode="stretch_width")]

    def __panel__(self):
        controls = pn.Row(pn.widgets.RadioButtonGroup.from_param(self.param.analysis, name=""),
                          pn.widgets.Select.from_param(self.param.stat, name="Statistic", width=160))
        return pn.Column(controls, self._box, sizing_mode="stretch_width")


def _select(r, kind: str) -> dict:
    """Query labels: cross-attention rows are named by the token each step PRODUCED (alignment reading)."""
    return {"tgt_tokens": list(r.out_pieces)} if kind == "cross" else {}


def _md_escape(text: str) -> str:
    """Markdown/HTML-safe display of user text (control characters shown as escapes)."""
    cleaned = "".join(c if c.isprintable() or c == " " else f"\\x{ord(c):02x}" for c in text)
    for ch in "\\`*_{}[]<>()#+-!|":
        cleaned = cleaned.replace(ch, "\\" + ch)
    return cleaned


__all__ = ["AblationPanel", "AnalysisView", "AttentionView", "CompareView", "InternalsView", "LazyTab",
           "OutputPanel", "SourcePanel"]

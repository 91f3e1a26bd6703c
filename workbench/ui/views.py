"""Small Panel components over one `Session`: each owns its widgets and redraws only what it shows.

Charts come from `workbench.charts` (data in, Bokeh/Altair out); nothing here draws by hand. Widgets
are built with `from_param`, so the store stays the one source of truth (and the URL syncs to it).
Every view catches chart errors and shows them as text: a view may fail, the page does not.
"""

from __future__ import annotations

import logging

import panel as pn
import param
from bokeh import events

from ..analysis.head_stats import head_stats
from ..analysis.rollout import decoder_rollout
from ..charts import (
    attention_heatmap,
    compare_traces,
    head_view,
    lr_schedule_chart,
    mask_view,
    model_view,
    positional_encoding_view,
    to_html,
    training_curves_chart,
)
from ..charts.analysis import decoder_rollout_view, head_stats_view
from ..heads import n_heads as heads_of
from . import loader
from .session import KINDS, Request, Session, compute, first_loadable, fmt_logp, head_label

log = logging.getLogger(__name__)

KIND_NAMES = {"enc_self": "encoder self", "dec_self": "decoder self", "cross": "cross"}
VIEW_NAMES = {"heatmap": "heatmap", "lines": "head view (lines)", "grid": "model view (grid)"}


def _fail(what: str, exc: Exception) -> pn.pane.Alert:
    log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
    return pn.pane.Alert(f"{what} could not be drawn: {exc}", alert_type="warning", css_classes=["view-error"])


class SourcePanel(pn.viewable.Viewer):
    """Checkpoint picker, sentence, decoding settings and the optional teacher-forced target."""

    session = param.ClassSelector(class_=Session)

    def __panel__(self):
        s = self.session
        picker = pn.widgets.Select.from_param(s.param.checkpoint, name="Checkpoint", css_classes=["ckpt-picker"],
                                              width=260)
        # TextInput commits on Enter or blur; max_length above the store's own cut so its message shows.
        sentence = pn.widgets.TextInput.from_param(s.param.sentence, name="Source sentence (Enter to translate)",
                                                   max_length=50_000, css_classes=["sentence-input"],
                                                   sizing_mode="stretch_width")
        target = pn.widgets.TextInput.from_param(
            s.param.target, name="Target for teacher forcing (empty: translate)", max_length=50_000,
            css_classes=["target-input"], sizing_mode="stretch_width")
        beam = pn.widgets.IntSlider.from_param(s.param.beam, name="Beam size (1 = greedy)", width=170,
                                               css_classes=["beam-slider"])
        alpha = pn.widgets.FloatSlider.from_param(s.param.alpha, name="Length penalty α", width=170)
        return pn.Column(pn.Row(picker, sentence, sizing_mode="stretch_width"),
                         pn.Row(target, beam, alpha, sizing_mode="stretch_width"), sizing_mode="stretch_width")


class OutputPanel(pn.viewable.Viewer):
    """The translation, its log-probability, timing, and any message about the input."""

    session = param.ClassSelector(class_=Session)

    def __init__(self, **params):
        super().__init__(**params)
        self._text = pn.pane.Markdown("", css_classes=["translation"], sizing_mode="stretch_width")
        self._message = pn.pane.Alert("", alert_type="info", visible=False, css_classes=["message"],
                                      sizing_mode="stretch_width")
        self._spinner = pn.indicators.LoadingSpinner(value=False, width=24, height=24, visible=False,
                                                     css_classes=["busy"])
        self._status = pn.pane.Markdown("", css_classes=["status"], width=90,
                                        styles={"color": "#999", "font-size": "11px"})
        self.session.param.watch(self._update, ["result", "message", "busy", "version"])
        self._update()

    def _update(self, *_):
        s = self.session
        r = s.result
        if r is None:
            self._text.object = "**Translation:** –"
        else:
            label = "Target (teacher-forced)" if r.forced else "Translation"
            self._text.object = (f"**{label}:** {_md_escape(r.text) or '(empty output)'}  \n"
                                 f"<small>log p = {fmt_logp(r.log_prob)} over {r.n_tokens} tokens · "
                                 f"{len(r.src_pieces)} source tokens · {r.seconds * 1000:.0f} ms</small>")
        error = s.message.startswith(("Cannot", "The model", "No workbench", "Type a"))
        text = "  \n".join(_md_escape(line) for line in s.message.splitlines())
        self._message.param.update(object=text, visible=bool(s.message), alert_type="danger" if error else "info")
        self._spinner.param.update(value=s.busy, visible=s.busy)
        self._status.object = f"version={s.version}"

    def __panel__(self):
        return pn.Column(pn.Row(self._text, self._spinner, self._status, sizing_mode="stretch_width"), self._message,
                         sizing_mode="stretch_width")


class AttentionView(pn.viewable.Viewer):
    """Encoder self / decoder self / cross attention per layer and head, as heatmap, lines or grid.

    Tapping a heatmap row or choosing a token selects it (highlighted in every view); tapping a grid
    tile selects that layer and head, which the ablation panel then acts on.
    """

    session = param.ClassSelector(class_=Session)

    def __init__(self, **params):
        super().__init__(**params)
        s = self.session
        self._kind = pn.widgets.RadioButtonGroup.from_param(s.param.kind, options={v: k for k, v in KIND_NAMES.items()},
                                                            name="", css_classes=["kind-picker"])
        self._layer = pn.widgets.Select(label="Layer", options=[0], value=0, width=90, css_classes=["layer-picker"])
        self._head = pn.widgets.Select(label="Head", options={"all (mean)": -1}, value=-1, width=110,
                                       css_classes=["head-picker"])
        self._token = pn.widgets.Select(label="Highlight token", options={"none": -1}, value=-1, width=170,
                                        css_classes=["token-picker"])
        self._words = pn.widgets.Checkbox.from_param(s.param.words, name="words (merge sub-words)")
        self._view = pn.widgets.RadioButtonGroup.from_param(s.param.view, options={v: k for k, v in VIEW_NAMES.items()},
                                                            name="", css_classes=["view-picker"])
        self._pane = pn.pane.Bokeh(None, css_classes=["attention-figure"])
        self._box = pn.Column(self._pane, sizing_mode="stretch_width")
        self._export = pn.widgets.FileDownload(callback=self._html, filename="attention.html",
                                               label="Export view (offline HTML)", color="light",
                                               css_classes=["export-html"], width=220)
        self.figure = None
        for w, name in ((self._layer, "layer"), (self._head, "head"), (self._token, "token")):
            w.param.watch(lambda e, name=name: setattr(self.session, name, e.new), "value")
        s.param.watch(self._redraw, ["version", "kind", "layer", "head", "token", "words", "view"])
        self._redraw()

    def _sync_widgets(self) -> None:
        s, r = self.session, self.session.result
        if r is None:
            return
        depth = r.trace.layers(s.kind)
        n_heads = r.trace.attention(s.kind, 0).size(1) if depth else 0
        queries = r.src_pieces if s.kind == "enc_self" else r.out_pieces
        self._layer.param.update(options=list(range(depth)), value=s.layer)
        self._head.param.update(options={"all (mean)": -1, **{f"head {h}": h for h in range(n_heads)}}, value=s.head)
        self._token.param.update(options={"none": -1, **{f"{i}: {t}": i for i, t in enumerate(queries)}},
                                 value=s.token if s.token < len(queries) else -1)

    def _redraw(self, *_):
        r = self.session.result
        self._sync_widgets()
        if r is None:
            self.figure = None
            self._box.objects = [pn.pane.Markdown("*No attention to show yet.*")]
            return
        try:
            fig = self._build(r)
        except Exception as exc:
            self.figure = None
            self._box.objects = [_fail("This view", exc)]
            return
        self.figure = fig
        self._pane.object = fig
        if self._box.objects != [self._pane]:  # re-setting the same children re-renders the column
            self._box.objects = [self._pane]

    def _build(self, r):
        s = self.session
        heads = None if s.head < 0 else s.head
        token = None if s.token < 0 else s.token
        select = _select(r, s.kind)
        if s.view == "heatmap":
            fig = attention_heatmap(r.trace, s.kind, s.layer, heads, words=s.words, highlight=token, select=select)
            fig.name = "attn_fig"
            fig.on_event(events.Tap, self._tapped_row)
            return fig
        if s.view == "lines":
            return head_view(r.trace, s.kind, s.layer, heads, words=s.words, highlight=token, select=select,
                             top_k=8 if len(r.src_pieces) > 60 else None)
        grid = model_view(r.trace, s.kind, words=s.words, select=select)
        tiles = grid.select_one({"name": f"model_view_tiles_{s.kind}"})
        if tiles is not None:
            tiles.selected.on_change("indices", lambda attr, old, new, src=tiles: self._tapped_tile(src, new))
        return grid

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

    def _html(self):
        from io import StringIO


        return StringIO(to_html(self.figure) if self.figure is not None else "<p>nothing to export</p>")

    def __panel__(self):
        controls = pn.Row(self._kind, self._layer, self._head, self._token, self._words, sizing_mode="stretch_width")
        return pn.Column(controls, pn.Row(self._view, self._export), self._box, sizing_mode="stretch_width")


class AblationPanel(pn.viewable.Viewer):
    """Zero heads (picked on the grid or from the list); the new output beside the original, Δ log p."""

    session = param.ClassSelector(class_=Session)

    def __init__(self, **params):
        super().__init__(**params)
        s = self.session
        self._choice = pn.widgets.MultiChoice(label="Ablated heads (kind:layer:head)", options=[], value=list(s.ablate),
                                              css_classes=["ablate-choice"], sizing_mode="stretch_width")
        self._add = pn.widgets.Button(label="Ablate the selected head", color="primary",
                                      css_classes=["ablate-btn"])
        self._reset = pn.widgets.Button(label="Reset", css_classes=["reset-btn"])
        self._out = pn.pane.Markdown("", css_classes=["ablation-out"], sizing_mode="stretch_width")
        self._add.on_click(lambda e: self.session.toggle_head())
        self._reset.on_click(lambda e: self.session.reset_ablation())
        self._choice.param.watch(lambda e: setattr(self.session, "ablate", list(e.new)), "value")
        s.param.watch(self._update, ["ablate", "ablation", "version", "checkpoint"])
        self._update()

    def _update(self, *_):
        s = self.session
        tm = s.model
        if tm is not None:
            cfg = tm.model.cfg
            depth = {"enc_self": cfg.enc_layers, "dec_self": cfg.dec_layers, "cross": cfg.dec_layers}
            options = [head_label(k, layer, h) for k in KINDS for layer in range(depth[k])
                       for h in range(heads_of(cfg, k))]
            self._choice.options = options
            self._choice.value = [h for h in s.ablate if h in options]
        a, r = s.ablation, s.result
        if not s.ablate or r is None:
            self._out.object = ("Select a head (grid view: tap a tile; or the layer/head pickers) and press "
                                "**Ablate**, or choose heads in the list. Ablated heads output zeros.")
            return
        if a is None:
            self._out.object = "*Ablating…*"
            return
        same = "same as the original" if a.text == r.text else "**changed**"
        self._out.object = (
            f"| | output | log p |\n|---|---|---|\n"
            f"| original | {_md_escape(r.text) or '(empty)'} | {fmt_logp(r.log_prob)} |\n"
            f"| ablated ({len(a.heads)} heads) | {_md_escape(a.text) or '(empty)'} ({same}) | "
            f"{fmt_logp(a.log_prob)} |\n\n"
            f"Log-probability of the original output under ablation: {fmt_logp(a.original_log_prob)} "
            f"(**Δ = {a.delta:+.3f}**)")

    def __panel__(self):
        return pn.Column(pn.Row(self._add, self._reset), self._choice, self._out, sizing_mode="stretch_width")


class InternalsView(pn.viewable.Viewer):
    """Positional encodings, the masks of a padded batch, the LR schedule next to the logged LR, training curves."""

    session = param.ClassSelector(class_=Session)
    warmup = param.Integer(default=4000, bounds=(1, None))
    factor = param.Number(default=1.0, bounds=(0.0, None))
    steps = param.Integer(default=20000, bounds=(10, None))

    def __init__(self, **params):
        super().__init__(**params)
        self._box = pn.Column(sizing_mode="stretch_width")
        self._masks_box = pn.Column()
        self._lr = pn.Column()
        self._loaded_for = None
        self._shown = False  # built on first view: the tab's figures cost more than a translation
        self.session.param.watch(self._refresh, ["checkpoint", "version"])
        self.param.watch(self._refresh_lr, ["warmup", "factor", "steps"])

    def show(self) -> None:
        self._shown = True
        self._refresh()

    def _refresh(self, *_):
        if not self._shown:
            return
        tm = self.session.model
        if tm is None:
            self._loaded_for = None
            self._box.objects = [pn.pane.Markdown("*Load a checkpoint to see its internals.*")]
            return
        self._masks_box.objects = [self._try("Masks", self._masks, tm)]  # the only part that follows the sentence
        if self._loaded_for == self.session.checkpoint:
            return
        self._loaded_for = self.session.checkpoint
        train = dict(tm.meta.get("train") or {})
        log_rows = self._log()
        last = max((r.get("step", 0) for r in log_rows), default=0)
        self.param.update(warmup=int(train.get("warmup", self.warmup)), factor=float(train.get("factor", 1.0)),
                          steps=max(10, int(last * 1.2)) if last else self.steps)
        parts = [pn.pane.Markdown("### Positional encodings"), self._try("Positional encodings", self._positions, tm)]
        parts += [pn.pane.Markdown("### Masks of a padded batch (this sentence + two shorter ones)"), self._masks_box]
        parts += [pn.pane.Markdown("### Learning-rate schedule"), self._lr_controls(), self._lr]
        parts += [pn.pane.Markdown("### Training curves stored in the checkpoint"),
                  self._try("Training curves", self._curves, log_rows)]
        self._refresh_lr()
        self._box.objects = parts

    def _log(self):
        try:
            return loader.load_train_log(str(self.session.entries_by_label(self.session.checkpoint)))
        except Exception:
            return []

    def _try(self, what, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:
            return _fail(what, exc)

    def _positions(self, tm):
        r = self.session.result
        length = min(tm.model.cfg.max_positions, max(50, len(r.src_pieces) if r else 50))
        return pn.pane.Bokeh(positional_encoding_view(tm.model.cfg, length=length, model=tm.model))

    def _masks(self, tm):
        import torch


        r = self.session.result
        cfg = tm.model.cfg
        src_ids = tm.src_tokenizer.encode(r.request.sentence)[:40] if r else [5, 6, 7]
        rows = [src_ids + [cfg.eos_id], src_ids[: len(src_ids) // 2] + [cfg.eos_id], src_ids[:2] + [cfg.eos_id]]
        tgt_rows = [[cfg.start_id, *list(r.out_ids[:-1])[:40]] if r else [cfg.start_id, 5]]
        tgt_rows += [tgt_rows[0][: max(1, len(tgt_rows[0]) // 2)], tgt_rows[0][:2]]
        pad = lambda rs: torch.tensor([x + [cfg.pad_id] * (max(map(len, rs)) - len(x)) for x in rs])
        return pn.pane.Bokeh(mask_view(pad(rows), pad(tgt_rows), pad_id=cfg.pad_id))

    def _lr_controls(self):
        return pn.Row(pn.widgets.IntInput.from_param(self.param.warmup, name="warmup", width=110),
                      pn.widgets.FloatInput.from_param(self.param.factor, name="factor", width=110),
                      pn.widgets.IntInput.from_param(self.param.steps, name="steps shown", width=110))

    def _refresh_lr(self, *_):
        tm = self.session.model
        if tm is None:
            return

        d = tm.model.cfg.d_model
        schedules = {f"noam(d={d}, warmup={self.warmup}, factor={self.factor:g})":
                     {"name": "noam", "d_model": d, "warmup": self.warmup, "factor": self.factor}}
        log_rows = [r for r in self._log() if "lr" in r]
        try:
            chart = lr_schedule_chart(schedules, steps=self.steps, log=log_rows or None)
            formula = ("lr(step) = factor · d_model<sup>-0.5</sup> · min(step<sup>-0.5</sup>, "
                       "step · warmup<sup>-1.5</sup>)")
            self._lr.objects = [pn.pane.HTML(formula), pn.pane.Vega(chart)]
        except Exception as exc:
            self._lr.objects = [_fail("Learning-rate chart", exc)]

    def _curves(self, log_rows):
        if not log_rows:
            return pn.pane.Markdown("*This checkpoint stores no training log.*")

        return pn.pane.Vega(training_curves_chart(log_rows))

    def __panel__(self):
        return self._box


class CompareView(pn.viewable.Viewer):
    """Two checkpoints on the same sentence: B is teacher-forced on A's output, so the rows line up."""

    session = param.ClassSelector(class_=Session)
    other = param.Selector(default=None, objects=[])

    def __init__(self, **params):
        super().__init__(**params)
        labels = list(self.session.param.checkpoint.objects)
        self.param.other.objects = labels
        others = [e for e in self.session.entries if e.label != self.session.checkpoint]
        if others:
            self.other = first_loadable(others)
        elif labels:
            self.other = labels[0]
        self._box = pn.Column(sizing_mode="stretch_width")
        self._picker = pn.widgets.Select.from_param(self.param.other, name="Compare with (B)", width=260,
                                                    css_classes=["compare-picker"])
        self.session.param.watch(self._redraw, ["version", "kind", "layer", "head", "words"])
        self.param.watch(self._redraw, ["other"])
        self._shown = False

    def _redraw(self, *_):
        if not self._shown:
            return
        s, r = self.session, self.session.result
        if r is None or self.other is None:
            self._box.objects = [pn.pane.Markdown("*Nothing to compare yet.*")]
            return

        path = str(s.entries_by_label(self.other))
        ids = ()
        try:  # same target vocabulary: B reads A's exact pieces; otherwise A's text, aligned on words
            if loader.load_model(path).tgt_tokenizer.pieces(list(r.out_ids)) == list(r.out_pieces):
                ids = tuple(r.out_ids)
        except Exception:
            pass  # compute() below reports an unloadable checkpoint
        out = compute(Request(path, r.request.sentence, target=r.text or r.request.target or ".", beam=1,
                              target_ids=ids))
        if out.error or out.result is None:
            self._box.objects = [pn.pane.Alert(out.error or "B produced no result", alert_type="warning")]
            return
        b = out.result
        try:
            kind = s.kind
            layer_b = min(s.layer, b.trace.layers(kind) - 1)
            heads = None if s.head < 0 else s.head
            n_heads_b = b.trace.attention(kind, 0).size(1)
            fig = compare_traces(r.trace, b.trace, kind, s.layer, heads, layer_b=layer_b,
                                 heads_b=None if heads is None or heads >= n_heads_b else heads, words=s.words,
                                 select_a=_select(r, kind), select_b=_select(b, kind),
                                 labels=(f"A = {s.checkpoint}", f"B = {self.other}"))
            note = pn.pane.Markdown(f"B reads A's output (teacher-forced): log p(A's output | B) = "
                                    f"{fmt_logp(b.log_prob)} vs {fmt_logp(r.log_prob)} under A.")
            self._box.objects = [note, pn.pane.Bokeh(fig)]
        except Exception as exc:
            self._box.objects = [_fail("Comparison", exc)]

    def show(self):
        self._shown = True
        self._redraw()

    def __panel__(self):
        return pn.Column(self._picker, self._box, sizing_mode="stretch_width")


class AnalysisView(pn.viewable.Viewer):
    """Analyses of this sentence's trace from `workbench.analysis`: head statistics and decoder rollout.

    Further analyses (alignment, attribution, beam replay, logit lens) join as entries of ANALYSES.
    """

    session = param.ClassSelector(class_=Session)
    analysis = param.Selector(default="head statistics", objects=["head statistics", "decoder rollout"])
    stat = param.Selector(default="entropy", objects=["entropy", "entropy_norm", "max", "distance", "diag_distance",
                                                      "self", "prev", "next", "first", "eos", "punct", "monotonic"])

    def __init__(self, **params):
        super().__init__(**params)
        self._box = pn.Column(sizing_mode="stretch_width")
        self._shown = False
        self.session.param.watch(self._redraw, ["version"])
        self.param.watch(self._redraw, ["analysis", "stat"])

    def show(self) -> None:
        self._shown = True
        self._redraw()

    def _redraw(self, *_):
        if not self._shown:
            return
        r = self.session.result
        if r is None:
            self._box.objects = [pn.pane.Markdown("*Nothing to analyse yet.*")]
            return
        try:
            self._box.objects = [pn.pane.Bokeh(self._build(r))]
        except Exception as exc:
            self._box.objects = [_fail(self.analysis.capitalize(), exc)]

    def _build(self, r):
        import torch

        trace = r.trace.to(dtype=torch.float32)
        if self.analysis == "head statistics":
            tm = self.session.model
            pad, eos = (tm.model.cfg.pad_id, tm.model.cfg.eos_id) if tm is not None else (0, 2)
            stat = self.stat
            table = head_stats(trace, pad_id=pad, eos_id=eos)
            if stat not in table.summary().columns:
                stat = "entropy"
            return head_stats_view(table, stat)

        return decoder_rollout_view(decoder_rollout(trace), src_tokens=list(r.src_pieces),
                                    tgt_tokens=list(r.out_pieces))

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


__all__ = ["AblationPanel", "AnalysisView", "AttentionView", "CompareView", "InternalsView", "OutputPanel",
           "SourcePanel"]

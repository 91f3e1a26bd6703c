"""The "Why" tab: why the model produced one output token, and which parts of the network carry a change.

- Tap an output token: bars of its direct logit attribution to every decoder component (embeddings, each
  head by layer and kind, FFNs, biases; they sum to the logit), and for each cross-attention head the source
  tokens it read (`analysis.decompose`).
- A corrupted source (prefilled: the sentence with one noun swapped, `analysis.contrast.noun_swaps`; any text
  with the same number of tokens): activation patching of the clean output's log-probability, encoder stream
  by layer x source position and every head by query position (`analysis.patching`), normalized so 1 = as
  clean and 0 = as corrupted. While the sweeps run, a bar and "patched N of M sites" follow them, batch by
  batch (reported from the worker, applied on the event loop).

A `LazyTab`: computed only while shown, off the event loop. Added by `Workbench(extra_tabs=[TAB])`.
"""

from __future__ import annotations

import asyncio
import contextvars

import panel as pn
import param
import torch

from ..analysis.contrast import noun_swaps
from ..analysis.decompose import direct_logit_attribution, source_attribution
from ..analysis.patching import log_prob, patching_sweep
from ..charts.why import logit_attribution_bars, patching_heatmap
from . import loader
from .views import LazyTab, _md_escape, _pane, _stretch

MAX_BUTTONS = 20  # up to this many output tokens are tapped as buttons; longer outputs get a list


class WhyView(LazyTab):
    """Direct logit attribution of the chosen output token, and patching against a corrupted source."""

    position = param.Selector(default=0, objects={"0": 0}, doc="The output token to explain")
    corrupted = param.String(default="", doc="The sentence with one word changed (same number of tokens)")

    title = "Why"
    redraws = ("position", "corrupted")

    def __init__(self, **params):
        super().__init__(**params)
        self._prefilled_for = None  # the sentence whose swap `corrupted` holds (None: typed by the user)
        self._prefilling = False
        self._bar = pn.indicators.Progress(value=0, max=1, visible=False, width=240, css_classes=["why-progress-bar"])
        self._progress_text = pn.pane.Markdown("", visible=False, css_classes=["why-progress"], margin=(0, 10))
        self.session.param.watch(self._follow, ["result"])
        self._follow()

    def _follow(self, *_) -> None:
        r = self.session.result
        if r is None:
            return
        with param.parameterized.batch_call_watchers(self):
            self.param.position.objects = {f"{i}: {p}": i for i, p in enumerate(r.out_pieces)}
            if self.position >= len(r.out_pieces):
                self.position = 0

    def _changed(self, *events) -> None:
        if not self._prefilling:  # the prefill comes with the answer that made it: no second run
            super()._changed(*events)

    def inputs(self):
        r = self.session.result
        if r is None:
            return "*Nothing to explain yet.*"
        prefill = self._prefilled_for is not None and self._prefilled_for != r.request.sentence or not self.corrupted
        self._show_progress(self._generation, None)
        return r, self.position, None if prefill else self.corrupted, self._reporter()

    def _reporter(self):
        """report(what, done, total) for the worker: applied on the event loop when served, directly when inline."""
        gen = self._generation
        if not self.session.background:
            return lambda what, done, total: self._show_progress(gen, (what, done, total))
        loop, ctx = asyncio.get_running_loop(), contextvars.copy_context()  # the page's document comes along
        return lambda what, done, total: loop.call_soon_threadsafe(self._show_progress, gen, (what, done, total),
                                                                   context=ctx)

    def _show_progress(self, gen: int, step: tuple[str, int, int] | None) -> None:
        """Show the sweep's progress (None: hide it); a report from an older request is dropped."""
        if gen != self._generation:
            return
        if step is None:
            self._bar.visible = self._progress_text.visible = False
            return
        what, done, total = step
        self._bar.value = 0  # the value's bounds follow max: lower it first
        self._bar.max = max(total, 1)
        self._bar.param.update(value=min(done, total), visible=True)
        self._progress_text.param.update(object=f"Patching {what}: patched {done} of {total} sites", visible=True)

    def _done(self, gen: int, answer) -> None:
        super()._done(gen, answer)
        if gen == self._generation:
            self._show_progress(gen, None)

    def compute(self, r, position, corrupted, report=None):
        tm = loader.load_model(r.request.path)
        model, cfg = tm.model, tm.model.cfg
        src = torch.tensor([list(r.src_ids)], device=tm.device)
        tgt = torch.tensor([[cfg.start_id, *r.out_ids[:-1]]], device=tm.device)
        token = r.out_ids[position]
        piece = r.out_pieces[position]
        out = {"corrupted": corrupted, "prefilled": corrupted is None}
        dla = direct_logit_attribution(model, src, tgt, position, token)
        out["bars"] = _stretch(logit_attribution_bars(
            dla, title=f"why {piece!r} at output position {position}: direct logit attribution "
                       f"(sums to its logit, {dla.logit:.2f})"))
        reads = source_attribution(model, src, tgt, position, token)  # (L, H, S)
        layers, heads = reads.shape[:2]
        rows = [f"cross {i}.{h}" for i in range(layers) for h in range(heads)]
        out["reads"] = _stretch(patching_heatmap(  # diverging: a head can push the logit down through a token
            reads.reshape(layers * heads, -1).numpy(), rows, list(r.src_pieces), value_label="logit",
            title=f"what each cross-attention head read for {piece!r} (logit share per source token)"))
        if corrupted is None:
            pairs = noun_swaps(tm, [r.request.sentence])
            corrupted = pairs[0].corrupted_text if pairs else ""
            out["corrupted"] = corrupted
        out["patching"] = self._patching(tm, r, src, tgt, corrupted, report)
        return out

    def _patching(self, tm, r, src, tgt, corrupted: str, report=None):
        """(note, [figures]) of patching the clean output's log p against `corrupted`."""
        if not corrupted.strip():
            return ("No noun of the swap list in this sentence: type the sentence with one word changed "
                    "(the same number of tokens) to patch.", [])
        c_ids, _ = tm.encode_source(corrupted)
        if c_ids == list(r.src_ids):
            return "The changed sentence is the same as the original: change one word.", []
        if len(c_ids) != len(r.src_ids):
            return (f"The changed sentence has {len(c_ids)} tokens and the original {len(r.src_ids)}: patching needs "
                    "the same positions, so change one word for one of the same length in tokens.", [])
        c_src = torch.tensor([c_ids], device=tm.device)
        metric = log_prob(list(r.out_ids))
        sweeps = [patching_sweep(tm.model, src, tgt, corrupted_src=c_src, sites=s, metric=metric,
                                 progress=None if report is None else
                                 (lambda done, total, what=what: report(what, done, total)))
                  for s, what in (("resid_enc", "encoder stream (1 of 2)"), ("head", "heads (2 of 2)"))]
        clean, corr = sweeps[0].clean_metric, sweeps[0].corrupted_metric
        note = (f"log p of the output: {clean:.3f} clean, {corr:.3f} with the changed source. Each cell runs the "
                "clean input with one activation taken from the changed run (1 = as clean, 0 = as changed).")
        figs = []
        for sweep, what, cols in ((sweeps[0], "encoder stream: layer x source position", r.src_pieces),
                                  (sweeps[1], "heads x query position", None)):
            try:
                values = sweep.normalized().numpy()
            except ValueError:  # the change does not move the metric: show it raw
                values = sweep.values.numpy()
            labels = list(cols) if cols is not None and len(cols) == values.shape[1] else [str(p) for p in
                                                                                        sweep.positions]
            figs.append(_stretch(patching_heatmap(values, sweep.rows, labels, title=f"patching, {what}")))
        return note, figs

    def render(self, answer):
        if answer["prefilled"]:
            self._prefilled_for = self.session.result.request.sentence if self.session.result else None
            self._prefilling = True
            try:
                self.corrupted = answer["corrupted"]
            finally:
                self._prefilling = False
        note, figs = answer["patching"]
        return [pn.pane.Bokeh(answer["bars"], sizing_mode="stretch_width"),
                pn.pane.Bokeh(answer["reads"], sizing_mode="stretch_width"),
                pn.pane.Markdown("### Patching against a changed source"),
                pn.pane.Markdown(_md_escape(note), css_classes=["why-patching-note"], sizing_mode="stretch_width"),
                *[_pane(f, "Patching") for f in figs]]

    def _user_typed(self, event) -> None:
        if not self._prefilling:
            self._prefilled_for = None

    def __panel__(self):
        r = self.session.result
        many = r is not None and len(r.out_pieces) > MAX_BUTTONS
        tokens = (pn.widgets.Select.from_param(self.param.position, name="Output token", width=240)
                  if many else pn.widgets.RadioButtonGroup.from_param(self.param.position, name="",
                                                                      css_classes=["why-tokens"]))
        box = pn.widgets.TextInput.from_param(self.param.corrupted, name="Changed source (Enter to patch)",
                                              css_classes=["why-corrupted"], sizing_mode="stretch_width")
        box.param.watch(self._user_typed, "value")
        return pn.Column(pn.pane.Markdown("Tap an output token to see which components wrote it."), tokens, box,
                         pn.Row(self._bar, self._progress_text), self._box, sizing_mode="stretch_width")


TAB = ("Why", lambda session: WhyView(session=session))
"""The tab as `Workbench(extra_tabs=[TAB])` takes it."""

"""The "Why" tab: why the model produced one output token, and which parts of the network carry a change.

- Pick an output token (buttons for short outputs, a list for long ones; it follows the output length): its
  direct logit attribution as a layer x head grid per attention kind plus sorted bars for embeddings, FFNs and
  biases (they sum to the logit), and what each cross-attention head read from each source token
  (`analysis.decompose`). Interactive work: one forward pass, on the page's interactive lane.
- A changed source (prefilled for each new sentence: one noun swapped, `analysis.contrast.noun_swaps`; any
  text with the same number of tokens): patching of the output's log p, computed once per (sentence, changed
  source), not per tapped token. Long outputs start with attribution patching (`analysis.patching.
  attribution_patching`: one forward and backward pass, the first-order estimate of the sweep) and offer the
  exact sweep (`patching_sweep`) with a progress bar and a Stop button; short ones get the exact sweep at once.
  Maps show the effect, the share of the change a site carries (0 = no effect, white; 1 = all of it), on a
  diverging scale; encoder and decoder apart. Heavy work: the page's heavy lane (one at a time per page).

Added by `Workbench(extra_tabs=[TAB])`.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import panel as pn
import param
import torch

from ..analysis.contrast import NOUNS, NOUNS_EN, noun_swaps
from ..analysis.decompose import direct_logit_attribution, source_attribution
from ..analysis.patching import attribution_patching, build_sites, log_prob, patching_sweep
from ..charts.why import logit_attribution_grid, patching_heatmap
from ..core.batching import decoder_input
from .views import LazyTab, _fail, _md_escape, _stretch

MAX_BUTTONS = 20  # up to this many output tokens are picked with buttons; longer outputs get a list
EXACT_AT_ONCE = 600  # up to this many patching sites the exact sweep runs at once; above, the estimate first
CACHED = 8  # patching answers kept per page (sentence x changed source)


# ------------------------------------------------------------------------------------- the work (off the loop)


def explain_token(r, position: int) -> dict:
    """Direct logit attribution of output `position` of result `r` and the cross heads' reads (figures)."""
    tm = r.model
    model, cfg = tm.model, tm.model.cfg
    src = torch.tensor([list(r.src_ids)], device=tm.device)
    tgt = torch.tensor([decoder_input(r.out_ids, cfg.start_id)], device=tm.device)
    token, piece = r.out_ids[position], r.out_pieces[position]
    dla = direct_logit_attribution(model, src, tgt, position, token)
    grid = logit_attribution_grid(dla, title=f"why {piece!r} at output position {position} (logit {dla.logit:.2f})")
    reads = source_attribution(model, src, tgt, position, token)  # (L, H, S)
    layers, heads = reads.shape[:2]
    rows = [f"cross:{i}:{h}" for i in range(layers) for h in range(heads)]
    reads_fig = patching_heatmap(reads.reshape(layers * heads, -1).numpy(), rows, list(r.src_pieces),
                                 value_label="logit", axis_labels=("cross-attention head", "source token"),
                                 title=f"what each cross-attention head read for {piece!r} "
                                       "(logit share per source token)")
    return {"dla": dla, "grid": _stretch(grid), "reads": _stretch(reads_fig)}


@dataclass
class Patching:
    """Patching of one (sentence, changed source): the maps' data, not figures (cached across token taps)."""

    corrupted: str
    note: str
    maps: list[tuple[str, np.ndarray, list[str], list[str], tuple[str, str]]] = field(default_factory=list)
    exact: bool = False
    sites: int = 0


def site_count(r) -> int:
    """How many sites the exact sweeps patch (encoder stream plus every head at every query position)."""
    model = r.model.model
    s, t = len(r.src_ids), len(r.out_ids)
    return len(build_sites(model, "resid_enc", s, t)[2]) + len(build_sites(model, "head", s, t)[2])


def patch(r, corrupted: str | None, exact: bool | None = None, ticket=None) -> Patching:
    """Patching of the output's log p against `corrupted` (None: prefill it with a noun swap). `exact`: the sweep
    (progress reported per batch through `ticket`, which also stops it); False: attribution patching; None:
    the sweep when it is small (EXACT_AT_ONCE sites), else the estimate."""
    tm = r.model
    if corrupted is None:
        corrupted = prefill(tm, r.request.sentence, len(r.src_ids))
        if ticket is not None:
            ticket.check()
    if not corrupted.strip():
        return Patching(corrupted, "No noun of the swap list in this sentence: type the sentence with one word "
                                   "changed (the same number of tokens) to patch.")
    c_ids, _ = tm.encode_source(corrupted)
    if c_ids == list(r.src_ids):
        return Patching(corrupted, "The changed sentence is the same as the original: change one word.")
    if len(c_ids) != len(r.src_ids):
        return Patching(corrupted, f"The changed sentence has {len(c_ids)} tokens and the original {len(r.src_ids)}: "
                                   "patching needs the same positions, so change one word for one of the same "
                                   "length in tokens.")
    cfg = tm.model.cfg
    src = torch.tensor([list(r.src_ids)], device=tm.device)
    tgt = torch.tensor([decoder_input(r.out_ids, cfg.start_id)], device=tm.device)
    c_src = torch.tensor([c_ids], device=tm.device)
    metric = log_prob(list(r.out_ids))
    n_sites = site_count(r)
    exact = n_sites <= EXACT_AT_ONCE if exact is None else exact
    results = {}
    done_before = 0
    for sites in ("resid_enc", "head"):
        if ticket is not None:
            ticket.check()
        if exact:
            def progress(done, total, before=done_before):
                if ticket is not None:
                    ticket.report(before + done, n_sites)
            results[sites] = patching_sweep(tm.model, src, tgt, corrupted_src=c_src, sites=sites, metric=metric,
                                            progress=progress)
            done_before += int(np.isfinite(results[sites].values.numpy()).sum())
        else:
            results[sites] = attribution_patching(tm.model, src, tgt, corrupted_src=c_src, sites=sites, metric=metric)
    clean, corr = results["head"].clean_metric, results["head"].corrupted_metric
    how = ("exact sweep: each cell runs the clean input with one activation taken from the changed run"
           if exact else "attribution patching, the first-order estimate (one forward and backward pass); "
                         f"run the exact sweep ({n_sites:,} sites) to check it")
    note = (f"log p of the output: {clean:.3f} clean, {corr:.3f} with the changed source. Effect = the share of "
            f"that change a site carries when patched (0 = none, 1 = all of it). {how}.")
    maps = []
    stream = results["resid_enc"]
    names = ["embeddings"] + [f"after layer {i}" for i in range(len(stream.rows) - 1)]
    maps.append(("encoder stream: layer × source token", _effect(stream), names, list(r.src_pieces),
                 ("encoder stream", "source token")))
    heads = results["head"]
    effect = _effect(heads)
    enc = [i for i, row in enumerate(heads.rows) if row.startswith("enc_self")]
    dec = [i for i, row in enumerate(heads.rows) if not row.startswith("enc_self")]
    s, t = len(r.src_ids), len(r.out_ids)
    if enc:
        maps.append(("encoder self-attention heads × source token (query)", effect[enc][:, :s],
                     [heads.rows[i] for i in enc], list(r.src_pieces), ("head", "query: source token")))
    if dec:
        maps.append(("decoder heads (self, cross) × output token (query: the step that produces it)",
                     effect[dec][:, :t], [heads.rows[i] for i in dec], list(r.out_pieces),
                     ("head", "query: output token produced")))
    return Patching(corrupted, note, maps, exact, n_sites)


def prefill(tm, sentence: str, n_src: int, candidates: int = 4) -> str:
    """The sentence with its first listed noun swapped for one that changes the translation (`noun_swaps`),
    trying `candidates` replacements in one batch (not the whole list: each is a translation of the sentence);
    '' when it has none of the listed nouns or no candidate changes the output."""
    words = set(re.findall(r"\w+", sentence))
    for nouns in (NOUNS, NOUNS_EN):
        hit = next((w for w in nouns if w in words), None)
        if hit is not None:
            tries = [hit, *[w for w in nouns if w != hit][:candidates]]
            pairs = noun_swaps(tm, [sentence], nouns=tries, max_len=max(60, n_src))
            return pairs[0].corrupted_text if pairs else ""
    return ""


def _effect(result) -> np.ndarray:
    """(clean - value) / (clean - corrupted): 0 = the site changes nothing, 1 = it carries the whole change;
    in raw log p when the change moves nothing."""
    v = result.values.numpy()
    den = result.clean_metric - result.corrupted_metric
    return (result.clean_metric - v) / den if den else result.clean_metric - v


# --------------------------------------------------------------------------------------------- the view


class WhyView(LazyTab):
    """Direct logit attribution of the chosen output token, and patching against a changed source."""

    position = param.Selector(default=0, objects={"0": 0}, doc="The output token to explain")
    corrupted = param.String(default="", doc="The sentence with one word changed (same number of tokens)")

    title = "Why"
    follows = ("version",)
    redraws = ("position",)
    url = {"position": "wtok", "corrupted": "wsrc"}
    url_late = ("position", "corrupted")

    def bind_link(self, link) -> None:
        """As `LazyTab`'s; an empty changed source in a link means "prefill it" (the page's own default)."""
        link.bind("wtok", self, "position", late=True)
        link.bind("wsrc", self, "corrupted", late=True, empty_unset=True)

    def __init__(self, **params):
        super().__init__(**params)
        self._patch_lane = self.session.lane(f"why-patching-{id(self)}", heavy=True)
        self._patch_box = pn.Column(sizing_mode="stretch_width", min_height=60)
        self._cache: OrderedDict[tuple, Patching] = OrderedDict()
        self._sentence = None  # the sentence `corrupted` belongs to
        self._prefill = True  # `corrupted` is to be prefilled for the current sentence
        self._setting = False  # the view itself is writing `corrupted`
        self._patch_stale = True
        self._shown: Patching | None = None
        self._picker = pn.Column(sizing_mode="stretch_width")
        self._picker_many: bool | None = None
        self._bar = pn.indicators.Progress(value=0, max=1, visible=False, width=240, css_classes=["why-progress-bar"])
        self._progress_text = pn.pane.Markdown("", visible=False, css_classes=["why-progress"], margin=(0, 10))
        self._exact = pn.widgets.Button(label="Run the exact sweep", css_classes=["why-exact"], visible=False)
        self._stop = pn.widgets.Button(label="Stop", css_classes=["why-stop"], visible=False, color="danger")
        self._exact.on_click(lambda _e: self.refresh_patching(exact=True))
        self._stop.on_click(lambda _e: self.stop())
        self.param.watch(self._typed, "corrupted")
        self.session.param.watch(self._follow, "result")
        self._follow()

    # -- following the page -----------------------------------------------------------------------
    @property
    def content(self) -> list:
        return [*self._box.objects, *self._patch_box.objects]

    def _follow(self, *_) -> None:
        """A new result: the token picker follows the output; a new sentence resets its changed source."""
        r = self.session.result
        if r is None:
            return
        with param.parameterized.batch_call_watchers(self):
            self.param.position.objects = {f"{i}: {p}": i for i, p in enumerate(r.out_pieces)}
            if self.position >= len(r.out_pieces) or r.request.sentence != self._sentence:
                with param.parameterized.discard_events(self):
                    self.position = 0
        many = len(r.out_pieces) > MAX_BUTTONS
        if many != self._picker_many:
            self._picker_many = many
            self._picker.objects = [
                pn.widgets.Select.from_param(self.param.position, name="Output token", width=260,
                                             css_classes=["why-token-list"]) if many else
                pn.widgets.RadioButtonGroup.from_param(self.param.position, name="", css_classes=["why-tokens"])]
        if r.request.sentence != self._sentence:
            self._sentence = r.request.sentence
            self._prefill = True
            self._set_corrupted("")
        self._patch_stale = True
        if self.active:
            self.refresh_patching()

    def _typed(self, event) -> None:
        if self._setting:
            return
        self._prefill = False
        self._patch_stale = True
        if self.active:
            self.refresh_patching()

    def _set_corrupted(self, text: str) -> None:
        self._setting = True
        try:
            self.corrupted = text
        finally:
            self._setting = False

    @param.depends("active", watch=True)
    def _activated_patching(self) -> None:
        if self.active and self._patch_stale:
            self.refresh_patching()

    # -- token: interactive ---------------------------------------------------------------------
    def inputs(self):
        r = self.session.result
        if r is None:
            return "*Nothing to explain yet.*"
        return r, min(self.position, len(r.out_ids) - 1)

    def compute(self, r, position):
        return explain_token(r, position)

    def render(self, answer):
        return [pn.pane.Bokeh(answer["grid"], sizing_mode="stretch_width", css_classes=["why-dla"]),
                pn.pane.Bokeh(answer["reads"], sizing_mode="stretch_width")]

    # -- patching: heavy, once per (sentence, changed source) ------------------------------------
    def _key(self, r) -> tuple:
        return (r.request.translate_key, None if self._prefill else self.corrupted)

    def refresh_patching(self, exact: bool | None = None) -> None:
        self._patch_stale = False
        r = self.session.result
        self._patch_lane.cancel()
        self._progress(None)
        if r is None:
            self._patch_box.objects = [pn.pane.Markdown("*Nothing to patch yet.*")]
            return
        key = self._key(r)
        cached = self._cache.get(key)
        if cached is not None and (cached.exact or not exact):
            self._show_patching(cached)
            return
        exact = site_count(r) <= EXACT_AT_ONCE if exact is None else exact
        self._patch_box.loading = True
        self._stop.visible = exact
        self._exact.visible = False
        corrupted = None if self._prefill else self.corrupted
        # Analysis work, the estimate too (a forward and backward pass over a long sentence costs several
        # translations): the heavy lane, its own lower-priority threads, one heavy job per page. Measured with the
        # estimate on the interactive pool instead, 2 Why users raised 8 others' translation p95 2.0x.
        self._patch_lane.submit(patch, r, corrupted, exact, done=lambda p: self._patched(key, r, p),
                                failed=self._patch_failed, progress=self._report, stopped=self._stopped)

    def _patched(self, key: tuple, r, p: Patching) -> None:
        self._remember(key, p)
        if key[1] is None:  # prefilled: the same answer stands for the text it was prefilled with
            self._remember((key[0], p.corrupted), p)
            self._set_corrupted(p.corrupted)
            self._prefill = False
        self._show_patching(p)

    def _remember(self, key: tuple, p: Patching) -> None:
        self._cache[key] = p
        self._cache.move_to_end(key)
        while len(self._cache) > CACHED:
            self._cache.popitem(last=False)

    def _show_patching(self, p: Patching, extra: str = "") -> None:
        self._shown = p
        self._patch_box.loading = False
        self._progress(None)
        self._stop.visible = False
        self._exact.visible = bool(p.maps) and not p.exact
        objs = [pn.pane.Markdown(_md_escape(extra + p.note), css_classes=["why-patching-note"],
                                 sizing_mode="stretch_width")]
        for title, values, rows, cols, axes in p.maps:
            try:
                fig = patching_heatmap(values, rows, cols, title=f"patching effect, {title}", value_label="effect",
                                       axis_labels=axes)
                fig.name = "why_patching_map"
                objs.append(pn.pane.Bokeh(_stretch(fig), sizing_mode="stretch_width"))
            except Exception as exc:
                objs.append(_fail("Patching map", exc))
        self._patch_box.objects = objs

    def _patch_failed(self, exc: Exception) -> None:
        self._patch_box.loading = False
        self._progress(None)
        self._stop.visible = False
        self._patch_box.objects = [_fail("Patching", exc)]

    def _report(self, done: int, total: int) -> None:
        self._progress((done, total))

    def _progress(self, step: tuple[int, int] | None) -> None:
        if step is None:
            self._bar.visible = self._progress_text.visible = False
            return
        done, total = step
        self._bar.value = 0  # the value's bounds follow max: lower it first
        self._bar.max = max(total, 1)
        self._bar.param.update(value=min(done, total), visible=True)
        self._progress_text.param.update(object=f"Exact sweep: patched {done:,} of {total:,} sites", visible=True)

    def stop(self) -> None:
        """The Stop button: end the running sweep; the estimate (if any) stays."""
        shown = self._bar.value, self._bar.max
        self._patch_lane.cancel()
        r = self.session.result
        estimate = self._cache.get(self._key(r)) if r is not None else None
        extra = f"Stopped the exact sweep after {shown[0]:,} of {shown[1]:,} sites. "
        if estimate is not None:
            self._show_patching(estimate, extra)
        else:
            self._patch_box.loading = False
            self._progress(None)
            self._stop.visible = False
            self._patch_box.objects = [pn.pane.Markdown(extra, css_classes=["why-patching-note"])]

    def _stopped(self) -> None:
        self._patch_stale = True
        self._patch_box.loading = False
        self._progress(None)
        self._stop.visible = False
        self._patch_box.objects = [pn.pane.Markdown("*Patching stopped: another analysis of this page started.*",
                                                    css_classes=["why-patching-note"])]

    def __panel__(self):
        box = pn.widgets.TextInput.from_param(self.param.corrupted, name="Changed source (Enter to patch)",
                                              css_classes=["why-corrupted"], max_length=50_000,
                                              sizing_mode="stretch_width")
        return pn.Column(pn.pane.Markdown("Pick an output token to see which components wrote it."), self._picker,
                         self._box, pn.pane.Markdown("### Patching against a changed source"), box,
                         pn.Row(self._exact, self._stop, self._bar, self._progress_text), self._patch_box,
                         sizing_mode="stretch_width")


TAB = ("Why", lambda session: WhyView(session=session))
"""The tab as `Workbench(extra_tabs=[TAB])` takes it."""

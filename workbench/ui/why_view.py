"""The "Why" tab: why the model produced one output token, and which parts of the network carry a change.

- Pick an output token (buttons for short outputs, a list for long ones; it follows the output length): its
  direct logit attribution as a layer x head grid per attention kind plus sorted bars for embeddings, FFNs and
  biases (they sum to the logit), and what each cross-attention head read from each source token
  (`analysis.decompose`). Interactive work: one forward pass, on the page's interactive lane.
- A changed source (prefilled for each new sentence: one noun swapped, `analysis.contrast.noun_swaps`; any
  text with the same number of tokens): patching of the output's log p, computed once per (sentence, changed
  source), not per tapped token. Every answer starts with attribution patching (`analysis.patching.
  attribution_patching`: one forward and backward pass), drawn as what it is, the estimated Δ log p of each site
  in nats, with its error on this sentence measured (`linearity`); small ones (EXACT_AT_ONCE sites) go on to the
  exact sweep (`patching_sweep`) at once, long ones offer it (a button); both with a progress bar and a Stop
  button. The sweep's maps show the effect, the share of the change a site carries (0 = no effect, white; 1 = all
  of it), and its note the estimate's `agreement` with it (Spearman, top-k overlap, scale ratio). Encoder and
  decoder apart. Heavy work: the page's heavy lane (one at a time per page), in a worker process when the server
  has a pool (`workers.py`): the job gets a `PatchInput`, not the page's model.

Added by `Workbench(extra_tabs=[TAB])`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import numpy as np
import panel as pn
import param
import torch

from ..analysis.attribution.decompose import direct_logit_attribution, source_attribution
from ..analysis.circuits.contrast import NOUNS, NOUNS_EN, noun_swaps
from ..analysis.circuits.patching import attribution_patching, build_sites, log_prob, patching_sweep
from ..charts.why import logit_attribution_grid, patching_heatmap
from ..core.batching import decoder_input
from . import loader, workers
from .learn import link_terms
from .requests import PROGRESS_EVERY
from .views import LazyTab, _fail, _md_escape, _stretch

MAX_BUTTONS = 20  # up to this many output tokens are picked with buttons; longer outputs get a list
# Up to this many patching sites the exact sweep starts at once (the estimate is shown while it runs); above, the
# estimate alone and a button. 1000 covers the default sentence (668 sites on general-en-de: 5 s in a worker on
# the busy 2-core machine) and 12-token sentences generally; a 60-word one has ~10,000 and takes minutes.
EXACT_AT_ONCE = 1000


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
class Agreement:
    """How the estimate (attribution patching) compares with the exact sweep over the same cells, in nats."""

    spearman: float  # rank correlation of Δ log p over every cell both have
    top_k: int  # k of the top-k overlap (the k largest |Δ log p| of each)
    overlap: int  # how many of the estimate's top k are among the sweep's top k
    scale: float  # largest |Δ log p| of the sweep / the estimate's (1 = same scale; 10 = the estimate 10x too small)
    cells: int

    def text(self) -> str:
        return (f"Estimate vs exact over {self.cells:,} cells: Spearman rank correlation {self.spearman:.2f}, "
                f"top-{self.top_k} overlap {self.overlap} of {self.top_k}, scale ratio {self.scale:.1f}× (the "
                "sweep's largest |Δ log p| over the estimate's).")


@dataclass
class Patching:
    """Patching of one (sentence, changed source): the maps' data, not figures (cached across token taps).

    `deltas` are Δ log p in nats (patched - clean) per map; the maps draw them as they are for the estimate
    (`exact=False`), and as the share of the whole change for the sweep (0 = none, 1 = all of it): a share is
    what the sweep measures, while the estimate's cells are first-order guesses whose sum need not be the
    change (on the default sentence they came out 9-33x too small, issue 37), so they are not called shares."""

    corrupted: str
    note: str
    maps: list[tuple[str, np.ndarray, list[str], list[str], tuple[str, str]]] = field(default_factory=list)
    exact: bool = False
    sites: int = 0
    deltas: list[np.ndarray] = field(default_factory=list)
    gap: float = 0.0  # corrupted - clean log p (nats): the whole change
    agreement: Agreement | None = None

    @property
    def value_label(self) -> str:
        return "effect (share)" if self.exact else "Δ log p (nats, estimate)"


@dataclass(frozen=True)
class PatchInput:
    """What patching needs of a page's `Result`, small and picklable: a worker process gets this and loads the
    model from `path` itself (`workers.model`, once per process); in the server's process the result's own model
    comes along (not pickled)."""

    path: str
    sentence: str
    src_ids: tuple[int, ...]
    out_ids: tuple[int, ...]
    src_pieces: tuple[str, ...]
    out_pieces: tuple[str, ...]
    tm: object = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, r) -> PatchInput:
        return cls(str(r.request.path), r.request.sentence, r.src_ids, r.out_ids, r.src_pieces, r.out_pieces,
                   r.model)

    @property
    def model(self):
        return self.tm if self.tm is not None else workers.model(self.path)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "tm": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


def site_count(r) -> int:
    """How many sites the exact sweeps patch (encoder stream plus every head at every query position)."""
    model = r.model.model
    s, t = len(r.src_ids), len(r.out_ids)
    return len(build_sites(model, "resid_enc", s, t)[2]) + len(build_sites(model, "head", s, t)[2])


def patch(r, corrupted: str | None, exact: bool | None = None, estimate: Patching | None = None,
          ticket=None) -> Patching:
    """Patching of the output's log p against `corrupted` (None: prefill it with a noun swap).

    `exact=False`: attribution patching only (one forward and backward pass). `exact=True`: the estimate first
    (`estimate`, if the caller has it, else computed and sent to the page as an interim answer,
    `ticket.partial(estimate)`), then the sweep (progress per batch through `ticket`, which also stops it), whose answer
    carries its `Agreement` with the estimate. None: exact when small (EXACT_AT_ONCE sites). `r`: the page's
    `Result` or its `PatchInput` (what a worker process gets)."""
    r = r if isinstance(r, PatchInput) else PatchInput.of(r)
    tm = r.model
    if corrupted is None:
        corrupted = prefill(tm, r.sentence, len(r.src_ids))
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
    if estimate is None or estimate.corrupted != corrupted or not estimate.maps:
        results = {}
        for sites in ("resid_enc", "head"):
            if ticket is not None:
                ticket.check()
            results[sites] = attribution_patching(tm.model, src, tgt, corrupted_src=c_src, sites=sites,
                                                  metric=metric)
        estimate = _patching(r, corrupted, results, False, n_sites)
        if not exact:
            return estimate
        if ticket is not None:
            ticket.partial(estimate)
            ticket.report(0, n_sites)
    results = {}
    done_before = 0
    for sites in ("resid_enc", "head"):
        if ticket is not None:
            ticket.check()

        def progress(done: int, total: int, what: str = "", before: int = done_before) -> None:
            if ticket is not None:
                ticket.report(before + done, n_sites)
        results[sites] = patching_sweep(tm.model, src, tgt, corrupted_src=c_src, sites=sites, metric=metric,
                                        progress=progress, batch_size=sweep_batch(len(r.src_ids), len(r.out_ids)))
        done_before += int(np.isfinite(results[sites].values.numpy()).sum())
    out = _patching(r, corrupted, results, True, n_sites)
    out.agreement = agreement(estimate.deltas, out.deltas)
    out.note += " " + out.agreement.text()
    return out


def sweep_batch(n_src: int, n_out: int) -> int:
    """Sites per forward of the sweep: about 1,600 tokens a batch, so a batch (the unit a Stop, a newer request or a
    closed page waits for) stays near 0.5 s on one busy core whatever the sentence's length: 64 sites of the
    25-token default sentence took ~0.5 s; a 60-word sentence (~160 tokens) gets 10 a batch."""
    return max(4, min(64, 1600 // max(1, n_src + n_out)))


def _patching(r, corrupted: str, results: dict, exact: bool, n_sites: int) -> Patching:
    """The maps of one sweep or estimate (`results` by site family): Δ log p per cell, drawn as a share (exact) or
    as nats (the estimate, with the check that bounds its error on this sentence)."""
    heads, stream = results["head"], results["resid_enc"]
    clean, corr = heads.clean_metric, heads.corrupted_metric
    gap = corr - clean
    names = ["embeddings"] + [f"after layer {i}" for i in range(len(stream.rows) - 1)]
    layout = [("encoder stream: layer × source token", _delta(stream), names, list(r.src_pieces),
               ("encoder stream", "source token"))]
    delta = _delta(heads)
    enc = [i for i, row in enumerate(heads.rows) if row.startswith("enc_self")]
    dec = [i for i, row in enumerate(heads.rows) if not row.startswith("enc_self")]
    s, t = len(r.src_ids), len(r.out_ids)
    if enc:
        layout.append(("encoder self-attention heads × source token (query)", delta[enc][:, :s],
                       [heads.rows[i] for i in enc], list(r.src_pieces), ("head", "query: source token")))
    if dec:
        layout.append(("decoder heads (self, cross) × output token (query: the step that produces it)",
                       delta[dec][:, :t], [heads.rows[i] for i in dec], list(r.out_pieces),
                       ("head", "query: output token produced")))
    deltas = [m[1] for m in layout]
    head = f"log p of the output: {clean:.3f} clean, {corr:.3f} with the changed source (Δ {gap:+.2f} nats)."
    if exact:
        maps = [(title, d / gap if gap else d, rows, cols, axes) for title, d, rows, cols, axes in layout]
        note = (f"{head} Measured by the exact sweep (activation patching): each cell runs the clean input with one "
                "activation taken from the changed run. Effect = the share of that change a site carries when patched "
                "(0 = none, 1 = all of it)"
                + ("." if gap else "; the change is 0 here, so cells are Δ log p in nats."))
    else:
        maps = layout
        note = (f"{head} Estimate by attribution patching, the first-order approximation (one forward and "
                "backward pass): each cell is the estimated Δ log p in nats when that site is patched, not a share. "
                f"{linearity(deltas[0], gap)} The exact sweep ({n_sites:,} sites) measures it.")
    return Patching(corrupted, note, maps, exact, n_sites, deltas, gap)


def linearity(stream: np.ndarray, gap: float) -> str:
    """The estimate's error on this sentence, measured for free: patching a whole row of the encoder stream (every
    source position at once) *is* the changed run, so its true Δ is `gap`, while the estimate of that row is the
    sum of its cells (attribution patching is linear). The worst row's ratio says how far the cells may be off."""
    sums = np.nansum(stream, axis=1)
    if not gap or not len(sums):
        return ""
    ratios = [gap / v for v in sums if v and np.isfinite(v)]
    wrong_sign = sum(r <= 0 for r in ratios)
    worst = max((r for r in ratios if r > 0), key=lambda r: abs(np.log(r)), default=float("nan"))
    text = (f"Expected error: a whole row of the encoder stream patched at once is the changed run itself "
            f"(Δ {gap:+.2f} nats); the estimate's rows sum to {sums.min():+.2f} … {sums.max():+.2f} nats")
    if wrong_sign:
        text += f", {wrong_sign} of {len(sums)} with the wrong sign"
    if np.isfinite(worst):
        text += (f", so its cells may be {worst:.1f}× too small" if worst >= 1 else
                 f", so its cells may be {1 / worst:.1f}× too large")
    return text + "."


def agreement(estimate: list[np.ndarray], exact: list[np.ndarray], k: int = 10) -> Agreement:
    """Spearman rank correlation, top-k overlap and scale ratio of the estimate's Δ log p against the sweep's."""
    est = np.concatenate([m.ravel() for m in estimate])
    ex = np.concatenate([m.ravel() for m in exact])
    keep = np.isfinite(est) & np.isfinite(ex)
    est, ex = est[keep], ex[keep]
    k = min(k, len(est))
    rho = float(np.corrcoef(_ranks(est), _ranks(ex))[0, 1]) if len(est) > 1 else float("nan")
    top_est = set(np.argsort(-np.abs(est), kind="stable")[:k].tolist())
    top_ex = set(np.argsort(-np.abs(ex), kind="stable")[:k].tolist())
    biggest = float(np.abs(est).max()) if len(est) else 0.0
    scale = float(np.abs(ex).max()) / biggest if biggest else float("inf")
    return Agreement(rho, k, len(top_est & top_ex), scale, int(len(est)))


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


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 0, ties sharing their mean rank (Spearman's convention; scipy is not a dependency)."""
    ranks = np.empty(len(x))
    ranks[np.argsort(x, kind="stable")] = np.arange(len(x))
    _, tie, counts = np.unique(x, return_inverse=True, return_counts=True)
    return (np.bincount(tie, weights=ranks) / counts)[tie]


def _delta(result) -> np.ndarray:
    """Δ log p of each site in nats: patched - clean (negative: patching that site lowers the output's log p)."""
    return result.values.numpy() - result.clean_metric


# --------------------------------------------------------------------------------------------- the view


def _cached(key: tuple) -> Patching | None:
    """The patching answer for `key` ((the request's translate_key, the changed source or None while prefilled)) if
    any page computed it (`loader.CACHE`, keyed by the checkpoint of the request's path)."""
    return loader.CACHE.peek("patching", key[0][0], *key)


class WhyView(LazyTab):
    """Direct logit attribution of the chosen output token, and patching against a changed source."""

    position = param.Selector(default=0, objects={"0": 0}, doc=("The output word to explain: which heads and layers "
                                                                "made the model write it."))
    corrupted = param.String(default="", doc=("The sentence with one word changed: the page measures which parts of "
                                              "the model carry the difference to the output."))

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
        self._sentence = None  # the sentence `corrupted` belongs to
        self._prefill = True  # `corrupted` is to be prefilled for the current sentence
        self._setting = False  # the view itself is writing `corrupted`
        self._patch_stale = True
        self._shown: Patching | None = None
        self._progress_at = 0.0  # time.monotonic() of the last shown progress report
        self._shown_objects: list | None = None  # the note and maps drawn for `_shown`
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
        if self.session.requests.background:
            workers.warm(str(r.request.path))  # the worker processes load this checkpoint before the first sweep
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
        cached = _cached(key)
        if cached is not None and (cached.exact or not exact):
            self._show_patching(cached)
            return
        exact = site_count(r) <= EXACT_AT_ONCE if exact is None else exact
        self._patch_box.loading = cached is None
        self._stop.visible = exact
        self._exact.visible = False
        corrupted = None if self._prefill else self.corrupted
        # Analysis work, the estimate too (a forward and backward pass over a long sentence costs several
        # translations): the heavy lane, one heavy job per page, in a worker process when the server has a pool
        # (requests.py, workers.py). Measured with the estimate on the interactive pool instead, 2 Why users
        # raised 8 others' translation p95 2.0x. The estimate the page has travels with an exact request.
        self._patch_lane.submit(patch, PatchInput.of(r), corrupted, exact, cached,
                                done=lambda p: self._patched(key, r, p), failed=self._patch_failed,
                                progress=self._report, interim=lambda p: self._estimated(key, r, p),
                                stopped=self._stopped, offload=True)

    def _patched(self, key: tuple, r, p: Patching) -> None:
        self._remember(key, p)
        if key[1] is None:  # prefilled: the same answer stands for the text it was prefilled with
            self._remember((key[0], p.corrupted), p)
            self._set_corrupted(p.corrupted)
            self._prefill = False
        self._show_patching(p)

    @staticmethod
    def _remember(key: tuple, p: Patching) -> None:
        # the one checkpoint cache (loader.CACHE), shared by every page: a second page asking the same gets it at once
        loader.CACHE.put("patching", key[0][0], p, *key)

    def _show_patching(self, p: Patching, extra: str = "") -> None:
        again = p is self._shown and self._shown_objects is not None and self._patch_box.objects == self._shown_objects
        self._shown = p
        self._patch_box.loading = False
        self._progress(None)
        self._stop.visible = False
        self._exact.visible = bool(p.maps) and not p.exact
        note = link_terms(_md_escape(extra + p.note))
        if again:  # the answer shown already (Stop keeps the estimate shown during the sweep): only the note changes
            self._shown_objects[0].object = note  # (rebuilding its maps had held the event loop 2 s under load)
            return
        objs = [pn.pane.Markdown(note, css_classes=["why-patching-note"], sizing_mode="stretch_width")]
        for title, values, rows, cols, axes in p.maps:
            try:
                what = "patching effect" if p.exact else "patching estimate (Δ log p, nats)"
                fig = patching_heatmap(values, rows, cols, title=f"{what}, {title}", value_label=p.value_label,
                                       axis_labels=axes)
                fig.name = "why_patching_map"
                objs.append(pn.pane.Bokeh(_stretch(fig), sizing_mode="stretch_width"))
            except Exception as exc:
                objs.append(_fail("Patching map", exc))
        self._patch_box.objects = self._shown_objects = objs

    def _patch_failed(self, exc: Exception) -> None:
        self._patch_box.loading = False
        self._progress(None)
        self._stop.visible = False
        self._patch_box.objects = [_fail("Patching", exc)]

    def _estimated(self, key: tuple, r, estimate: Patching) -> None:
        """The sweep's interim answer: the estimate, shown (in nats) while the sweep runs."""
        self._patched(key, r, estimate)
        self._stop.visible, self._exact.visible = True, False
        self._progress_at = 0.0  # the sweep's first report follows at once

    def _report(self, done: int, total: int, what: str = "") -> None:
        """Sweep progress (a `Progress` call). The line and bar change at most every `PROGRESS_EVERY` seconds
        (each change is a message to the page, written on the event loop that every page shares), the first and
        the last report always."""
        now = time.monotonic()
        if 0 < done < total and now - self._progress_at < PROGRESS_EVERY:
            return
        self._progress_at = now
        self._progress((done, total))

    def _progress(self, step: tuple[int, int] | None) -> None:
        if step is None:
            self._bar.visible = self._progress_text.visible = False
            return
        done, total = step
        if self._bar.max != max(total, 1):
            self._bar.value = 0  # the value's bounds follow max: lower it first
            self._bar.max = max(total, 1)
        self._bar.param.update(value=min(done, total), visible=True)
        self._progress_text.param.update(object=f"Exact sweep: patched {done:,} of {total:,} sites", visible=True)

    def stop(self) -> None:
        """The Stop button: end the running sweep; the estimate (if any) stays."""
        shown = self._bar.value, self._bar.max
        self._patch_lane.cancel()
        r = self.session.result
        estimate = _cached(self._key(r)) if r is not None else None
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

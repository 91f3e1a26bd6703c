"""The "Model analysis" tab: analyses of the current sentence that run the model again (logit lens,
gradient attribution beside attention, beam-search replay, encoder rollout and flow, value norms).

Added through the app's constructor: `Workbench(extra_tabs=[TAB])`. It is a `LazyTab`: nothing is computed
until the tab is shown and an analysis is picked (attribution needs one backward pass per output token and the
beam replay one decode plus one forward per step), and the work runs off the event loop.
"""

from __future__ import annotations

from dataclasses import replace

import panel as pn
import param
import torch
from bokeh.layouts import column

from ..analysis import (
    NORM_HOOKS,
    add_cross_attention,
    attention_flow,
    encoder_rollout,
    logit_lens,
    replay_beam,
    token_attribution,
    value_norms,
)
from ..charts import analysis as charts
from ..core.heads import hook_name
from ..core.trace import Trace
from ..decoding.search import beam_search
from . import loader
from .learn import link_terms
from .views import LazyTab
from .work import Offloaded, Snapshot

ANALYSES = ["(pick one)", "logit lens", "attribution vs attention", "beam search replay", "encoder rollout",
            "attention flow", "value norms (cross, last layer)"]
METHODS = {"saliency": "saliency", "input × gradient": "input_x_gradient"}  # label: value (the URL's `mam=`)
ATTRIBUTION_TERMS = link_terms(
    "*Attribution vs attention*: how much each source token matters to each output token, by saliency (the size of "
    "the gradient) or input × gradient, beside the last cross-attention layer's weights averaged over heads; the "
    "title gives their per-step Spearman correlation.")
FLOW_MAX_TOKENS = 24  # attention flow is S² max-flows: ~3 s at 20 tokens on one CPU thread


def model_analysis(r: Snapshot, trace: Trace, analysis: str, method: str, beam: int, step: int) -> dict:
    """The numbers of one analysis of result `r` (a `work.Snapshot`: in a worker process its model is loaded from the
    request's path) with the page's `trace`: a picklable answer, drawn by `analysis_figure`."""
    tm = r.model
    model = tm.model
    trace = trace.to(dtype=torch.float32)
    src = trace.src.to(model.device)
    tgt = trace.tgt.to(model.device)
    targets = torch.tensor([list(r.out_ids)], dtype=torch.long, device=model.device)
    src_tokens, out_tokens = list(r.src_pieces), list(r.out_pieces)
    answer: dict = {"analysis": analysis, "method": method, "step": step, "src_tokens": src_tokens,
                    "out_tokens": out_tokens}
    if analysis == "logit lens":
        answer["lens"] = logit_lens(model, src, tgt, targets=targets, top_k=1)
    elif analysis == "attribution vs attention":
        answer["attribution"] = token_attribution(model, src, tgt, targets)
        answer["cross"] = trace.attention("cross", trace.layers("cross") - 1)[0].mean(0).numpy()
    elif analysis == "beam search replay":
        answer["replay"] = beam_replay(tm, src, len(r.out_ids), beam)
    elif analysis == "encoder rollout":
        answer["relevance"] = encoder_rollout(trace)[0].numpy()
    elif analysis == "attention flow":
        if len(src_tokens) > FLOW_MAX_TOKENS:
            raise ValueError(f"attention flow is limited to {FLOW_MAX_TOKENS} source tokens here "
                             f"(this sentence has {len(src_tokens)}); use encoder rollout")
        layers = trace.stack(hook_name("enc_self", "*"))[:, 0].mean(1)  # (L, S, S)
        answer["relevance"] = attention_flow(layers)
    elif analysis.startswith("value norms"):
        _, full = model.run_with_cache(src, tgt, names=NORM_HOOKS)
        answer["layer"] = layer = len(model.dec) - 1
        answer["relevance"] = value_norms(model, full, "cross", layer).combined[0].float().cpu().numpy()
    else:
        raise ValueError(f"unknown analysis {analysis!r}")
    if analysis in ("logit lens", "beam search replay"):  # their charts name vocabulary ids: the pieces travel too
        answer["vocab"] = dict(enumerate(tm.tgt_tokenizer.pieces(list(range(model.cfg.tgt_vocab)))))
    return answer


def analysis_figure(answer: dict):
    """The Bokeh model of a `model_analysis` answer (drawn where it is shown: Bokeh models do not pickle)."""
    analysis, src_tokens, out_tokens = answer["analysis"], answer["src_tokens"], answer["out_tokens"]
    vocab = answer.get("vocab", {})

    def piece(i: int) -> str:
        return vocab.get(int(i), str(int(i)))

    if analysis == "logit lens":
        return charts.logit_lens_view(answer["lens"], tokens=piece, positions=[f"→{t}" for t in out_tokens])
    if analysis == "attribution vs attention":
        return charts.attribution_view(answer["attribution"], attention=answer["cross"], src_tokens=src_tokens,
                                       tgt_tokens=out_tokens, method=answer["method"])
    if analysis == "beam search replay":
        replay = answer["replay"]
        step = min(answer["step"], len(replay.steps) - 1)
        return column(charts.beam_tree_figure(replay, tokens=piece),
                      charts.beam_step_view(replay, step, tokens=piece, src_tokens=src_tokens))
    if analysis == "encoder rollout":
        return charts.relevance_heatmap(answer["relevance"], src_tokens, src_tokens,
                                        title="encoder rollout: share of each input token in each position")
    if analysis == "attention flow":
        return charts.relevance_heatmap(answer["relevance"], src_tokens, src_tokens,
                                        title="attention flow (Abnar & Zuidema 2020) through the encoder")
    return charts.relevance_heatmap(answer["relevance"], out_tokens, src_tokens,
                                    title=f"‖Σ_h α·f(x)‖ (Kobayashi et al. 2020), cross layer {answer['layer']}",
                                    value_label="norm")


def beam_replay(tm, src: torch.Tensor, out_len: int, beam: int):
    """The beam search of source `src` (1, S), replayed step by step with `beam` hypotheses: once per source, output
    length and beam in a process (`loader.load_derived`, shared by every page, evicted with the model)."""
    model = tm.model

    def replay():
        gen = beam_search(model, src, beam=beam, max_len=max(4, out_len + 8), record_steps=True)
        return add_cross_attention(replay_beam(gen, 0), model, src[0])

    return loader.load_derived("replay", tm, replay, tuple(src[0].tolist()), out_len, beam)


class ModelAnalysisView(LazyTab):
    """Per-sentence analyses over the session's model and result (see `workbench.analysis`)."""

    analysis = param.Selector(default=ANALYSES[0], objects=ANALYSES, doc=(
        "Which analysis of this sentence to run: the logit lens, attribution against attention, a replay of beam "
        "search, attention rollout or flow, or the value norms of the last cross-attention."))
    method = param.Selector(default="saliency", objects=METHODS, doc=(
        "How 'attribution vs attention' scores each source token: the gradient's size (saliency) or the gradient "
        "times the token's embedding (input × gradient)."))
    beam = param.Integer(default=4, bounds=(2, 8), doc=(
        "How many hypotheses the beam search replay keeps at each step (its beam size)."))
    step = param.Integer(default=0, bounds=(0, None), doc=(
        "Which step of the beam search replay to show: the hypotheses alive then and the tokens they chose."))

    title = "Model analysis"
    heavy = True  # a backward pass per output token, a beam replay: analysis work, off the interactive pool
    redraws = ("analysis", "method", "beam", "step")
    url = {"analysis": "ma", "method": "mam", "beam": "mab", "step": "mas"}

    def inputs(self):
        r = self.session.result
        if self.analysis == ANALYSES[0]:
            return "*Pick an analysis; it runs on the sentence above.*"
        if r is None:
            return "*Nothing to analyse yet.*"
        return Snapshot.of(r), r.trace, self.analysis, self.method, self.beam, self.step

    # Heavy: in a worker process when the server has a pool (`workers.py`), like Graph, Evidence and Features; the
    # worker sends the analysis' numbers back and the figure is drawn here (Bokeh models do not pickle).
    compute = Offloaded(model_analysis)

    def render(self, answer):
        if answer["analysis"] == "beam search replay":  # the replay's own step count bounds the step picker
            self.param.step.bounds = (0, len(answer["replay"].steps) - 1)
        return [pn.pane.Bokeh(analysis_figure(answer), sizing_mode="stretch_width")]

    def build(self, r, tm=None, *, analysis: str | None = None, method: str | None = None, beam: int | None = None,
              step: int | None = None):
        """The Bokeh model of an analysis (default: the chosen one) of result `r` (under model `tm`, default its
        own), computed here."""
        snapshot = Snapshot.of(r) if tm is None else replace(Snapshot.of(r), tm=tm)
        answer = model_analysis(snapshot, r.trace, analysis or self.analysis, method or self.method,
                                beam or self.beam, self.step if step is None else step)
        return analysis_figure(answer)

    def __panel__(self):
        controls = pn.Row(
            pn.widgets.Select.from_param(self.param.analysis, name="Analysis", width=240,
                                         css_classes=["analysis-picker"]),
            pn.widgets.Select.from_param(self.param.method, name="Attribution", width=160,
                                         css_classes=["analysis-method"]),
            pn.widgets.IntInput.from_param(self.param.beam, name="Beam", width=80, css_classes=["analysis-beam"]),
            pn.widgets.IntInput.from_param(self.param.step, name="Beam step", width=100, css_classes=["analysis-step"]),
        )
        terms = pn.pane.Markdown(ATTRIBUTION_TERMS, css_classes=["analysis-method-terms"], sizing_mode="stretch_width",
                                 visible=self.param.analysis.rx() == "attribution vs attention")
        return pn.Column(controls, terms, self._box, sizing_mode="stretch_width")


TAB = ("Model analysis", lambda session: ModelAnalysisView(session=session))
"""The tab as `Workbench(extra_tabs=[TAB])` takes it."""

"""The "Model analysis" tab: analyses of the current sentence that run the model again (logit lens,
gradient attribution beside attention, beam-search replay, encoder rollout and flow, value norms).

Added through the app's constructor: `Workbench(extra_tabs=[TAB])`. It is a `LazyTab`: nothing is computed
until the tab is shown and an analysis is picked (attribution needs one backward pass per output token and the
beam replay one decode plus one forward per step), and the work runs off the event loop.
"""

from __future__ import annotations

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
from ..decoding.search import beam_search
from . import loader
from .views import LazyTab

ANALYSES = ["(pick one)", "logit lens", "attribution vs attention", "beam search replay", "encoder rollout",
            "attention flow", "value norms (cross, last layer)"]
FLOW_MAX_TOKENS = 24  # attention flow is S² max-flows: ~3 s at 20 tokens on one CPU thread


class ModelAnalysisView(LazyTab):
    """Per-sentence analyses over the session's model and result (see `workbench.analysis`)."""

    analysis = param.Selector(default=ANALYSES[0], objects=ANALYSES, doc=(
        "Which analysis of this sentence to run: the logit lens, attribution against attention, a replay of beam "
        "search, attention rollout or flow, or the value norms of the last cross-attention."))
    method = param.Selector(default="saliency", objects=["saliency", "input_x_gradient"], doc=(
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
        return r, self.analysis, self.method, self.beam, self.step

    def compute(self, r, analysis, method, beam, step):
        fig = self.build(r, r.model, analysis=analysis, method=method, beam=beam, step=step)
        steps = len(self.beam_replay(r, beam).steps) if analysis == "beam search replay" else None
        return fig, steps

    def render(self, answer):
        fig, steps = answer
        if steps is not None:  # the replay's own step count bounds the step picker
            self.param.step.bounds = (0, steps - 1)
        return [pn.pane.Bokeh(fig, sizing_mode="stretch_width")]

    def build(self, r, tm, *, analysis: str | None = None, method: str | None = None, beam: int | None = None,
              step: int | None = None):
        """The Bokeh model of an analysis (default: the chosen one) of result `r` under model `tm`."""
        analysis = analysis or self.analysis
        method = method or self.method
        beam = beam or self.beam
        step = self.step if step is None else step
        model = tm.model
        trace = r.trace.to(dtype=torch.float32)
        src = trace.src.to(model.device)
        tgt = trace.tgt.to(model.device)
        targets = torch.tensor([list(r.out_ids)], dtype=torch.long, device=model.device)
        src_tokens, out_tokens = list(r.src_pieces), list(r.out_pieces)

        def vocab(i: int) -> str:
            return tm.tgt_tokenizer.pieces([i])[0]

        if analysis == "logit lens":
            lens = logit_lens(model, src, tgt, targets=targets, top_k=1)
            return charts.logit_lens_view(lens, tokens=vocab, positions=[f"→{t}" for t in out_tokens])
        if analysis == "attribution vs attention":
            attr = token_attribution(model, src, tgt, targets)
            cross = trace.attention("cross", trace.layers("cross") - 1)[0].mean(0).numpy()
            return charts.attribution_view(attr, attention=cross, src_tokens=src_tokens, tgt_tokens=out_tokens,
                                           method=method)
        if analysis == "beam search replay":
            replay = self.beam_replay(r, beam, tm)
            step = min(step, len(replay.steps) - 1)
            return column(charts.beam_tree_figure(replay, tokens=vocab),
                          charts.beam_step_view(replay, step, tokens=vocab, src_tokens=src_tokens))
        if analysis == "encoder rollout":
            return charts.relevance_heatmap(encoder_rollout(trace)[0].numpy(), src_tokens, src_tokens,
                                            title="encoder rollout: share of each input token in each position")
        if analysis == "attention flow":
            if len(src_tokens) > FLOW_MAX_TOKENS:
                raise ValueError(f"attention flow is limited to {FLOW_MAX_TOKENS} source tokens here "
                                 f"(this sentence has {len(src_tokens)}); use encoder rollout")
            layers = trace.stack(hook_name("enc_self", "*"))[:, 0].mean(1)  # (L, S, S)
            return charts.relevance_heatmap(attention_flow(layers), src_tokens, src_tokens,
                                            title="attention flow (Abnar & Zuidema 2020) through the encoder")
        if analysis.startswith("value norms"):
            _, full = model.run_with_cache(src, tgt, names=NORM_HOOKS)
            layer = len(model.dec) - 1
            norms = value_norms(model, full, "cross", layer)
            return charts.relevance_heatmap(norms.combined[0].float().cpu().numpy(), out_tokens, src_tokens,
                                            title=f"‖Σ_h α·f(x)‖ (Kobayashi et al. 2020), cross layer {layer}",
                                            value_label="norm")
        raise ValueError(f"unknown analysis {analysis!r}")

    @staticmethod
    def beam_replay(r, beam: int, tm=None):
        """The beam search of result `r`'s source, replayed step by step with `beam` hypotheses: once per source,
        output length and beam in a process, shared by every page (`loader.load_derived`, evicted with the model;
        keyed by the ids, not by the page's result object, which a page rebuilds for the same sentence)."""
        tm = r.model if tm is None else tm
        model = tm.model

        src = r.trace.src[:1].to(model.device)

        def replay():
            gen = beam_search(model, src, beam=beam, max_len=max(4, len(r.out_ids) + 8), record_steps=True)
            return add_cross_attention(replay_beam(gen, 0), model, src[0])

        return loader.load_derived("replay", tm, replay, tuple(src[0].tolist()), len(r.out_ids), beam)

    def __panel__(self):
        controls = pn.Row(
            pn.widgets.Select.from_param(self.param.analysis, name="Analysis", width=240,
                                         css_classes=["analysis-picker"]),
            pn.widgets.Select.from_param(self.param.method, name="Attribution", width=160),
            pn.widgets.IntInput.from_param(self.param.beam, name="Beam", width=80),
            pn.widgets.IntInput.from_param(self.param.step, name="Beam step", width=100),
        )
        return pn.Column(controls, self._box, sizing_mode="stretch_width")


TAB = ("Model analysis", lambda session: ModelAnalysisView(session=session))
"""The tab as `Workbench(extra_tabs=[TAB])` takes it."""

"""Feature dashboards: data from `workbench.features.dashboard` in, Bokeh figures and HTML out. No Panel.

    fd = FeatureData.load(tm, "checkpoints/multi30k-de-en/features/hook_memory")
    activation_histogram(*fd.histogram(17))        # Bokeh figure, log-spaced bins
    output_tokens_figure(fd.output_effects(17))     # the tokens it raises
    contexts_html(fd.contexts(17))                  # top contexts, firing token highlighted, aligned word
    sentence_features_html(fd.sentence("Ein Hund läuft."))   # features per token, links ?feature=ID
    feature_dashboard(fd, 17)                       # all of it in one Bokeh layout (notebook, offline HTML)
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, Div, HoverTool
from bokeh.plotting import figure

from ..features.dashboard import Context, FeatureData

HIGHLIGHT = "#f4a261"
RAISE = "#c0392b"


def activation_histogram(left: Sequence[float], right: Sequence[float], counts: Sequence[int], *, title: str = "",
                         width: int = 420, height: int = 220):
    """Counts of the feature's non-zero activations on the corpus (log-spaced bins, log x axis)."""
    fig = figure(width=width, height=height, x_axis_type="log", title=title or "activation histogram",
                 tools="pan,wheel_zoom,reset,save", toolbar_location="above", name="feature_histogram")
    if counts:
        src = ColumnDataSource({"left": list(left), "right": list(right), "count": list(counts)})
        fig.quad(left="left", right="right", bottom=0, top="count", source=src, color="#4c78a8")
        fig.add_tools(HoverTool(tooltips=[("activation", "@left{0.000}–@right{0.000}"), ("tokens", "@count")]))
    fig.xaxis.axis_label = "activation"
    fig.yaxis.axis_label = "tokens"
    return fig


def output_tokens_figure(effects: dict[str, Any], *, width: int = 420, height: int | None = None):
    """The tokens the feature raises most: the probability it adds (clean minus without the feature, mean over its
    top contexts; the order the dashboard ranks them in), on hover the clean probability (the mean, and where the
    removal moves the token, with the number of such contexts) and the log-prob drop.
    A feature without a measurable output effect (`effects["measurable"]` False) gets no bars, and the title says
    so: its ranking would be noise (why, in words: `output_effect_note`, which the dashboard shows under it; a
    figure's title does not wrap, and the reason is longer than the narrowest dashboard)."""
    measurable = effects.get("measurable", True)
    toks = effects.get("tokens", []) if measurable else []
    labels = [f"{t['token']} ({t['id']})" for t in toks]
    title = (f"output tokens it raises ({effects.get('contexts', 0)} contexts)" if measurable else
             f"no measurable output effect ({effects.get('contexts', 0)} contexts)")
    fig = figure(y_range=list(reversed(labels)) or ["-"], width=width, height=height or max(180, 20 * len(labels) + 80),
                 title=title, tools="save", toolbar_location="above", name="feature_output_tokens")
    if toks:
        src = ColumnDataSource({"y": labels, "dp": [t.get("dp", t["drop"]) for t in toks],
                                "p_clean": [t.get("p_clean", float("nan")) for t in toks],
                                "p_where": [t.get("p_clean_where", float("nan")) for t in toks],
                                "where": [t.get("contexts_where", -1) for t in toks],
                                "drop": [t["drop"] for t in toks]})
        fig.hbar(y="y", right="dp", height=0.8, color=RAISE, source=src)
        fig.add_tools(HoverTool(tooltips=[("token", "@y"), ("probability it adds", "@dp{0.0000}"),
                                          ("clean probability, mean", "@p_clean{0.000}"),
                                          ("clean probability where it moves", "@p_where{0.000}"),
                                          ("contexts where it moves", "@where"),
                                          ("log-prob drop without it", "@drop{0.000}")]))
    fig.xaxis.axis_label = "probability it adds (clean − without it)"
    return fig


def output_effect_note(effects: dict[str, Any]) -> str | None:
    """Why a feature has no measurable output effect, as HTML for under its output-token figure (None when it has
    one)."""
    if effects.get("measurable", True):
        return None
    return (f"<div class='feature-effect-note' style='font-family:sans-serif;font-size:12px'>"
            f"{html.escape(effects.get('effect', 'no measurable output effect'))}</div>")


def head_effects_figure(effects: dict[str, Any], *, width: int = 420, top: int = 8):
    """Per cross-attention head: the mean drop on the feature's top tokens through that head's values alone."""
    heads = effects.get("heads", [])[:top]
    labels = [f"L{h['layer']}H{h['head']}" for h in heads]
    fig = figure(y_range=list(reversed(labels)) or ["-"], width=width, height=max(160, 20 * len(labels) + 80),
                 title="through which cross-attention heads", tools="save", toolbar_location="above",
                 name="feature_heads")
    if heads:
        src = ColumnDataSource({"y": labels, "v": [h["on_top_tokens"] for h in heads],
                                "tokens": [" ".join(h["tokens"]) for h in heads]})
        fig.hbar(y="y", right="v", height=0.8, color="#6a51a3", source=src)
        fig.add_tools(HoverTool(tooltips=[("head", "@y"), ("drop on the top tokens", "@v{0.000}"),
                                          ("its own top tokens", "@tokens")]))
    fig.xaxis.axis_label = "mean log-prob drop (value path of one head)"
    return fig


def _piece(p: str) -> str:
    text = p.replace("\u2581", " ")
    return html.escape(text) if text.strip() else "\u2423"  # a lone word-start marker shows as ␣


def contexts_html(contexts: Sequence[Context], *, window: int = 8) -> str:
    """One line per context: pieces around the firing one (highlighted, with its value) and the aligned word."""
    if not contexts:
        return "<div class='feature-contexts'><i>no contexts: the feature never fires on the corpus</i></div>"
    top = max(c.value for c in contexts) or 1.0
    lines = []
    for c in contexts:
        lo, hi = max(0, c.position - window), min(len(c.pieces), c.position + window + 1)
        parts = []
        for i in range(lo, hi):
            if i == c.position:
                alpha = 0.25 + 0.75 * c.value / top
                style = f"background:rgba(244,162,97,{alpha:.2f});padding:0 2px"
                parts.append(f"<b class='firing' style='{style}'>{_piece(c.pieces[i])}</b>")
            else:
                parts.append(_piece(c.pieces[i]))
        text = "".join(parts)
        lines.append(f"<div class='feature-context' title='{html.escape(c.source)} → {html.escape(c.target)}'>"
                     f"<code>{c.value:6.2f}</code> {'…' if lo else ''}{text}{'…' if hi < len(c.pieces) else ''}"
                     f" <span style='color:#888'>→</span> <b>{_piece(c.aligned)}</b></div>")
    return "<div class='feature-contexts' style='font-family:sans-serif;line-height:1.7'>" + "".join(lines) + "</div>"


def sentence_features_html(data: dict[str, Any], *, link: str = "?feature={feature}") -> str:
    """A table: each token of the sentence with its most active features, each a link to its dashboard."""
    rows = []
    for t in data["tokens"]:
        feats = " ".join(f"<a class='feature-link' href='{link.format(feature=f)}' data-feature='{f}'>#{f}</a>"
                         f"<small>({a:.2f})</small>" for f, a in t["features"])
        rows.append(f"<tr><td>{t['position']}</td><td><b>{_piece(t['piece'])}</b></td><td>{feats or '–'}</td></tr>")
    side = "source token" if data["side"] == "src" else "decoder position"
    return (f"<table class='sentence-features' style='font-family:sans-serif;font-size:13px'><tr><th>#</th>"
            f"<th>{side}</th><th>most active features (activation)</th></tr>{''.join(rows)}</table>")


def summary_html(summary: dict[str, Any]) -> str:
    return (f"<div class='feature-summary' style='font-family:sans-serif'><b>{html.escape(summary['site'])} "
            f"feature #{summary['feature']}</b>: fires on {summary['frequency']:.3%} of {summary['tokens']:,} tokens "
            f"of {html.escape(summary['corpus'])} ({summary['count']:,}), mean {summary['mean']:.3f}, "
            f"max {summary['max']:.3f}</div>")


def feature_dashboard(fd: FeatureData, feature: int, *, contexts: int = 12):
    """Summary, top contexts, histogram, output tokens (and heads) of one feature, as one Bokeh layout: the texts and
    the figures side by side, sharing the page's width (each at least 360 px; issue 37: the page's width at
    1000-1500 px)."""
    effects = fd.output_effects(feature)
    stretch = {"sizing_mode": "stretch_width", "min_width": 360}
    left = column(Div(text=summary_html(fd.summary(feature)), **stretch),
                  Div(text=contexts_html(fd.contexts(feature, contexts)), **stretch), **stretch)
    right = [activation_histogram(*fd.histogram(feature)), output_tokens_figure(effects)]
    if effects.get("heads"):
        right.append(head_effects_figure(effects))
    for fig in right:
        fig.sizing_mode, fig.min_width = "stretch_width", 360
    note = output_effect_note(effects)
    if note is not None:
        right.insert(2, Div(text=note, **stretch))
    return row(left, column(*right, **stretch), name="feature_dashboard", sizing_mode="stretch_width")


def feature_node_html(details: dict[str, Any], href: str, *, effects: int = 6) -> str:
    """A tapped feature node of a feature graph (`analysis.feature_graph.feature_details`): a link to its dashboard
    (`href`: the Features tab on it), its top corpus contexts and the output tokens it raises and lowers."""
    name = f"{details['site']} #{details['feature']}"
    head = (f"<b>Feature {html.escape(name)}</b> — <a class='graph-feature-link' href='{html.escape(href)}' "
            f"data-site='{html.escape(details['site'])}' data-feature='{details['feature']}'>open its dashboard in "
            f"the Features tab</a>")
    if "contexts" not in details:  # the link first; its contexts and effects are being read
        return (f"<div class='graph-feature-card' style='font-family:sans-serif'>{head}<br><i>Reading its top "
                "contexts and output effects…</i></div>")
    contexts = [c if isinstance(c, Context) else Context(**c) for c in details["contexts"]]
    out = details["output_effects"]

    def tokens(rows: Sequence[dict[str, Any]]) -> str:
        return ", ".join(f"<b>{_piece(t['token'])}</b> <small>({t['dp']:+.4f})</small>" for t in rows[:effects]) or "–"

    effect = (f"raises {tokens(out.get('tokens', []))}; lowers {tokens(out.get('lowers', []))}"
              if out.get("measurable", True) else html.escape(out.get("effect", "no measurable output effect")))
    return (f"<div class='graph-feature-card' style='font-family:sans-serif'>{head}<br><i>Top contexts</i> (the "
            f"firing piece highlighted, → the output word aligned to it):{contexts_html(contexts)}"
            f"<i>Output effects</i> over {out.get('contexts', 0)} of its top contexts (probability it adds at the "
            f"aligned output position: clean − without it): {effect}</div>")

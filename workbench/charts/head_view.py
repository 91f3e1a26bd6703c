"""BertViz-style head view: lines from query tokens (left) to key tokens (right), weight as opacity.

One Segment renderer per head (legend click toggles a head; colours follow the head index), all layers
embedded with a layer picker that swaps data in the browser, and a tap on a query token dims every other
query's lines. Lines under `min_weight` (and beyond `top_k` per query) are not sent: that bounds the page
at 512 tokens, where all-pairs would be 8 heads x 262k lines a layer. The title says what was dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, CustomJS, Legend, LegendItem, Range1d, Select, TapTool
from bokeh.palettes import Category10_10, Category20_20

from ..trace import AttentionKind, Trace
from .select import KIND_LABEL, Attention, combined_attention, select_attention

SEGMENTS_NAME = "head_lines_{}"  # per head; an app can swap `.data_source.data` with `line_data(...)`


def head_colors(n: int) -> list[str]:
    return list(Category10_10 if n <= 10 else Category20_20)[: max(n, 1)] * (1 + n // 20)


def line_data(values: np.ndarray, min_weight: float = 0.01, top_k: int | None = None,
              highlight: int | None = None) -> dict[str, np.ndarray]:
    """(Lq, Lk) weights -> {q, k, w, alpha} for the lines kept (w >= min_weight, top_k per query)."""
    w = np.asarray(values, dtype=np.float32)
    keep = w >= min_weight
    if top_k is not None and top_k < w.shape[1]:
        kth = -np.partition(-w, top_k - 1, axis=1)[:, top_k - 1 : top_k]  # k-th largest per row
        keep &= w >= kth
    q, k = np.nonzero(keep)
    weights = w[q, k]
    alpha = weights if highlight is None else np.where(q == highlight, weights, weights * 0.08)
    return {"q": q.astype(np.int32), "k": k.astype(np.int32), "w": weights, "alpha": alpha.astype(np.float32)}


def head_view_figure(
    atts: Sequence[Attention],
    *,
    labels: Sequence[str] | None = None,
    min_weight: float = 0.01,
    top_k: int | None = None,
    highlight: int | None = None,
    width: int = 520,
    row_height: int = 18,
    max_label: int = 20,
):
    """Head view of several layers (`atts`, one per layer, same tokens and heads); a picker chooses the layer.

    labels: the picker's name for each entry (default: the layer index).
    """
    if not atts:
        raise ValueError("head_view needs at least one layer of attention")
    first = atts[0]
    for a in atts[1:]:
        if (a.queries, a.keys, a.heads) != (first.queries, first.keys, first.heads):
            raise ValueError("every layer in a head view must share tokens and heads")
    from bokeh.plotting import figure

    lq, lk = len(first.queries), len(first.keys)
    n = max(lq, lk)
    height = max(240, min(20000, n * row_height + 80))
    dropped = f" (lines < {min_weight:g}" + (f", beyond top {top_k} per query" if top_k else "") + " hidden)"
    fig = figure(
        width=width, height=height, x_range=Range1d(-0.75, 1.75), y_range=Range1d(n - 0.5, -0.5),
        tools="tap,ywheel_zoom,ypan,reset,save", toolbar_location="above",
        title=first.describe() + dropped if len(atts) == 1 else first.describe().split(", layer")[0] + dropped,
    )
    fig.axis.visible = False
    fig.grid.visible = False
    colors = head_colors(first.n_heads_total or len(first.heads))
    labels = [f"layer {a.layer}" for a in atts] if labels is None else list(labels)
    if len(labels) != len(atts) or len(set(labels)) != len(labels):
        raise ValueError(f"need one distinct label per layer, got {labels}")
    per_layer = {label: [line_data(a.values[i], min_weight, top_k, highlight) for i in range(len(a.heads))]
                 for label, a in zip(labels, atts)}
    layer0 = labels[0]
    items, sources = [], []
    for i, h in enumerate(first.heads):
        src = ColumnDataSource(per_layer[layer0][i])
        r = fig.segment(x0=0.02, x1=0.98, y0="q", y1="k", source=src, line_color=colors[h], line_alpha="alpha",
                        line_width=2, name=SEGMENTS_NAME.format(h))
        sources.append(src)
        # The legend swatch is drawn from the first renderer; per-line alpha would make it invisible.
        swatch = fig.line(x=[0.5], y=[0], line_color=colors[h], line_width=3)
        items.append(LegendItem(label=f"head {h}", renderers=[swatch, r]))
    short = lambda t: t if len(t) <= max_label else t[: max_label - 1] + "…"
    qsrc = ColumnDataSource({"x": np.zeros(lq), "y": np.arange(lq), "t": [short(t) for t in first.queries]})
    ksrc = ColumnDataSource({"x": np.ones(lk), "y": np.arange(lk), "t": [short(t) for t in first.keys]})
    fig.text(x="x", y="y", text="t", source=ksrc, text_align="left", text_baseline="middle", x_offset=4,
             text_font_size="11px")
    qdots = fig.scatter(x="x", y="y", source=qsrc, size=7, color="#444444", nonselection_alpha=0.4)
    fig.text(x="x", y="y", text="t", source=qsrc, text_align="right", text_baseline="middle", x_offset=-6,
             text_font_size="11px")
    fig.scatter(x="x", y="y", source=ksrc, size=7, color="#444444")
    legend = Legend(items=items, click_policy="hide", location="top_right", label_text_font_size="10px")
    fig.add_layout(legend, "right")
    fig.select_one(TapTool).renderers = [qdots]
    # Tap a query token: its lines at full weight, the rest faint; tap empty space to show all again.
    qsrc.selected.js_on_change("indices", CustomJS(args={"sources": sources, "qsrc": qsrc}, code="""
        const sel = qsrc.selected.indices;
        for (const s of sources) {
            const q = s.data.q, w = s.data.w, a = new Float32Array(w.length);
            for (let i = 0; i < w.length; i++) a[i] = (sel.length == 0 || sel.includes(q[i])) ? w[i] : w[i] * 0.08;
            s.data = {...s.data, alpha: a};
        }"""))
    if len(atts) == 1:
        return fig
    store = {layer: [ColumnDataSource(d) for d in heads] for layer, heads in per_layer.items()}
    picker = Select(title="layer", value=layer0, options=list(per_layer), width=160, name="layer_picker")
    picker.js_on_change("value", CustomJS(args={"store": store, "sources": sources, "qsrc": qsrc}, code="""
        store[cb_obj.value].forEach((s, i) => { sources[i].data = {...s.data}; });
        qsrc.selected.indices = [];"""))
    return column(picker, fig)


def head_view(
    trace: Trace,
    kind: AttentionKind | str,
    layers: int | Sequence[int] | None = None,
    heads: int | Sequence[int] | None = None,
    *,
    batch: int = 0,
    words: bool = False,
    dec_layers: Sequence[int] | None = None,
    select: dict | None = None,
    **kw,
):
    """Head view for enc_self / dec_self / cross, or "combined" (tensor2tensor's source+target view).

    layers: one layer, several (a picker switches between them in the page), or None for all. For
    "combined", `layers` are encoder layers paired with `dec_layers` (default: the same indices,
    clipped to the decoder's depth, so 6+3 models work).
    """
    opts = {"batch": batch, **(select or {})}
    if kind == "combined":
        n_enc, n_dec = trace.layers("enc_self"), trace.layers("dec_self")
        enc = _layers(layers, n_enc)
        dec = list(dec_layers) if dec_layers is not None else [min(i, n_dec - 1) for i in enc]
        atts = [combined_attention(trace, e, d, heads, words=words, **opts) for e, d in zip(enc, dec)]
        return head_view_figure(atts, labels=[f"enc {e} / dec {d}" for e, d in zip(enc, dec)], **kw)
    if kind not in KIND_LABEL:
            raise ValueError(f"kind must be enc_self, dec_self, cross or combined, got {kind!r}")
    atts = [select_attention(trace, kind, i, heads, words=words, **opts)
            for i in _layers(layers, trace.layers(kind))]
    return head_view_figure(atts, **kw)


def _layers(layers: int | Sequence[int] | None, n: int) -> list[int]:
    chosen = list(range(n)) if layers is None else [layers] if isinstance(layers, int) else list(layers)
    bad = [i for i in chosen if not 0 <= i < n]
    if bad or not chosen:
        raise IndexError(f"layers {bad or chosen} out of range: {n} layers captured")
    return chosen

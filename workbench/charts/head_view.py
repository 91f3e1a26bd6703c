"""BertViz-style head view: lines from query tokens (left) to key tokens (right), weight as opacity.

All heads' lines are ONE multi_line renderer, one NaN-separated path per (head, opacity level), so the browser
strokes at most heads x 24 paths, 1 px wide (see the comment at the renderer for the measured cost). Head toggles, all
layers embedded with a layer picker that swaps data in the browser, and a tap on a query token dims every other
query's lines (the tap survives a layer switch). Lines under `min_weight` (and beyond `top_k` per query) are
not sent: that bounds the page at 512 tokens, where all pairs would be 8 heads x 262k lines a layer. The title
says what was dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from bokeh.layouts import column, row
from bokeh.models import (
    CheckboxButtonGroup,
    ColumnDataSource,
    CustomJS,
    Legend,
    LegendItem,
    Range1d,
    Select,
    TapTool,
)
from bokeh.palettes import Category10_10, Category20_20
from bokeh.plotting import figure

from ..core.heads import AttentionKind
from ..core.trace import Trace
from .select import KIND_LABEL, Attention, combined_attention, select_attention

SEGMENTS_NAME = "head_lines"  # the exact lines (q, k, h, w, alpha) of the layer shown
PATHS_NAME = "head_paths"  # what is drawn: `bucket_paths(line_data(...), colors)`


def head_colors(n: int) -> list[str]:
    return list(Category10_10 if n <= 10 else Category20_20)[: max(n, 1)] * (1 + n // 20)


def line_data(values: np.ndarray, min_weight: float = 0.01, top_k: int | None = 16,
              highlight: int | None = None) -> dict[str, np.ndarray]:
    """(Lq, Lk) or (H, Lq, Lk) weights -> {q, k, h, w, alpha} for the lines kept.

    Kept: w >= min_weight and among the top_k of its query row (exactly top_k; ties broken arbitrarily).
    q/k int16, h int8 (position in the head selection), w/alpha float32: 13 bytes a line for the layer shown,
    6 for each stored layer (w as uint8).
    """
    w = np.asarray(values, dtype=np.float32)
    w = w[None] if w.ndim == 2 else w
    if max(w.shape[-2:]) > np.iinfo(np.int16).max or w.shape[0] > 127:
        raise ValueError(f"head view supports up to 32767 tokens a side and 127 heads, got {w.shape}")
    # Threshold first (one pass over the (H, Lq, Lk) array; at most 1/min_weight candidates a row survive), then
    # rank the candidates within their row: much cheaper than a top-k over every row of the combined view at 512
    # tokens (8 x 1024 x 1024).
    h, q, k = np.nonzero(w >= min_weight)
    weights = w[h, q, k]
    if top_k is not None and top_k < w.shape[-1] and len(weights):
        rows = h.astype(np.int64) * w.shape[1] + q
        order = np.lexsort((-weights, rows))  # by row, heaviest first
        sorted_rows = rows[order]
        first = np.r_[0, np.flatnonzero(np.diff(sorted_rows)) + 1]  # where each row's run starts
        rank = np.arange(len(order)) - np.repeat(first, np.diff(np.r_[first, len(order)]))
        keep = np.sort(order[rank < top_k])  # back to (head, query, key) order
        h, q, k, weights = h[keep], q[keep], k[keep], weights[keep]
    alpha = weights if highlight is None else np.where(q == highlight, weights, weights * DIM)
    return {"q": q.astype(np.int16), "k": k.astype(np.int16), "h": h.astype(np.int8), "w": weights,
            "alpha": alpha.astype(np.float32)}


DIM = 0.08  # opacity factor for lines of queries other than the tapped one
WINDOW_MARGIN = 0.5  # rows drawn beyond the visible window, as a fraction of its height (smooth short scrolls)
LEVELS = 24  # opacity levels: lines are drawn as one NaN-separated path per (head, level)


def bucket_paths(lines: dict[str, np.ndarray], colors: Sequence[str],
                 window: tuple[float, float] | None = None) -> dict[str, list]:
    """Group lines by (head, opacity level) into NaN-separated paths for one `multi_line` renderer.

    Bokeh strokes each `segment` separately: 22k lines took ~13 s to first paint in headless Chromium at
    300 tokens. One path per (head, level) is at most heads x LEVELS strokes. _UPDATE_JS does the same.
    window: (lo, hi) rows; only lines that cross it are drawn (BokehJS strokes every path of a multi_line,
    visible or not, so a long sentence's page draws what its scrolled window shows, plus a margin).
    """
    alpha = np.asarray(lines["alpha"], dtype=np.float32)
    shown = alpha > 0
    if window is not None:
        q, k = np.asarray(lines["q"]), np.asarray(lines["k"])
        shown &= (np.maximum(q, k) >= window[0]) & (np.minimum(q, k) <= window[1])
    level = np.minimum((alpha * LEVELS).astype(np.int64), LEVELS - 1)
    key = np.asarray(lines["h"], dtype=np.int64) * LEVELS + level
    out: dict[str, list] = {"xs": [], "ys": [], "color": [], "alpha": []}
    for b in np.unique(key[shown]):
        idx = np.nonzero(shown & (key == b))[0]
        n = len(idx)
        out["xs"].append(np.tile(np.array([0.02, 0.98, np.nan], dtype=np.float32), n))
        out["ys"].append(np.stack([lines["q"][idx], lines["k"][idx], np.full(n, np.nan)], 1).astype(np.float32)
                         .ravel())
        out["color"].append(colors[b // LEVELS])
        out["alpha"].append(float((b % LEVELS + 0.5) / LEVELS))
    return out


# One callback for head toggles, query taps, the layer picker and scrolling: rebuild alpha from the current layer's
# weights, then the (head, level) paths of the lines crossing the window exactly as bucket_paths does. A scroll that
# stays inside the drawn window (rows shown + margin) does nothing, and a scroll never rewrites `src`: under
# `panel serve` every data change travels to the server.
_UPDATE_JS = """
const scrolled = yr !== null && cb_obj === yr;
let lo = -Infinity, hi = Infinity;
if (yr) {  // the rows shown, widened by WINDOW_MARGIN of their span on each side
    const y0 = Math.min(yr.start, yr.end), y1 = Math.max(yr.start, yr.end), m = margin * (y1 - y0);
    if (scrolled && y0 >= drawn.lo && y1 <= drawn.hi) return;
    lo = y0 - m; hi = y1 + m; drawn.lo = lo; drawn.hi = hi;
}
const d = picker ? store[picker.value].data : src.data;
const q = d.q, k = d.k, h = d.h;
const w = picker ? Float32Array.from(d.w8, x => x / 255) : d.w;  // stored layers carry 8-bit weights
const on = new Set(buttons.active), sel = new Set(qsrc.selected.indices);
const a = new Float32Array(w.length);
for (let i = 0; i < w.length; i++)
    a[i] = !on.has(h[i]) ? 0 : (sel.size == 0 || sel.has(q[i])) ? w[i] : w[i] * dim;
if (!scrolled) src.data = {q: q, k: k, h: h, w: w, alpha: a};
const groups = new Map();
for (let i = 0; i < w.length; i++) {
    if (a[i] <= 0 || Math.max(q[i], k[i]) < lo || Math.min(q[i], k[i]) > hi) continue;
    const b = h[i] * levels + Math.min(Math.floor(a[i] * levels), levels - 1);
    if (!groups.has(b)) groups.set(b, []);
    groups.get(b).push(i);
}
const out = {xs: [], ys: [], color: [], alpha: []};
for (const b of [...groups.keys()].sort((x, y) => x - y)) {
    const idx = groups.get(b), xs = new Float32Array(3 * idx.length), ys = new Float32Array(3 * idx.length);
    idx.forEach((i, j) => { xs[3*j] = 0.02; xs[3*j+1] = 0.98; xs[3*j+2] = NaN;
                            ys[3*j] = q[i]; ys[3*j+1] = k[i]; ys[3*j+2] = NaN; });
    out.xs.push(xs); out.ys.push(ys); out.color.push(colors[Math.floor(b / levels)]);
    out.alpha.push((b % levels + 0.5) / levels);
}
paths.data = out;
"""


def head_view_figure(
    atts: Sequence[Attention],
    *,
    labels: Sequence[str] | None = None,
    min_weight: float = 0.01,
    top_k: int | None = 16,
    highlight: int | None = None,
    width: int = 520,
    row_height: int = 18,
    max_height: int = 900,
    max_label: int = 20,
):
    """Head view of several layers (`atts`, one per layer, same tokens and heads); a picker chooses the layer.

    labels: the picker's name for each entry (default: "layer i"). Heads are toggled with the buttons above
    the figure; colours follow the head index (the key is drawn in the figure). Past max_height the figure
    shows a window of rows that the mouse wheel scrolls.
    """
    labels = _layer_labels(atts, labels)
    first = atts[0]
    n = max(len(first.queries), len(first.keys))
    rows_shown = min(n, max(8, (max_height - 80) // row_height))
    windowed = rows_shown < n  # long sentence: draw only the lines crossing the scrolled window
    window = None
    if windowed:
        window = (-0.5 - WINDOW_MARGIN * rows_shown, rows_shown - 0.5 + WINDOW_MARGIN * rows_shown)
    fig = _lines_figure(first, len(atts), rows_shown, min_weight=min_weight, top_k=top_k, width=width,
                        row_height=row_height, max_height=max_height)
    all_colors = head_colors(first.n_heads_total or max(first.heads) + 1)
    colors = [all_colors[h] for h in first.heads]
    per_layer = {label: line_data(a.values, min_weight, top_k, highlight) for label, a in zip(labels, atts)}
    src = ColumnDataSource(per_layer[labels[0]], name=SEGMENTS_NAME)  # the exact lines; not drawn itself
    paths = ColumnDataSource(bucket_paths(per_layer[labels[0]], colors, window), name=PATHS_NAME)
    # 1 px: Chromium's canvas strokes hairlines far faster than wider lines (measured 4.2 s vs 31 s for 22k
    # lines on a 5480 px tall software-rendered canvas; 1.5 s with no lines at all).
    fig.multi_line(xs="xs", ys="ys", source=paths, line_color="color", line_alpha="alpha", line_width=1)
    qsrc = _tokens_and_key(fig, first, colors, highlight, max_label)
    buttons = CheckboxButtonGroup(labels=[f"h{h}" for h in first.heads], active=list(range(len(first.heads))),
                                  name="head_toggles")
    store, picker = {}, None
    if len(atts) > 1:  # every layer's lines ride along (8-bit weights: opacity needs no more); alpha is rebuilt
        store = {label: ColumnDataSource({"q": d["q"], "k": d["k"], "h": d["h"],
                                          "w8": np.round(d["w"] * 255).astype(np.uint8)})
                 for label, d in per_layer.items()}
        picker = Select(title="layer", value=labels[0], options=labels, width=160, name="layer_picker")
    update = CustomJS(args={"src": src, "paths": paths, "store": store, "picker": picker, "buttons": buttons,
                            "qsrc": qsrc, "dim": DIM, "levels": LEVELS, "colors": colors,
                            "yr": fig.y_range if windowed else None, "margin": WINDOW_MARGIN,
                            "drawn": {"lo": window[0], "hi": window[1]} if windowed else {}}, code=_UPDATE_JS)
    qsrc.selected.js_on_change("indices", update)
    buttons.js_on_change("active", update)
    controls = [buttons]
    if picker is not None:
        picker.js_on_change("value", update)
        controls.insert(0, picker)
    if windowed:
        fig.y_range.js_on_change("start", update)
        fig.y_range.js_on_change("end", update)
    return column(row(*controls), fig)


def _lines_figure(first: Attention, n_layers: int, rows_shown: int, *, min_weight: float, top_k: int | None,
                  width: int, row_height: int, max_height: int):
    """The empty figure: queries at x 0, keys at x 1, `rows_shown` rows of the longer side in view, its title
    saying which lines are hidden."""
    n = max(len(first.queries), len(first.keys))
    dropped = f" (lines < {min_weight:g}" + (f", beyond top {top_k} per query" if top_k else "") + " hidden)"
    title = first.describe() if n_layers == 1 else first.describe().split(", layer")[0]
    fig = figure(
        # Long sentences: a window of rows, scrolled with the mouse wheel (pan) instead of a canvas thousands of
        # pixels tall, which the browser repaints whole (painting cost grows with the canvas; see docs/views.md).
        width=width, height=max(240, min(max_height, n * row_height + 80)), x_range=Range1d(-0.75, 1.75),
        y_range=Range1d(rows_shown - 0.5, -0.5, bounds=(-0.5, n - 0.5)),
        tools="tap,ywheel_pan,ywheel_zoom,ypan,reset,save", active_scroll="ywheel_pan", toolbar_location="above",
        title=title + dropped,
    )
    fig.axis.visible = False
    fig.grid.visible = False
    fig.title.text_font_size = "11px"
    return fig


def _layer_labels(atts: Sequence[Attention], labels: Sequence[str] | None) -> list[str]:
    """The picker's distinct label per layer (default "layer i"), after checking every layer shares tokens and
    heads."""
    if not atts:
        raise ValueError("head_view needs at least one layer of attention")
    first = atts[0]
    for a in atts[1:]:
        if (a.queries, a.keys, a.heads) != (first.queries, first.keys, first.heads):
            raise ValueError("every layer in a head view must share tokens and heads")
    labels = [f"layer {a.layer}" for a in atts] if labels is None else list(labels)
    if len(labels) != len(atts) or len(set(labels)) != len(labels):
        raise ValueError(f"need one distinct label per layer, got {labels}")
    return labels


def _tokens_and_key(fig, first: Attention, colors: list[str], highlight: int | None, max_label: int
                    ) -> ColumnDataSource:
    """Draw the query tokens (left, tappable) and key tokens (right) with their dots, and the heads' colour key;
    returns the queries' source, whose selection is the highlighted query."""
    lq, lk = len(first.queries), len(first.keys)
    short = lambda t: t if len(t) <= max_label else t[: max_label - 1] + "…"  # noqa: E731
    qsrc = ColumnDataSource({"x": np.zeros(lq), "y": np.arange(lq), "t": [short(t) for t in first.queries]})
    ksrc = ColumnDataSource({"x": np.ones(lk), "y": np.arange(lk), "t": [short(t) for t in first.keys]})
    for source, align, offset in ((qsrc, "right", -6), (ksrc, "left", 4)):
        fig.text(x="x", y="y", text="t", source=source, text_align=align, text_baseline="middle", x_offset=offset,
                 text_font_size="11px")
    qdots = fig.scatter(x="x", y="y", source=qsrc, size=7, color="#444444", nonselection_alpha=0.4)
    fig.scatter(x="x", y="y", source=ksrc, size=7, color="#444444")
    if highlight is not None:
        qsrc.selected.indices = [highlight]
    # Colour key: one off-screen square per head, shown by a legend that reads each item's own row.
    key = fig.scatter(x=[-10.0] * len(colors), y=[0] * len(colors), color=colors, marker="square", size=10)
    fig.add_layout(Legend(items=[LegendItem(label=f"head {h}", renderers=[key], index=i)
                                 for i, h in enumerate(first.heads)], label_text_font_size="10px"), "right")
    fig.select_one(TapTool).renderers = [qdots]
    return qsrc


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

"""Model view: every layer x head of a block kind as thumbnails in ONE figure, tap a tile to enlarge it.

Tiles are uint8 (1 byte a cell, 0 reserved for masked cells, 1..255 the weight over the tile's max, as
BertViz scales each thumbnail) and block-averaged down to `thumb` cells a side, so a 6x8 grid at 512
tokens stays ~0.8 MB. The enlarged panel shows the tapped tile at that stored resolution (its title says
when that is downsampled); an app that wants full resolution watches `tiles.selected.indices` and draws
`attention_heatmap` for the tapped (layer, head).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from bokeh.layouts import column, row
from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    CustomJSHover,
    HoverTool,
    LinearColorMapper,
    Range1d,
    TapTool,
)
from bokeh.palettes import Viridis256
from bokeh.plotting import figure

from ..core.heads import KINDS, AttentionKind
from ..core.trace import Trace
from .heatmap import MASKED_COLOR, downsample, label_axes, token_axis_js
from .select import KIND_LABEL, Attention, select_attention

TILE_PALETTE = [MASKED_COLOR] + list(Viridis256[1:])  # index 0 = masked
TILES_NAME = "model_view_tiles_{}"


def quantize(values: np.ndarray, masked: np.ndarray, thumb: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(H, Lq, Lk) weights -> (uint8 tiles, per-tile scale (H,), downsampling factor).

    0 = masked; otherwise 1 + round(254 * w / scale), scale = the tile's largest weight.
    """
    img, factor = downsample(np.asarray(values, dtype=np.float32).reshape(-1, *values.shape[-2:]), thumb, masked)
    finite = np.isfinite(img)
    scale = np.where(finite, img, 0).max(axis=(-2, -1))
    scale = np.where(scale > 0, scale, 1.0).astype(np.float64)
    tiles = np.where(finite, 1 + np.round(254 * np.where(finite, img, 0) / scale[:, None, None]), 0)
    return tiles.astype(np.uint8), scale, factor


def model_view_figure(
    atts: Sequence[Attention],
    *,
    thumb: int = 96,
    tile_px: int = 72,
    title: str | None = None,
):
    """Grid figure (rows = layers, columns = heads) plus an enlarged panel for the tapped tile."""
    if not atts:
        raise ValueError("model view needs at least one layer")
    first = atts[0]
    lq, lk = len(first.queries), len(first.keys)
    n_rows, n_cols = len(atts), max(len(a.heads) for a in atts)
    cols = _tile_columns(atts, thumb)
    mapper = LinearColorMapper(palette=TILE_PALETTE, low=0, high=255)
    title = title or f"{KIND_LABEL[first.kind]}: layers x heads ({lq}x{lk} tokens; tap a tile)"
    grid = figure(
        width=min(1400, n_cols * tile_px + 80), height=n_rows * tile_px + 70,
        x_range=Range1d(0, n_cols), y_range=Range1d(n_rows, 0), tools="tap,reset,save", title=title,
        toolbar_location="above",
    )
    cols["right"] = [x + w for x, w in zip(cols["x"], cols["dw"])]
    cols["top"] = [y + h for y, h in zip(cols["y"], cols["dh"])]
    tiles = ColumnDataSource(cols, name=TILES_NAME.format(first.kind))
    # The y range is flipped (layer 0 on top), which also puts each tile's query 0 on top.
    grid.image(source=tiles, image="image", x="x", y="y", dw="dw", dh="dh", color_mapper=mapper)
    # Invisible quads over the tiles carry taps and hover (image glyphs have no per-tile hit test).
    hit = grid.quad(source=tiles, left="x", right="right", bottom="y", top="top", fill_alpha=0, line_alpha=0,
                    selection_line_color="#ff2d55", selection_line_alpha=1, selection_line_width=3,
                    selection_fill_alpha=0, nonselection_fill_alpha=0, nonselection_line_alpha=0)
    grid.add_tools(HoverTool(renderers=[hit], tooltips=[("layer", "@layer"), ("head", "@head"),
                                                          ("max weight", "@scale{0.000}")]))
    grid.select_one(TapTool).renderers = [hit]
    grid.xaxis.ticker = [c + 0.5 for c in range(n_cols)]
    grid.xaxis.major_label_overrides = {c + 0.5: f"h{h}" for c, h in enumerate(first.heads)}
    grid.yaxis.ticker = [r + 0.5 for r in range(n_rows)]
    grid.yaxis.major_label_overrides = {r + 0.5: f"L{a.layer}" for r, a in enumerate(atts)}
    grid.grid.visible = False

    big, big_src = _enlarged_tile(first, cols)
    tiles.selected.js_on_change("indices", CustomJS(args={"tiles": tiles, "big": big_src, "fig": big}, code="""
        const i = tiles.selected.indices[0];
        if (i === undefined) return;
        const d = tiles.data;
        big.data = {...big.data, image: [d.image[i]], scale: [d.scale[i]]};
        const f = d.factor[i];
        fig.title.text = 'layer ' + d.layer[i] + ', head ' + d.head[i] + (f > 1 ? ' [downsampled x' + f + ']' : '');
    """))
    return row(grid, big)


def _tile_columns(atts: Sequence[Attention], thumb: int) -> dict[str, list]:
    """The grid's column data: one 8-bit thumbnail per (layer, head) with its place (row = layer, column =
    head), weight scale and downsampling factor."""
    gap = 0.08
    cols: dict[str, list] = {k: [] for k in ("image", "x", "y", "dw", "dh", "layer", "head", "scale", "factor")}
    for r, att in enumerate(atts):
        tiles_l, scales, factor = quantize(att.values, att.masked, thumb)
        for c, h in enumerate(att.heads):
            tile, scale = tiles_l[c], float(scales[c])
            cols["image"].append(tile)
            cols["x"].append(c + gap / 2)
            cols["y"].append(r + gap / 2)
            cols["dw"].append(1 - gap)
            cols["dh"].append(1 - gap)
            cols["layer"].append(att.layer)
            cols["head"].append(h)
            cols["scale"].append(scale)
            cols["factor"].append(factor)
    return cols


def _enlarged_tile(first: Attention, cols: dict[str, list]):
    """(figure, source) of the enlarged panel, showing the first tile until one is tapped."""
    lq, lk = len(first.queries), len(first.keys)
    big_src = ColumnDataSource({"image": [cols["image"][0]], "x": [-0.5], "y": [-0.5], "dw": [lk], "dh": [lq],
                                "scale": [cols["scale"][0]]})
    big = figure(width=min(700, max(300, 14 * lk + 140)), height=min(700, max(280, 14 * lq + 120)),
                 x_range=Range1d(-0.5, lk - 0.5), y_range=Range1d(lq - 0.5, -0.5), tools="pan,wheel_zoom,reset,save",
                 title=_big_title(first.layer, first.heads[0], cols["factor"][0]), toolbar_location="above")
    big_r = big.image(source=big_src, image="image", x="x", y="y", dw="dw", dh="dh",
                      color_mapper=LinearColorMapper(palette=TILE_PALETTE, low=0, high=255))
    weight = CustomJSHover(args={"src": big_src}, code="""
        if (value == 0) return 'masked';
        return ((value - 1) / 254 * src.data.scale[0]).toFixed(3) + ' (8-bit)';""")
    big.add_tools(HoverTool(renderers=[big_r], tooltips=[("query", "$y{custom}"), ("key", "$x{custom}"),
                                                          ("weight", "@image{custom}")],
                            formatters={"$y": token_axis_js(first.queries), "$x": token_axis_js(first.keys),
                                        "@image": weight}))
    label_axes(big, first.queries, first.keys)
    big.grid.visible = False
    return big, big_src


def _big_title(layer: int, head: int, factor: int) -> str:
    return f"layer {layer}, head {head}" + (f" [downsampled x{factor}]" if factor > 1 else "")


def model_view(
    trace: Trace,
    kinds: AttentionKind | Sequence[AttentionKind] = KINDS,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    batch: int = 0,
    compare: int | None = None,
    words: bool = False,
    select: dict | None = None,
    **kw,
):
    """Grids for each kind present in the trace. layers / heads filter rows / columns (per kind, layers
    beyond that kind's depth are skipped, so 6-layer encoders and 3-layer decoders share one filter).
    compare: a second sentence of the batch, drawn beside `batch`.
    """
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    panels = []
    for kind in kinds:
        depth = trace.layers(kind)
        if depth == 0:
            continue
        chosen = [i for i in (range(depth) if layers is None else layers) if 0 <= i < depth]
        if not chosen:
            continue
        sentences = [batch] if compare is None else [batch, compare]
        views = []
        for b in sentences:
            atts = [select_attention(trace, kind, i, heads, batch=b, words=words, **(select or {})) for i in chosen]
            label = f"{KIND_LABEL[kind]}, sentence {b}: layers x heads ({len(atts[0].queries)}x{len(atts[0].keys)})"
            views.append(model_view_figure(atts, title=label, **kw))
        panels.append(views[0] if len(views) == 1 else row(*views))
    if not panels:
        raise ValueError(f"no attention of kinds {kinds} (layers {layers}) in this trace: {trace.names()[:6]}")
    return panels[0] if len(panels) == 1 else column(*panels)


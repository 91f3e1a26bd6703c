"""Attention heatmaps drawn as one Bokeh `image` (4 bytes a cell, flat cost from 32 to 512+ tokens).

Measured in /work/shared/panel-browser-recipe.md: `image` repaints in one frame at 512x512, where one
`rect` per cell takes ~0.8 s a frame and 5 MB over the wire. Masked cells are NaN in the array and
drawn in the mapper's `nan_color`; hover names the query token, the key token and the weight.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from bokeh.models import (
    AdaptiveTicker,
    ColorBar,
    ColumnDataSource,
    CustomJSHover,
    HoverTool,
    LinearColorMapper,
    Range1d,
)
from bokeh.palettes import RdBu11, interp_palette
from bokeh.plotting import figure

from ..core.heads import AttentionKind
from ..core.trace import Trace
from .select import Attention, Heads, select_attention

MASKED_COLOR = "#c8c8c8"  # light grey: cells the model could not attend to (padding, causal future)
IMAGE_NAME = "attention_image"  # renderer name, so an app can swap `data_source.data` without a rebuild
HIGHLIGHT_NAME = "attention_highlight"
PALETTE = "Viridis256"
DIVERGING = tuple(interp_palette(RdBu11, 255))  # smooth blue (negative) -> white -> red (positive)


def downsample(values: np.ndarray, max_size: int, masked: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Block-average the last two axes so neither exceeds max_size; returns (array, factor).

    Masked cells (`masked`, broadcast over leading axes; default: the NaN cells) are left out of a block's
    mean, and an all-masked block comes out NaN.
    """
    lq, lk = values.shape[-2:]
    factor = max(1, math.ceil(max(lq, lk) / max_size))
    if factor == 1:
        if masked is None:
            return values, 1
        return np.where(masked, np.float32(np.nan), values).astype(np.float32), 1
    if masked is None:
        masked = ~np.isfinite(values)
    total = _block_sum(np.where(masked, np.float32(0), values).astype(np.float32), factor)
    count = _block_sum((~masked).astype(np.float32), factor)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total / count).astype(np.float32), factor  # 0/0 -> NaN for all-masked blocks


def _block_sum(x: np.ndarray, factor: int) -> np.ndarray:
    """Sum over factor x factor blocks of the last two axes (zero-padded at the end). torch's pooling: ~3x
    faster than numpy's strided sum, which matters for the model view's 48 tiles a kind at 512 tokens."""
    lq, lk = x.shape[-2:]
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).reshape(-1, 1, lq, lk)
    t = torch.nn.functional.pad(t, (0, -lk % factor, 0, -lq % factor))
    out = torch.nn.functional.avg_pool2d(t, factor, divisor_override=1)
    return out.reshape(*x.shape[:-2], *out.shape[-2:]).numpy()


def image_data(values: np.ndarray, masked: np.ndarray | None, max_size: int = 1024) -> tuple[dict, int]:
    """The ColumnDataSource dict of a heatmap: float32 image with NaN where masked, in token coordinates."""
    img = np.array(values, dtype=np.float32)
    if masked is not None:
        img[masked] = np.nan
    img, factor = downsample(img, max_size)
    lq, lk = values.shape
    return {"image": [img], "x": [-0.5], "y": [-0.5], "dw": [lk], "dh": [lq]}, factor


def token_axis_js(tokens: Sequence[str]) -> CustomJSHover:
    """Hover formatter: a data coordinate -> 'token (index)'."""
    return CustomJSHover(
        args={"tokens": list(tokens)},
        code="const i = Math.round(value); return (i >= 0 && i < tokens.length) ? tokens[i] + ' (' + i + ')' : '';",
    )


def weight_js(digits: int = 4) -> CustomJSHover:
    """Hover formatter for a cell value: NaN reads 'masked'. (A new model per figure: Bokeh models live in one doc.)"""
    return CustomJSHover(code=f"return (value === null || isNaN(value)) ? 'masked' : value.toFixed({digits});")


def label_axes(fig, queries: Sequence[str], keys: Sequence[str], max_label: int = 16) -> None:
    """Token names as tick labels; integer ticks only, so zooming in reveals every token."""
    short = lambda t: t if len(t) <= max_label else t[: max_label - 1] + "…"
    nx, ny = max(2, (fig.width or 600) // 16), max(2, (fig.height or 600) // 16)  # ~16 px a label
    fig.xaxis.ticker = AdaptiveTicker(mantissas=[1, 2, 5], min_interval=1, desired_num_ticks=min(len(keys), nx))
    fig.yaxis.ticker = AdaptiveTicker(mantissas=[1, 2, 5], min_interval=1, desired_num_ticks=min(len(queries), ny))
    fig.xaxis.major_label_overrides = {i: short(t) for i, t in enumerate(keys)}
    fig.yaxis.major_label_overrides = {i: short(t) for i, t in enumerate(queries)}
    fig.xaxis.major_label_orientation = math.pi / 2
    fig.xaxis.axis_label, fig.yaxis.axis_label = "key", "query"


def matrix_figure(
    values: np.ndarray,
    queries: Sequence[str],
    keys: Sequence[str],
    *,
    masked: np.ndarray | None = None,
    title: str = "",
    palette: str | Sequence[str] = PALETTE,
    low: float = 0.0,
    high: float | None = None,
    width: int | None = None,
    height: int | None = None,
    max_size: int = 1024,
    highlight: int | None = None,
    colorbar: bool = True,
    value_label: str = "weight",
    axis_labels: tuple[str, str] = ("query", "key"),
):
    """A (Lq, Lk) matrix as a Bokeh image with token axes, token hover and masked cells in grey.
    `axis_labels`: (rows, columns) as the hover names them; given explicitly, also the axis titles."""
    values = np.asarray(values)
    lq, lk = values.shape
    if (lq, lk) != (len(queries), len(keys)):
        raise ValueError(f"matrix is {lq}x{lk} but {len(queries)} query and {len(keys)} key tokens were given")
    shown = matrix_values(values, masked, title=title, low=low, high=high, max_size=max_size, highlight=highlight)
    cell = max(2, min(18, 640 // max(lq, lk, 1)))
    width = width or max(380, min(900, lk * cell + 150))
    height = height or max(220, min(900, lq * cell + 110))
    fig = figure(
        title=shown.title, width=width, height=height, x_range=Range1d(-0.5, lk - 0.5, bounds=(-0.5, lk - 0.5)),
        y_range=Range1d(lq - 0.5, -0.5, bounds=(-0.5, lq - 0.5)), tools="pan,wheel_zoom,box_zoom,reset,save",
        toolbar_location="above",
    )
    fig.title.text_font_size = "11px"
    mapper = LinearColorMapper(palette=palette, low=shown.low, high=shown.high, nan_color=MASKED_COLOR)
    renderer = fig.image(source=ColumnDataSource(shown.image), image="image", x="x", y="y", dw="dw", dh="dh",
                         color_mapper=mapper, name=IMAGE_NAME)
    fig.add_tools(HoverTool(
        renderers=[renderer],
        tooltips=[(axis_labels[0], "$y{custom}"), (axis_labels[1], "$x{custom}"), (value_label, "@image{custom}")],
        formatters={"$y": token_axis_js(queries), "$x": token_axis_js(keys), "@image": weight_js()},
    ))
    label_axes(fig, queries, keys)
    fig.grid.visible = False
    fig.quad(source=ColumnDataSource(shown.highlight), top="top", bottom="bottom", left="left", right="right",
             fill_alpha=0, line_color="#ff2d55", line_width=2, name=HIGHLIGHT_NAME)
    if axis_labels != ("query", "key"):
        fig.yaxis.axis_label, fig.xaxis.axis_label = axis_labels
    if colorbar:
        fig.add_layout(ColorBar(color_mapper=mapper, width=10, title=value_label), "right")
    return fig


@dataclass(frozen=True)
class MatrixValues:
    """What a `matrix_figure` shows of its matrix: the image's data source, the colour range, the title (with its
    downsampling note) and the highlighted row's data source. Everything else in the figure follows the tokens."""

    image: dict
    low: float
    high: float
    title: str
    highlight: dict


def matrix_values(values: np.ndarray, masked: np.ndarray | None = None, *, title: str = "", low: float = 0.0,
                  high: float | None = None, max_size: int = 1024, highlight: int | None = None) -> MatrixValues:
    """The parts of a `matrix_figure` that depend on the values (same arguments): `show_matrix_values` puts them
    into a figure already shown, so a new head needs no new figure."""
    values = np.asarray(values)
    lq, lk = values.shape
    data, factor = image_data(values, masked, max_size)
    if high is None:
        finite = values[~masked] if masked is not None and (~masked).any() else values
        high = float(np.nanmax(finite)) if finite.size else 1.0
        high = high if high > low else low + 1.0
    if factor > 1:
        title = f"{title} [downsampled x{factor}: block means]"
    rows = [] if highlight is None else [highlight]
    mark = {"top": [r - 0.5 for r in rows], "bottom": [r + 0.5 for r in rows], "left": [-0.5] * len(rows),
            "right": [lk - 0.5] * len(rows)}
    return MatrixValues(data, low, high, title, mark)


def show_matrix_values(shown, new: MatrixValues) -> None:
    """Put `new` into `shown`, a `matrix_figure` of the same tokens (shape, labels, hover): its image, colour range,
    highlighted row and title change in place; one data source for the page to update, nothing is built.

    On a served page, call it where the page's document lock is held (see `ui.views.AttentionView`)."""
    image = shown.select_one({"name": IMAGE_NAME})
    if image.data_source.data["dw"] != new.image["dw"] or image.data_source.data["dh"] != new.image["dh"]:
        raise ValueError("show_matrix_values: the new matrix has another shape than the shown figure's")
    image.glyph.color_mapper.update(low=new.low, high=new.high)
    image.data_source.data = dict(new.image)
    shown.select_one({"name": HIGHLIGHT_NAME}).data_source.data = dict(new.highlight)
    shown.title.text = new.title


def heatmap_values(att: Attention, *, highlight: int | None = None, title: str | None = None,
                   **kw) -> MatrixValues:
    """`heatmap(att, ...)`'s `MatrixValues`, without building it."""
    return matrix_values(att.mean, att.masked, title=att.describe() if title is None else title,
                         highlight=highlight, **kw)


def heatmap(att: Attention, *, highlight: int | None = None, **kw):
    """Draw a selected `Attention` (its head mean: one head, chosen heads or all)."""
    kw.setdefault("title", att.describe())
    return matrix_figure(att.mean, att.queries, att.keys, masked=att.masked, highlight=highlight, **kw)


def attention_heatmap(
    trace: Trace,
    kind: AttentionKind,
    layer: int,
    heads: Heads = None,
    *,
    batch: int = 0,
    words: bool = False,
    highlight: int | None = None,
    select: dict | None = None,
    **kw,
):
    """Heatmap of one block: `heads` is a head, a list of heads (averaged) or None (all, averaged).

    `select` passes token strings, trim and pad_id to `select_attention`; the rest goes to `matrix_figure`.
    """
    att = select_attention(trace, kind, layer, heads, batch=batch, words=words, **(select or {}))
    return heatmap(att, highlight=highlight, **kw)


def attention_heatmap_values(trace: Trace, kind: AttentionKind, layer: int, heads: Heads = None, *, batch: int = 0,
                             words: bool = False, highlight: int | None = None, select: dict | None = None,
                             **kw) -> MatrixValues:
    """`attention_heatmap(...)`'s `MatrixValues` (same arguments), for `show_matrix_values`: no figure is built."""
    att = select_attention(trace, kind, layer, heads, batch=batch, words=words, **(select or {}))
    return heatmap_values(att, highlight=highlight, **kw)


def altair_heatmap(att: Attention, *, max_cells: int = 5000, width: int = 360, height: int = 360):
    """Notebook-native Altair version of `heatmap` for short sentences: one rect per cell, tooltips, and a click
    on a query row highlights it. Refused past `max_cells` (Altair's own row limit): use the Bokeh heatmap there."""
    import altair as alt
    import pandas as pd

    values = att.mean
    lq, lk = values.shape
    if lq * lk > max_cells:
        raise ValueError(f"{lq}x{lk} = {lq * lk} cells is over max_cells={max_cells} for Altair; use heatmap(att)")
    q, k = np.meshgrid(np.arange(lq), np.arange(lk), indexing="ij")
    frame = pd.DataFrame({
        "q": q.ravel(), "k": k.ravel(), "weight": values.ravel().astype(float),
        "query": [att.queries[i] for i in q.ravel()], "key": [att.keys[j] for j in k.ravel()],
        "masked": att.masked.ravel(),
    })
    pick = alt.selection_point(fields=["q"], on="click", clear="dblclick")
    sort_q, sort_k = list(range(lq)), list(range(lk))
    base = alt.Chart(frame, title=att.describe(), width=width, height=height).encode(
        x=alt.X("k:O", sort=sort_k, title="key", axis=alt.Axis(labelExpr=_label_expr(att.keys))),
        y=alt.Y("q:O", sort=sort_q, title="query", axis=alt.Axis(labelExpr=_label_expr(att.queries))),
        tooltip=["query:N", "key:N", alt.Tooltip("weight:Q", format=".4f"), "masked:N"],
    )
    cells = base.mark_rect().encode(
        color=alt.condition("datum.masked", alt.value(MASKED_COLOR),
                            alt.Color("weight:Q", scale=alt.Scale(scheme="viridis", domainMin=0))),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.35)),
    ).add_params(pick)
    return cells


def _label_expr(tokens: Sequence[str]) -> str:
    """Vega expression mapping an axis index to its token (keeps the axis order by position, not by name)."""

    return f"{json.dumps(list(tokens))}[datum.value]"

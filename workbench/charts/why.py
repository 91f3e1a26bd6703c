"""Views of the "why" analyses: direct logit attribution (a layer x head grid per attention kind, the rest as
sorted bars) and patching effect maps on a diverging scale centred on "no effect" (data in, Bokeh out)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.plotting import figure

from .heatmap import DIVERGING, matrix_figure

POSITIVE, NEGATIVE = "#c0392b", "#2c6fbb"
HEAD_KINDS = {"dec_self": "decoder self-attention heads", "cross": "cross-attention heads"}


def logit_attribution_bars(dla, *, title: str = "", top: int | None = 12, width: int = 700, skip_heads: bool = False):
    """Horizontal bars of the `top` largest components by size, largest first, and one bar for the rest summed
    (`top=None`: every component, model order). `skip_heads`: heads are drawn elsewhere (the grid): their sum
    is one bar. Red pushes the logit up."""
    values = np.asarray(dla.values, dtype=np.float64)
    labels = list(dla.labels)
    kinds = [str(i.get("kind")) for i in dla.info]
    if skip_heads:
        heads = [i for i, inf in enumerate(dla.info) if inf.get("head_index") is not None]
        keep = [i for i in range(len(values)) if i not in set(heads)]
        labels = [labels[i] for i in keep] + ["all heads (grid)"]
        kinds = [kinds[i] for i in keep] + ["heads"]
        values = np.append(values[keep], values[heads].sum())
    order = list(range(len(values)))
    rest = []
    if top is not None:
        order = np.argsort(-np.abs(values), kind="stable").tolist()
        order, rest = order[:top], order[top:]
    names = [labels[i] for i in order] + ([f"the other {len(rest)}, summed"] if rest else [])
    vals = np.append(values[order], values[rest].sum()) if rest else values[order]
    kind = [kinds[i] for i in order] + (["rest"] if rest else [])
    src = ColumnDataSource({"y": names, "value": vals, "color": [POSITIVE if v >= 0 else NEGATIVE for v in vals],
                            "kind": kind})
    fig = figure(y_range=list(reversed(names)), width=width, height=max(200, 18 * len(names) + 90),
                 title=title or f"direct logit attribution (sum = logit {dla.logit:.3f})", toolbar_location="above",
                 tools="pan,wheel_zoom,reset,save", name="dla_bars")
    fig.hbar(y="y", right="value", height=0.8, color="color", source=src)
    fig.add_tools(HoverTool(tooltips=[("component", "@y"), ("kind", "@kind"), ("logit", "@value{0.000}")]))
    fig.xaxis.axis_label = "contribution to the logit"
    fig.yaxis.major_label_text_font_size = "10px"
    fig.title.text_font_size = "13px"
    return fig


def logit_attribution_grid(dla, *, title: str = "", top: int = 12, width: int = 900):
    """Direct logit attribution read at a glance: one layer x head heatmap per attention kind (one colour scale,
    centred on 0) above the sorted bars of embeddings, FFNs, biases and the heads' sum, all within `width` px."""
    values = np.asarray(dla.values, dtype=np.float64)
    bound = float(np.abs(values).max()) or 1.0
    grids = []
    for kind, name in HEAD_KINDS.items():
        cells = [(inf["layer"], inf["head_index"], v) for inf, v in zip(dla.info, values)
                 if inf.get("head_index") is not None and inf.get("kind") == kind]
        if not cells:
            continue
        layers = max(c[0] for c in cells) + 1
        heads = max(c[1] for c in cells) + 1
        grid = np.full((layers, heads), np.nan)
        for layer, head, v in cells:
            grid[layer, head] = v
        grids.append(matrix_figure(grid, [f"layer {i}" for i in range(layers)], [f"head {h}" for h in range(heads)],
                                   masked=~np.isfinite(grid), title=name, palette=DIVERGING, low=-bound, high=bound,
                                   value_label="logit", axis_labels=("layer", "head"),
                                   width=min(420, 60 * heads + 150), height=max(180, 34 * layers + 110)))
    bars = logit_attribution_bars(dla, title="embeddings, FFNs, biases (largest first)", top=top, width=width,
                                  skip_heads=True)
    for g in grids:
        g.name = f"dla_grid_{g.title.text.split()[0]}"
    if grids:  # the grids share `width` when they would not fit side by side; the bars go under them
        fit = max(200, (width - 10 * (len(grids) - 1)) // len(grids))
        for g in grids:  # stretch up to their own width: fixed children of a stretching layout are squeezed to nothing
            g.max_width, g.sizing_mode = min(g.width, fit), "stretch_width"
    out = column(row(*grids, sizing_mode="stretch_width"), bars, sizing_mode="stretch_width") if grids else column(bars)
    out.name = "dla_view"
    if title:
        bars.title.text = title + " — " + bars.title.text
        bars.name = "dla_bars"
    return out


def patching_heatmap(values, rows: Sequence[str], positions: Sequence[str], *, title: str = "",
                     value_label: str = "normalized metric", height: int | None = None,
                     axis_labels: tuple[str, str] = ("site", "position"), center: float = 0.0):
    """A (sites, positions) patching map on a diverging scale centred on `center` (NaN: no such position).

    Centre it on "no effect" (the clean metric, or 0 for an effect), so sites that do nothing stay white and
    the ones that matter are the ones that stand out."""
    v = np.asarray(values, dtype=np.float64)
    finite = v[np.isfinite(v)] - center
    bound = float(np.abs(finite).max()) if finite.size else 1.0
    bound = bound or 1.0
    return matrix_figure(v, list(rows), list(positions), masked=~np.isfinite(v), title=title, palette=DIVERGING,
                         low=center - bound, high=center + bound, value_label=value_label, axis_labels=axis_labels,
                         height=height or min(900, max(240, 16 * len(rows) + 130)))

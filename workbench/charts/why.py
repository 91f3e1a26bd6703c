"""Views of the "why" analyses: direct logit attribution bars and patching heatmaps (data in, Bokeh out)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.plotting import figure

from .heatmap import DIVERGING, matrix_figure

POSITIVE, NEGATIVE = "#c0392b", "#2c6fbb"


def logit_attribution_bars(dla, *, title: str = "", top: int | None = None, width: int = 700):
    """One horizontal bar per component (model order, or the `top` largest by size), red pushes the logit up."""
    values = np.asarray(dla.values, dtype=np.float64)
    order = list(range(len(values)))
    if top is not None and top < len(values):
        order = sorted(np.argsort(-np.abs(values))[:top].tolist())
    labels = [dla.labels[i] for i in order]
    vals = values[order]
    src = ColumnDataSource({"y": labels, "value": vals, "color": [POSITIVE if v >= 0 else NEGATIVE for v in vals],
                            "kind": [str(dla.info[i].get("kind")) for i in order]})
    fig = figure(y_range=list(reversed(labels)), width=width, height=max(200, 16 * len(labels) + 90),
                 title=title or f"direct logit attribution (sum = logit {dla.logit:.3f})", toolbar_location="above",
                 tools="pan,wheel_zoom,reset,save", name="dla_bars")
    fig.hbar(y="y", right="value", height=0.8, color="color", source=src)
    fig.add_tools(HoverTool(tooltips=[("component", "@y"), ("kind", "@kind"), ("logit", "@value{0.000}")]))
    fig.xaxis.axis_label = "contribution to the logit"
    fig.yaxis.major_label_text_font_size = "10px"
    fig.title.text_font_size = "13px"
    return fig


def patching_heatmap(values, rows: Sequence[str], positions: Sequence[str], *, title: str = "",
                     value_label: str = "normalized metric", height: int | None = None):
    """A (sites, positions) patching result on a diverging scale around 0 (NaN: the site has no such position)."""
    v = np.asarray(values, dtype=np.float64)
    finite = v[np.isfinite(v)]
    bound = float(np.abs(finite).max()) if finite.size else 1.0
    return matrix_figure(v, list(rows), list(positions), masked=~np.isfinite(v), title=title, palette=DIVERGING,
                         low=-(bound or 1.0), high=bound or 1.0, value_label=value_label,
                         height=height or min(900, max(240, 16 * len(rows) + 130)))

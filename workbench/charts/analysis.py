"""Views of the analyses in `workbench.analysis`: data in, Bokeh model out (no Panel).

    from workbench.charts.analysis import head_stats_table, head_stats_heatmap
    show(head_stats_heatmap(table, "entropy", kind="enc_self"))

Matrices reuse `matrix_figure` (one Bokeh image, hover names both axes), so every analysis heatmap
looks and behaves like the attention heatmaps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, DataTable, Div, NumberFormatter, TableColumn

from .heatmap import DIVERGING, matrix_figure
from .select import KIND_LABEL


def _frame_table(df, *, width: int = 900, height: int = 420, digits: int = 4) -> DataTable:
    """A sortable Bokeh DataTable of a DataFrame (click a header to sort)."""
    fmt = NumberFormatter(format="0." + "0" * digits, nan_format="–")
    cols = [TableColumn(field=c, title=c, formatter=fmt if df[c].dtype.kind == "f" else None)
            if df[c].dtype.kind == "f" else TableColumn(field=c, title=c) for c in df.columns]
    return DataTable(source=ColumnDataSource(df.reset_index(drop=True)), columns=cols, sortable=True,
                     width=width, height=height, index_position=None)


# ---------------------------------------------------------------------------- head statistics


def head_stats_table(table, *, kind: str | None = None, stats: Sequence[str] | None = None, **kw) -> DataTable:
    """One row per head with its corpus statistics; sortable by any column."""
    df = table.summary() if hasattr(table, "summary") else table
    if kind is not None:
        df = df[df["kind"] == kind]
    if stats is not None:
        missing = [s for s in stats if s not in df.columns]
        if missing:
            raise KeyError(f"unknown statistics {missing}; known: {list(df.columns[3:])}")
        df = df[["kind", "layer", "head", *stats]]
    df = df.dropna(axis=1, how="all")
    return _frame_table(df, **kw)


def head_stats_heatmap(table, stat: str, kind: str = "enc_self", **kw):
    """Layers × heads heatmap of one statistic for one block kind."""
    layers = [layer for k, layer in table.blocks if k == kind]
    if not layers:
        raise KeyError(f"no {kind} blocks in this table; blocks: {list(table.blocks)}")
    values = table.values(stat)
    rows = np.stack([values[table.block_index(kind, layer)] for layer in layers])
    kw.setdefault("title", f"{stat} per head, {KIND_LABEL.get(kind, kind)}")
    fig = layer_head_figure(rows, value_label=stat, **kw)
    return fig


def layer_head_figure(values: np.ndarray, *, value_label: str = "value", diverging: bool = False, **kw):
    """(layers, heads) matrix as a heatmap with 'layer i' / 'head j' axes."""
    values = np.asarray(values, dtype=np.float64)
    n_layers, n_heads = values.shape
    finite = values[np.isfinite(values)]
    if diverging:
        bound = float(np.abs(finite).max()) if finite.size else 1.0
        kw.setdefault("low", -bound or -1.0)
        kw.setdefault("high", bound or 1.0)
        kw.setdefault("palette", DIVERGING)
    else:
        kw.setdefault("low", float(finite.min()) if finite.size else 0.0)
    fig = matrix_figure(values, [f"layer {i}" for i in range(n_layers)], [f"head {h}" for h in range(n_heads)],
                        masked=~np.isfinite(values), value_label=value_label,
                        width=kw.pop("width", max(320, 70 * n_heads + 160)),
                        height=kw.pop("height", max(200, 50 * n_layers + 110)), **kw)
    fig.xaxis.axis_label, fig.yaxis.axis_label = "head", "layer"
    return fig


def head_stats_view(table, stat: str = "entropy"):
    """The table and one heatmap per block kind, stacked: the whole corpus report on one page."""
    kinds = [k for k in ("enc_self", "dec_self", "cross") if any(b[0] == k for b in table.blocks)]
    figs = [head_stats_heatmap(table, stat, k) for k in kinds if np.isfinite(table.values(stat)).any()]
    return column(Div(text=f"<b>Head statistics</b> over {len(table.sentence_ids)} sentences"),
                  head_stats_table(table), *figs)

"""Views of the analyses in `workbench.analysis`: data in, Bokeh model out (no Panel).

    from workbench.charts.analysis import head_stats_table, head_stats_heatmap
    show(head_stats_heatmap(table, "entropy", kind="enc_self"))

Matrices reuse `matrix_figure` (one Bokeh image, hover names both axes), so every analysis heatmap
looks and behaves like the attention heatmaps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, DataTable, Div, HoverTool, NumberFormatter, Range1d, TableColumn
from bokeh.plotting import figure

from ..analysis.attribution.attribution import step_agreement
from .heatmap import DIVERGING, matrix_figure
from .select import KIND_LABEL


def _frame_table(df, *, width: int = 900, height: int = 420, digits: int = 4, stretch: bool = False,
                 wide: Sequence[str] = ()) -> DataTable:
    """A sortable Bokeh DataTable of a DataFrame (click a header to sort). `stretch`: as wide as the page, with
    the `wide` columns (labels) given twice a number column's share."""
    fmt = NumberFormatter(format="0." + "0" * digits, nan_format="–")
    cols = [TableColumn(field=c, title=c, formatter=fmt, width=60) if df[c].dtype.kind == "f"
            else TableColumn(field=c, title=c, width=120 if c in wide else 60) for c in df.columns]
    data = {c: df[c].to_numpy() for c in df.columns}  # a dict: Bokeh's DataFrame path adds an index column
    size = {"sizing_mode": "stretch_width", "min_width": 600} if stretch else {"width": width}
    return DataTable(source=ColumnDataSource(data), columns=cols, sortable=True, height=height,
                     index_position=None, **size)


# ---------------------------------------------------------------------------- head statistics


def head_stats_table(table, *, kind: str | None = None, stats: Sequence[str] | None = None, **kw) -> DataTable:
    """One row per head with its corpus statistics; sortable by any column."""
    df = table.summary() if hasattr(table, "summary") else table
    if kind is not None:
        df = df[df["kind"] == kind]
    if stats is not None:
        missing = [s for s in stats if s not in df.columns]
        if missing:
            raise KeyError(f"unknown statistics {missing}; known: {list(df.columns[4:])}")
        df = df[["head_id", "kind", "layer", "head_index", *stats]]
    df = df.dropna(axis=1, how="all")
    if kw.get("stretch"):  # the head id (kind:layer:head) says what the three index columns say
        df = df.drop(columns=[c for c in ("kind", "layer", "head_index") if c in df.columns])
        kw.setdefault("wide", ("head_id",))
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
    """The table (the page's width) and one heatmap per block kind side by side: the whole corpus report on one
    page at 1000–1500 px."""
    kinds = [k for k in ("enc_self", "dec_self", "cross") if any(b[0] == k for b in table.blocks)]
    figs = [head_stats_heatmap(table, stat, k) for k in kinds if np.isfinite(table.values(stat)).any()]
    for fig in figs:  # side by side, sharing the page's width (each at least readable: 4 heads need ~300 px)
        fig.sizing_mode, fig.min_width = "stretch_width", 300
    return column(Div(text=f"<b>Head statistics</b> over {len(table.sentence_ids)} sentences"),
                  head_stats_table(table, stretch=True), row(*figs, sizing_mode="stretch_width"),
                  sizing_mode="stretch_width")


# ---------------------------------------------------------------------------- helpers

def _namer(tokens) -> Callable[[int], str]:
    """A vocabulary list or an id -> string function; ids print as themselves without either."""
    if tokens is None:
        return str
    if callable(tokens):
        return tokens
    return lambda i: tokens[i] if 0 <= i < len(tokens) else str(i)


def _labels(n: int, given: Sequence[str] | None, prefix: str = "") -> list[str]:
    if given is None:
        return [f"{prefix}{i}" for i in range(n)]
    if len(given) != n:
        raise ValueError(f"{len(given)} token labels for {n} positions")
    return list(given)


# ---------------------------------------------------------------------------- rollout, flow, norms


def relevance_heatmap(values, queries: Sequence[str] | None = None, keys: Sequence[str] | None = None, *,
                      title: str = "", value_label: str = "share", **kw):
    """Any (Lq, Lk) relevance matrix (rollout, flow, value norms, attribution) with token axes."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"need a (Lq, Lk) matrix, got shape {v.shape}")
    fig = matrix_figure(v, _labels(v.shape[0], queries), _labels(v.shape[1], keys), title=title,
                        value_label=value_label, high=kw.pop("high", None), **kw)
    return fig


def decoder_rollout_view(rollout, *, batch: int = 0, src_tokens=None, tgt_tokens=None):
    """Target rows: how much each comes from each source token (left) and each earlier target token (right)."""
    src = rollout.source[batch].numpy()
    tgt = rollout.target[batch].numpy()
    q = _labels(tgt.shape[0], tgt_tokens)
    high = float(max(src.max(), tgt.max()))
    share = rollout.source_share[batch].numpy()
    left = relevance_heatmap(src, q, _labels(src.shape[1], src_tokens), high=high,
                             title=f"rollout: source tokens (source share {share.mean():.2f} on average)")
    right = relevance_heatmap(tgt, q, q, high=high, title="rollout: target prefix")
    return row(left, right)


# ---------------------------------------------------------------------------- alignment and importance


def alignment_view(scores):
    """The AER table (best first) and a layers × heads AER heatmap (lower is better)."""
    heads = scores[scores["head_index"] != "mean"]
    layers = sorted(int(x) for x in heads["layer"].unique())
    n_heads = int(heads["head_index"].max()) + 1
    grid = np.full((len(layers), n_heads), np.nan)
    for _, r in heads.iterrows():
        grid[layers.index(int(r["layer"])), int(r["head_index"])] = r["aer"]
    label = scores["reference"].iloc[0]
    fig = layer_head_figure(grid, value_label="AER", title=f"alignment error rate per cross-attention head ({label})",
                            palette=tuple(reversed(matrix_palette())))
    table = _frame_table(scores.astype({"layer": str, "head_index": str, "head_id": str}))
    return column(fig, table)


def matrix_palette() -> tuple[str, ...]:
    from bokeh.palettes import Viridis256

    return tuple(Viridis256)


def head_importance_view(table, metric: str = "d_ref_log_prob"):
    """Per block kind a layers × heads heatmap of one delta (diverging: red = better, blue = worse), and the table."""
    if metric not in table.columns:
        raise KeyError(f"unknown metric {metric!r}; columns: {list(table.columns)}")
    figs = []
    per_head = table[table["head_index"] != "all"]
    for kind in ("enc_self", "dec_self", "cross"):
        part = per_head[per_head["kind"] == kind]
        if part.empty:
            continue
        n_layers, n_heads = int(part["layer"].max()) + 1, int(part["head_index"].max()) + 1
        grid = np.full((n_layers, n_heads), np.nan)
        for _, r in part.iterrows():
            grid[int(r["layer"]), int(r["head_index"])] = r[metric]
        figs.append(layer_head_figure(grid, value_label=metric, diverging=True,
                                      title=f"ablating one head: {metric}, {KIND_LABEL[kind]}"))
    return column(*figs, _frame_table(table.astype({"head_index": str, "head_id": str})))


def positional_share_view(df):
    """Layer-0 heads: share of |score| from positions, one row per attention kind."""
    kinds = list(dict.fromkeys(df["kind"]))
    n_heads = int(df["head_index"].max()) + 1
    grid = np.full((len(kinds), n_heads), np.nan)
    for _, r in df.iterrows():
        grid[kinds.index(r["kind"]), int(r["head_index"])] = r["pos_share"]
    fig = layer_head_figure(grid, value_label="positional share", title="layer 0: positional share of attention scores",
                            low=0.0, high=1.0)
    fig.yaxis.major_label_overrides = {i: f"{k} 0" for i, k in enumerate(kinds)}
    fig.yaxis.axis_label = "block"
    return column(fig, _frame_table(df))


# ---------------------------------------------------------------------------- logit lens


LENS_TEXT = "lens_tokens"


def logit_lens_view(lens, *, batch: int = 0, tokens=None, positions: Sequence[str] | None = None):
    """Layers (rows, embeddings at the top) × target positions: colour = probability of the top token,
    text = the top token."""
    name = _namer(tokens)
    probs = np.exp(lens.top_log_probs[:, batch, :, 0].numpy())  # (L+1, T)
    ids = lens.top_ids[:, batch, :, 0].numpy()
    n_layers, n_pos = probs.shape
    fig = matrix_figure(probs, list(lens.layers), _labels(n_pos, positions, "t"), low=0.0, high=1.0,
                        title="logit lens: top token after each layer", value_label="p(top)",
                        width=max(420, 60 * n_pos + 160), height=max(220, 36 * n_layers + 120))
    fig.xaxis.axis_label, fig.yaxis.axis_label = "decoder position (reads)", "layer"
    xs, ys, text = [], [], []
    for layer in range(n_layers):
        for t in range(n_pos):
            xs.append(t)
            ys.append(layer)
            text.append(name(int(ids[layer, t])))
    fig.text(x="x", y="y", text="text", source=ColumnDataSource({"x": xs, "y": ys, "text": text}),
             text_align="center", text_baseline="middle", text_font_size="10px", text_color="white", name=LENS_TEXT)
    return fig


# ---------------------------------------------------------------------------- attribution


def attribution_view(attribution, *, attention=None, src_tokens=None, tgt_tokens=None, method: str = "saliency"):
    """Attribution of each step's token to the source, beside the same step's attention, with the
    per-step Spearman agreement in the title."""

    values = {"saliency": attribution.source_saliency,
              "input_x_gradient": attribution.source_input_x_gradient}.get(method)
    if values is None:
        raise ValueError(f"method must be 'saliency' or 'input_x_gradient', got {method!r}")
    q = _labels(values.shape[0], tgt_tokens)
    k = _labels(values.shape[1], src_tokens)
    shown = np.abs(values) if method == "input_x_gradient" else values
    name = "input × gradient" if method == "input_x_gradient" else method  # as the pickers show it
    left = relevance_heatmap(shown, q, k, title=f"{name} (|·|) of log p(y_t)", value_label=name)
    if attention is None:
        return left
    att = np.asarray(attention, dtype=np.float64)
    rho = step_agreement(shown, att)
    right = relevance_heatmap(att, q, k, title=f"attention; Spearman with {name}: mean {np.nanmean(rho):.2f}",
                              value_label="weight")
    return row(left, right)


# ---------------------------------------------------------------------------- beam replay


TREE_NODES = "beam_nodes"
FATE_COLOR = {"alive": "#1f77b4", "finished": "#2ca02c", "pruned": "#b0b0b0", "final": "#d62728"}


def beam_tree_data(replay, tokens=None) -> dict[str, list]:
    """One node per candidate: x = step, y = rank within the step, fate, token, score, parent position."""
    name = _namer(tokens)
    data = {k: [] for k in ("x", "y", "token", "log_prob", "score", "fate", "color", "px", "py")}
    alive_y: dict[tuple[int, int], int] = {}  # (step, live beam) -> y of the candidate that made it
    final_tokens = replay.final[0]
    for st in replay.steps:
        for y, c in enumerate(st.candidates):
            if c.finished and st.step == replay.final_step and [*st.live[c.beam], c.token] == final_tokens:
                fate = "final"
            else:
                fate = "finished" if c.finished else "alive" if c.survivor is not None else "pruned"
            data["x"].append(st.step)
            data["y"].append(y)
            data["token"].append(name(c.token))
            data["log_prob"].append(c.log_prob)
            data["score"].append(np.nan if c.score is None else c.score)
            data["fate"].append(fate)
            data["color"].append(FATE_COLOR[fate])
            data["px"].append(st.step - 1)
            data["py"].append(alive_y.get((st.step, c.beam), 0))
            if c.survivor is not None:
                alive_y[(st.step + 1, c.survivor)] = y
    return data


def beam_tree_figure(replay, tokens=None, *, width: int | None = None):
    """The whole search: columns are steps, dots are candidates coloured by fate (blue survives, green
    finishes, grey is pruned, red is the output), lines join each candidate to the beam it extends."""
    data = beam_tree_data(replay, tokens)
    n_steps = len(replay.steps)
    fig = figure(title=f"beam search, sentence {replay.sentence}: candidates per step", toolbar_location="above",
                 width=width or max(500, 70 * n_steps + 120), height=60 + 34 * max(data["y"] + [1]),
                 tools="pan,wheel_zoom,reset,save", y_range=Range1d(max(data["y"] + [1]) + 0.5, -0.7))
    src = ColumnDataSource(data)
    fig.segment(x0="px", y0="py", x1="x", y1="y", source=src, line_color="color", line_alpha=0.5)
    nodes = fig.scatter(x="x", y="y", source=src, size=11, color="color", name=TREE_NODES)
    fig.text(x="x", y="y", text="token", source=src, x_offset=8, y_offset=-2, text_font_size="10px",
             text_baseline="middle")
    fig.add_tools(HoverTool(renderers=[nodes], tooltips=[("token", "@token"), ("step", "@x"), ("fate", "@fate"),
                                                         ("log p", "@log_prob{0.000}"), ("score", "@score{0.000}")]))
    fig.xaxis.axis_label, fig.yaxis.axis_label = "step", "candidate rank"
    fig.grid.visible = False
    return fig


def beam_step_view(replay, step: int, *, tokens=None, src_tokens=None, layer: int | None = None):
    """One step: its candidates (table) and the cross-attention of each live beam (heatmap, needs
    `add_cross_attention`), layer `layer` or the mean over layers, heads averaged."""
    import pandas as pd

    if not 0 <= step < len(replay.steps):
        raise IndexError(f"step {step} out of range: the search took {len(replay.steps)} steps")
    st = replay.steps[step]
    name = _namer(tokens)
    df = pd.DataFrame([{"beam": c.beam, "prefix": " ".join(name(t) for t in st.live[c.beam]),
                        "token": name(c.token), "log_prob": c.log_prob,
                        "fate": "finished" if c.finished else "alive" if c.survivor is not None else "pruned"}
                       for c in st.candidates])
    parts = [Div(text=f"<b>step {step}</b>: {len(st.candidates)} candidates from {len(st.live)} beams"),
             _frame_table(df, height=min(420, 30 + 26 * len(df)))]
    if st.cross_attention is not None:
        att = st.cross_attention  # (K, L, H, S)
        att = att.mean(1) if layer is None else att[:, layer]
        m = att.mean(1).numpy()  # (K, S)
        live = [i for i, lp in enumerate(st.live_log_probs) if np.isfinite(lp)]
        rows = [" ".join(name(t) for t in st.live[i][-3:]) or "<start>" for i in live]
        where = "mean over layers" if layer is None else f"layer {layer}"
        parts.append(relevance_heatmap(m[live], [f"beam {i}: …{r}" for i, r in zip(live, rows)],
                                       _labels(m.shape[1], src_tokens),
                                       title=f"cross-attention of each live beam at step {step} ({where})",
                                       value_label="weight", low=0.0))
    return column(*parts)

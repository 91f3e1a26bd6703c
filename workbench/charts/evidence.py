"""Attention as evidence: word alignments, source shares, head roles, pruning and formation curves. Data in, Bokeh out.

    alignment_lines(src_words, out_words, weights)   # (T, S) word weights: lines whose width is the strength
    source_share_bars(out_words, shares)             # the source's share of each output token, flagged ones red
    role_grid(roles)                                 # every head of every kind, labelled with its roles
    pruning_chart(curve.table)                       # BLEU and chrF against heads removed, one line per kind
    formation_chart(records)                         # per snapshot: best alignment head, source share, roles

No Panel here: the app and the notebooks wrap these figures.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, HoverTool, Label, LabelSet, Legend, LegendItem, Range1d, Span
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from .select import KIND_LABEL

KIND_COLOR = {"enc_self": Category10_10[0], "dec_self": Category10_10[1], "cross": Category10_10[2]}
ROLE_COLOR = {"previous": "#1f77b4", "next": "#17becf", "alignment": "#2ca02c", "eos": "#7f7f7f",
              "punct": "#bcbd22", "rare": "#d62728", "": "#f2f2f2"}


# ---------------------------------------------------------------------------- alignment of one sentence


def alignment_line_data(weights: np.ndarray, *, min_weight: float = 0.05, max_width: float = 8.0) -> dict[str, list]:
    """(T, S) weights -> segments {x0, x1, w, width, t, s} for every cell >= min_weight; width = weight × max_width
    (the strongest link of a row is always drawn, so every output word has a line)."""
    m = np.asarray(weights, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"alignment weights must be a (target words, source words) matrix, got shape {m.shape}")
    keep = m >= min_weight
    if m.size:
        keep[np.arange(m.shape[0]), m.argmax(1)] = True
    t, s = np.nonzero(keep)
    w = m[t, s]
    return {"t": t.tolist(), "s": s.tolist(), "w": w.tolist(), "width": (np.clip(w, 0, 1) * max_width + 0.5).tolist()}


def alignment_lines(src_words: Sequence[str], out_words: Sequence[str], weights, *, title: str = "",
                    min_weight: float = 0.05, links: Sequence[tuple[int, int]] | None = None, width: int | None = None):
    """Source words on top, output words below, joined by lines whose width is the weight; `links` (Pharaoh
    (source, target) pairs, e.g. the argmax alignment) are drawn as dark lines over the weights."""
    m = np.asarray(weights, dtype=np.float64)
    if m.shape != (len(out_words), len(src_words)):
        raise ValueError(f"weights are {m.shape} but there are {len(out_words)} output and {len(src_words)} source "
                         "words")
    n = max(len(src_words), len(out_words), 1)
    xs_src = np.linspace(0, n - 1, len(src_words)) if len(src_words) > 1 else np.array([(n - 1) / 2])
    xs_out = np.linspace(0, n - 1, len(out_words)) if len(out_words) > 1 else np.array([(n - 1) / 2])
    data = alignment_line_data(m, min_weight=min_weight)
    seg = ColumnDataSource({
        "x0": [float(xs_src[s]) for s in data["s"]], "x1": [float(xs_out[t]) for t in data["t"]],
        "y0": [1.0] * len(data["t"]), "y1": [0.0] * len(data["t"]), "width": data["width"], "w": data["w"],
        "src": [src_words[s] for s in data["s"]], "out": [out_words[t] for t in data["t"]],
    })
    fig = figure(width=width or max(420, 70 * n), height=260, title=title, tools="hover,save",
                 x_range=Range1d(-0.8, n - 0.2), y_range=Range1d(-0.35, 1.35), toolbar_location="right")
    fig.segment("x0", "y0", "x1", "y1", source=seg, line_width="width", line_alpha=0.55, line_color="#1f77b4",
                name="alignment_weights")
    if links:
        lk = [(s, t) for s, t in links if 0 <= s < len(src_words) and 0 <= t < len(out_words)]
        fig.segment([float(xs_src[s]) for s, _ in lk], [1.0] * len(lk), [float(xs_out[t]) for _, t in lk],
                    [0.0] * len(lk), line_width=1.5, line_color="#222222", line_dash="dashed", name="alignment_links")
    words = ColumnDataSource({"x": [*xs_src.tolist(), *xs_out.tolist()],
                              "y": [1.08] * len(src_words) + [-0.08] * len(out_words),
                              "text": [*src_words, *out_words],
                              "baseline": ["bottom"] * len(src_words) + ["top"] * len(out_words)})
    fig.add_layout(LabelSet(x="x", y="y", text="text", source=words, text_align="center",
                            text_baseline="middle", text_font_size="12px"))
    hover = fig.select_one(HoverTool)
    hover.tooltips = [("link", "@src → @out"), ("weight", "@w{0.000}")]
    hover.renderers = [fig.select_one({"name": "alignment_weights"})]
    fig.axis.visible = False
    fig.grid.visible = False
    return fig


def source_share_bars(out_words: Sequence[str], shares, *, flagged: Sequence[int] = (), title: str = "",
                      width: int | None = None):
    """One bar per output token: the share of its prediction that comes from the source (ALTI+); flagged tokens
    (low source share: hallucination candidates) in red, the rest blue; the target prefix's share is the rest."""
    v = np.asarray(shares, dtype=np.float64)
    if v.shape != (len(out_words),):
        raise ValueError(f"{v.shape} shares for {len(out_words)} output tokens")
    flag = set(int(i) for i in flagged)
    labels = [f"{i}:{w}" for i, w in enumerate(out_words)]
    src = ColumnDataSource({"x": labels, "share": v.tolist(), "word": list(out_words),
                            "color": ["#d62728" if i in flag else "#1f77b4" for i in range(len(v))]})
    fig = figure(x_range=labels, y_range=Range1d(0, 1), width=width or max(420, 48 * len(v) + 80), height=200,
                 title=title or "source share of each output token", tools="hover,save", toolbar_location="right")
    fig.vbar(x="x", top="share", width=0.8, color="color", source=src, name="source_share")
    fig.select_one(HoverTool).tooltips = [("token", "@word"), ("source share", "@share{0.000}")]
    fig.xaxis.major_label_orientation = 0.8
    fig.yaxis.axis_label = "source share"
    fig.xgrid.visible = False
    return fig


# ---------------------------------------------------------------------------- roles


def role_grid(roles, *, kinds: Sequence[str] | None = None, stacked: bool = False):
    """One layers × heads grid per attention kind; each cell names the head's roles and is coloured by its first.
    Side by side, or under one another with `stacked` (for pages narrower than the three grids)."""
    table = roles.table
    kinds = list(kinds or [k for k in KIND_LABEL if k in set(table["kind"])])
    figs = []
    for kind in kinds:
        part = table[table["kind"] == kind]
        if part.empty:
            continue
        n_layers, n_heads = int(part["layer"].max()) + 1, int(part["head_index"].max()) + 1
        labels = [r or "–" for r in part["roles"]]
        src = ColumnDataSource({
            "x": part["head_index"].astype(float).tolist(), "y": part["layer"].astype(float).tolist(),
            "roles": labels, "text": [x.replace(",", "\n") for x in labels],
            "color": [ROLE_COLOR.get(r.split(",")[0] if r else "", "#cccccc") for r in part["roles"]],
            "prev_top": part["prev_top"].tolist(), "next_top": part["next_top"].tolist(),
            "eos": part["eos"].tolist(), "punct": part["punct"].tolist(), "rare": part["rare"].tolist(),
            "aer": part["aer"].tolist(),
        })
        fig = figure(width=max(320, 90 * n_heads + 120), height=max(180, 60 * n_layers + 80),
                     x_range=Range1d(-0.5, n_heads - 0.5), y_range=Range1d(n_layers - 0.5, -0.5),
                     title=f"head roles, {KIND_LABEL.get(kind, kind)}", tools="hover,save", toolbar_location="right")
        fig.rect("x", "y", 0.95, 0.9, source=src, fill_color="color", fill_alpha=0.55, line_color="white",
                 name=f"roles_{kind}")
        fig.add_layout(LabelSet(x="x", y="y", text="text", source=src, text_align="center", text_baseline="middle",
                                text_font_size="10px"))
        tips = [("head", "layer @y, head @x"), ("roles", "@roles"), ("previous (argmax share)", "@prev_top{0.00}"),
                ("eos weight", "@eos{0.00}"), ("punct weight", "@punct{0.00}"), ("rare (argmax share)", "@rare{0.00}")]
        if kind == "enc_self":
            tips.insert(3, ("next (argmax share)", "@next_top{0.00}"))
        if kind == "cross":
            tips.append(("AER", "@aer{0.000}"))
        fig.select_one(HoverTool).tooltips = tips
        fig.xaxis.ticker = list(range(n_heads))
        fig.yaxis.ticker = list(range(n_layers))
        fig.xaxis.axis_label, fig.yaxis.axis_label = "head", "layer"
        fig.grid.visible = False
        figs.append(fig)
    if not figs:
        raise ValueError(f"no heads of kinds {kinds} in the roles table")
    return column(*figs) if stacked else row(*figs)


# ---------------------------------------------------------------------------- pruning


def pruning_chart(table, *, max_loss: float = 0.5):
    """BLEU and chrF against the share of a kind's heads removed (least important first), one line per kind; the
    dotted line is the unpruned BLEU minus `max_loss`."""
    if "order" in table:
        table = table[table["order"] == "importance"]  # the random-order control is a table, not a line here
    figs = []
    for metric in ("bleu", "chrf"):
        fig = figure(width=460, height=300, title=f"{metric.upper()} as heads are removed", tools="hover,save",
                     x_range=Range1d(-0.02, 1.02), toolbar_location="right")
        items = []
        for kind in [k for k in KIND_LABEL if k in set(table["kind"])]:
            part = table[table["kind"] == kind].sort_values("removed")
            src = ColumnDataSource({"share": (part["removed"] / part["total"]).tolist(), "value": part[metric].tolist(),
                                    "removed": part["removed"].tolist(), "total": part["total"].tolist()})
            line = fig.line("share", "value", source=src, color=KIND_COLOR[kind], line_width=2)
            dots = fig.scatter("share", "value", source=src, color=KIND_COLOR[kind], size=5)
            items.append(LegendItem(label=KIND_LABEL[kind], renderers=[line, dots]))
        base = float(table[table["removed"] == 0][metric].iloc[0]) if (table["removed"] == 0).any() else None
        if metric == "bleu" and base is not None:
            fig.add_layout(Span(location=base - max_loss, dimension="width", line_dash="dotted", line_color="#444444"))
            fig.add_layout(Label(x=0.0, y=base - max_loss, text=f"−{max_loss} BLEU", text_font_size="10px",
                                 y_offset=-14))
        fig.add_layout(Legend(items=items, location="bottom_left"))
        fig.select_one(HoverTool).tooltips = [("removed", "@removed of @total"), (metric, "@value{0.00}")]
        fig.xaxis.axis_label, fig.yaxis.axis_label = "share of the kind's heads removed", metric
        figs.append(fig)
    return row(*figs)


# ---------------------------------------------------------------------------- formation during training


def formation_chart(records: Sequence[dict], *,
                    roles: Sequence[str] = ("previous", "next", "alignment", "eos", "punct", "rare"),
                    positions: Sequence[int] = (0, 5, 10)):
    """Curves over a run's snapshots (`analysis.formation.formation_records`), x the training step (log):
    every cross-attention head's AER (thin lines; the head best at the last snapshot drawn bold, with the best
    head of each snapshot and the diagonal baseline), the mean source share and its value at a few output
    positions, and how many heads hold each role."""
    if not records:
        raise ValueError("no snapshots to draw")
    records = sorted(records, key=lambda r: int(r["step"]))
    steps = [max(int(r["step"]), 1) for r in records]
    ticks = [m * 10 ** e for e in range(7) for m in (1, 2, 5) if min(steps) / 2 <= m * 10 ** e <= max(steps) * 2]
    figs = [_formation_aer(records, steps, ticks)]
    share = _formation_share(records, steps, ticks, positions)
    if share is not None:
        figs.append(share)
    figs.append(_formation_roles(records, steps, ticks, roles))
    return column(*figs)


def _series(values) -> list[float]:
    return [np.nan if v is None else float(v) for v in values]


def _outside_legend(fig, items, ticks: list[int], steps: list[int]) -> None:
    fig.add_layout(Legend(items=items, location="top_left", click_policy="hide"), "right")
    fig.xaxis.ticker = ticks or steps  # 1-2-5 steps: a log axis' own ticks run into one another past 1000


def _formation_aer(records: Sequence[dict], steps: list[int], ticks: list[int]):
    """`formation_chart`'s AER panel: each head's curve, the head best at the end in bold, each snapshot's best
    head and the diagonal aligner."""
    fig = figure(width=760, height=300, x_axis_type="log", title="cross-attention heads' AER (lower is better)",
                 tools="hover,save", toolbar_location="above")
    items = []
    per_head = [r.get("head_aer") for r in records]
    if all(h is not None for h in per_head):
        grid = np.array(per_head, dtype=np.float64)  # (snapshots, layers, heads)
        last = grid[-1]
        final_best = np.unravel_index(np.nanargmin(last), last.shape) if np.isfinite(last).any() else None
        lines = []
        for layer in range(grid.shape[1]):
            for head in range(grid.shape[2]):
                if (layer, head) == final_best:
                    continue
                lines.append(fig.line(steps, grid[:, layer, head].tolist(), color="#9a9a9a", alpha=0.45,
                                      line_width=1, name=f"aer_cross:{layer}:{head}"))
        if lines:
            items.append(LegendItem(label="each head", renderers=lines))
        if final_best is not None:
            layer, head = int(final_best[0]), int(final_best[1])
            bold = fig.line(steps, grid[:, layer, head].tolist(), color=KIND_COLOR["cross"], line_width=3,
                            name="aer_final_best")
            items.append(LegendItem(label=f"cross:{layer}:{head} (best at the end)", renderers=[bold]))
    best = _series(r.get("best_aer") for r in records)
    if any(np.isfinite(best)):
        dots = fig.scatter(steps, best, color="black", size=5, name="aer_best")
        items.append(LegendItem(label="best head of each snapshot", renderers=[dots]))
        diag = _series(r.get("diagonal_aer") for r in records)
        if any(np.isfinite(diag)):
            dashed = fig.line(steps, diag, line_dash="dashed", color="#444444", line_width=2)
            items.append(LegendItem(label="diagonal aligner", renderers=[dashed]))
    fig.xaxis.axis_label, fig.yaxis.axis_label = "training step", "AER"
    if items:
        _outside_legend(fig, items, ticks, steps)
    return fig


def _formation_share(records: Sequence[dict], steps: list[int], ticks: list[int], positions: Sequence[int]):
    """`formation_chart`'s source-share panel (the mean and a few output positions); None without shares."""
    share = _series(r.get("source_share") for r in records)
    if not any(np.isfinite(share)):
        return None
    fig = figure(width=760, height=240, x_axis_type="log", y_range=Range1d(0, 1), title="source share",
                 tools="hover,save", toolbar_location="above")
    mean = fig.line(steps, share, line_width=3, color="#9467bd")
    fig.scatter(steps, share, color="#9467bd", size=4)
    items = [LegendItem(label="mean over output tokens", renderers=[mean])]
    palette = ["#c5b0d5", "#8c564b", "#e377c2", "#bcbd22"]
    for colour, t in zip(palette, positions):
        at = _series((r.get("source_share_by_position") or [])[t]
                     if t < len(r.get("source_share_by_position") or []) else None for r in records)
        if any(np.isfinite(at)):
            items.append(LegendItem(label=f"output position {t}", renderers=[
                fig.line(steps, at, line_width=1.5, line_dash="dotdash", color=colour)]))
    fig.xaxis.axis_label, fig.yaxis.axis_label = "training step", "source share"
    _outside_legend(fig, items, ticks, steps)
    return fig


def _formation_roles(records: Sequence[dict], steps: list[int], ticks: list[int], roles: Sequence[str]):
    """`formation_chart`'s panel of how many heads hold each role."""
    counts = {role: [sum(c.get(role, 0) for c in r.get("role_counts", {}).values()) for r in records]
              for role in roles}
    top = max([1, *(max(v) for v in counts.values())])
    fig = figure(width=760, height=220, x_axis_type="log", y_range=Range1d(-0.2, top + 0.5), title="heads per role",
                 tools="hover,save", toolbar_location="above")
    items = [LegendItem(label=role, renderers=[fig.line(steps, v, line_width=2, color=ROLE_COLOR[role])])
             for role, v in counts.items()]
    fig.xaxis.axis_label, fig.yaxis.axis_label = "training step", "heads"
    fig.yaxis.ticker = list(range(0, top + 1, max(1, top // 6)))
    _outside_legend(fig, items, ticks, steps)
    return fig

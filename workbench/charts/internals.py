"""The Annotated Transformer's figures, interactive: positional encodings, label smoothing, learning-rate
schedules, training curves and the masks of a padded batch.

Formulas are imported, never re-derived here: positions from `workbench.core.embedding`, schedules
from `workbench.training.schedule`, the smoothed target from `workbench.training.loss`, masks from
`workbench.core.masks`. Matrices are Bokeh images (a 512x512 position table is 262k cells, past Altair's
5000-row limit); curves are Altair.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import altair as alt
import numpy as np
import pandas as pd
import torch
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, Div, HoverTool
from bokeh.plotting import figure
from bokeh.transform import dodge

from ..core.config import ModelConfig
from ..core.embedding import sinusoidal_positions
from ..core.masks import causal_mask, padding_mask
from ..training.loss import smoothed_distribution
from ..training.schedule import make_schedule
from .heatmap import DIVERGING, matrix_figure

SINUSOIDAL = ("sinusoidal", "sinusoidal_halves", "sinusoidal_t2t")


# -- positional encodings -------------------------------------------------------------------------
def position_table(kind: str, length: int, d_model: int, *, offset: int = 0, model=None) -> np.ndarray:
    """(length, d_model) position vectors of one kind; "learned" reads them from `model.positions.weight`."""
    if kind in SINUSOIDAL:
        return sinusoidal_positions(length, d_model, kind, offset).numpy()
    if kind == "learned":
        if model is None:
            raise ValueError("learned positions live in the weights: pass model= to draw them")
        weight = model.positions.weight.detach().float().cpu()
        if offset + length > weight.size(0):
            raise ValueError(f"{length} positions from offset {offset} exceed the {weight.size(0)} learned ones")
        return weight[offset: offset + length].numpy()
    raise ValueError(f"no position table for kind {kind!r}; known: {SINUSOIDAL + ('learned',)}")


def position_similarity(table: np.ndarray) -> np.ndarray:
    """(L, L) cosine similarity between position vectors (why nearby positions look alike)."""
    norm = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-12)
    return (norm @ norm.T).astype(np.float32)


def spread_dims(d_model: int) -> tuple[int, ...]:
    """Four sine dimensions from low to high (4, d/16, d/8, d/4, even), each oscillating several times slower than
    the one before, all in the sine half of every layout. The Annotated Transformer plots dims 4-7 of a 20-dim
    table, where they already differ this much; of a 512-dim one, dims 4-7 are four near-identical fast waves."""
    return tuple(sorted({max(0, x - x % 2) for x in (4, d_model // 16, d_model // 8, d_model // 4)
                         if x < d_model // 2}))


def positional_encoding_view(
    cfg: ModelConfig | None = None,
    *,
    kinds: Sequence[str] | None = None,
    length: int = 100,
    d_model: int | None = None,
    dims: Sequence[int] | None = None,
    model=None,
):
    """Per kind: the (position x dimension) matrix, chosen dimensions as curves over positions (the
    Annotated Transformer's figure; default `spread_dims`, fast to slow) and position-to-position cosine similarity.

    kinds default: the config's own kind first, then the other sinusoidal layouts for comparison.
    """
    d_model = d_model or (cfg.d_model if cfg is not None else 512)
    dims = spread_dims(d_model) if dims is None else dims
    offset = cfg.position_offset if cfg is not None else 0
    if kinds is None:
        own = [cfg.positions] if cfg is not None and cfg.positions not in ("none",) else []
        own = [k for k in own if k != "learned" or model is not None]
        kinds = own + [k for k in SINUSOIDAL if k not in own]
    bad = [d for d in dims if not 0 <= d < d_model]
    if bad:
        raise ValueError(f"dims {bad} out of range for d_model={d_model}")
    rows = []
    for kind in kinds:
        table = position_table(kind, length, d_model, offset=offset, model=model)
        pos = [str(p) for p in range(offset, offset + length)]
        mat = matrix_figure(table, pos, [f"d{i}" for i in range(d_model)], low=-1.0, high=1.0, palette=DIVERGING,
                            title=f"{kind}: position x dimension", value_label="value", width=420, height=360)
        mat.xaxis.axis_label, mat.yaxis.axis_label = "dimension", "position"
        curves = figure(title=f"{kind}: dimensions over positions", width=420, height=360,
                        tools="pan,wheel_zoom,reset,save", x_axis_label="position", y_axis_label="value")
        from bokeh.palettes import Category10_10

        for c, d in enumerate(dims):
            curves.line(np.arange(offset, offset + length), table[:, d], legend_label=f"dim {d}",
                        color=Category10_10[c % 10], line_width=2)
        legend = curves.legend[0]  # above the plot, in one row: inside, it covered the curves
        legend.click_policy, legend.orientation, legend.location = "hide", "horizontal", "center"
        legend.margin, legend.padding, legend.spacing = 0, 2, 8
        curves.add_layout(legend, "above")
        curves.add_tools(HoverTool(tooltips=[("position", "$x{0}"), ("value", "$y{0.000}")]))
        sim = matrix_figure(position_similarity(table), pos, pos, low=-1.0, high=1.0, palette=DIVERGING,
                            title=f"{kind}: cosine similarity of positions", value_label="cosine", width=420,
                            height=360)
        sim.xaxis.axis_label, sim.yaxis.axis_label = "position", "position"
        rows.append(row(mat, curves, sim))
    return column(*rows)


# -- the encoder's input -------------------------------------------------------------------------------
def embedding_view(tok: np.ndarray, pos: np.ndarray, embed: np.ndarray, pieces: Sequence[str], *,
                   scale: float = 1.0, normed: bool = False):
    """One sentence's encoder input, as the Annotated Transformer builds it: each token's embedding (times
    `scale`, √d_model there), its position's encoding, and their sum (`embed`; after the embedding norm when
    `normed`), each (tokens x dimensions) on one colour scale, then each token's two vector lengths side by side:
    how loud the word is against its position."""
    tok, pos, embed = (np.asarray(a, dtype=np.float32) for a in (tok, pos, embed))
    if not tok.shape == pos.shape == embed.shape or tok.ndim != 2 or tok.shape[0] != len(pieces):
        raise ValueError(f"shapes {tok.shape}, {pos.shape}, {embed.shape} do not fit {len(pieces)} pieces")
    rows = [f"{i}:{p}" for i, p in enumerate(pieces)]
    dims = [f"d{i}" for i in range(tok.shape[1])]
    high = float(max(np.abs(tok).max(), np.abs(pos).max(), np.abs(embed).max(), 1e-6))
    summed = "token + position, then the embedding norm" if normed else "token + position: the encoder's input"
    titles = (f"token embedding × {scale:.3g}", "positional encoding", summed)
    figs = []
    for values, title in zip((tok, pos, embed), titles, strict=True):
        fig = matrix_figure(values, rows, dims, low=-high, high=high, palette=DIVERGING, title=title,
                            value_label="value", width=420, height=max(200, 40 + 22 * len(rows)))
        fig.xaxis.axis_label, fig.yaxis.axis_label = "dimension", "source token"
        figs.append(fig)
    norms = figure(title="length of each vector", x_range=rows, width=420, height=300, tools="save",
                   x_axis_label="source token", y_axis_label="length (L2 norm)")
    for offset, values, name, colour in ((-0.18, tok, "token embedding", "#1f77b4"),
                                         (0.18, pos, "positional encoding", "#ff7f0e")):
        source = ColumnDataSource({"token": rows, "top": np.linalg.norm(values, axis=1)})
        norms.vbar(x=dodge("token", offset, range=norms.x_range), top="top", source=source, width=0.34,
                   color=colour, legend_label=name)
    norms.xaxis.major_label_orientation = 0.8
    legend = norms.legend[0]  # above the bars, in one row: inside, it covered the first tokens' bars
    legend.orientation, legend.location, legend.margin, legend.padding = "horizontal", "center", 0, 2
    norms.add_layout(legend, "above")
    norms.add_tools(HoverTool(tooltips=[("length", "@top{0.0}")]))
    return column(row(*figs[:2]), row(figs[2], norms))


# -- label smoothing ------------------------------------------------------------------------------
def label_smoothing_data(vocab: int, smoothing: float, target: int = 2, ignore_index: int = 0,
                         points: int = 200) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The smoothed target row, and the loss against it as the model's confidence p in the gold class
    grows (the rest spread evenly): smoothing makes p -> 1 costlier, its minimum sits below 1."""

    if not 0 <= target < vocab or target == ignore_index:
        raise ValueError(f"target {target} must be in [0, {vocab}) and differ from ignore_index {ignore_index}")
    dist = smoothed_distribution(torch.tensor([target]), vocab, smoothing, ignore_index)[0].double()
    bars = pd.DataFrame({"token": np.arange(vocab), "probability": dist.numpy(),
                         "kind": np.where(np.arange(vocab) == target, "gold", "other")})
    p = torch.linspace(0.02, 0.9999, points, dtype=torch.float64)
    pred = ((1 - p) / (vocab - 1))[:, None].expand(points, vocab).clone()
    pred[:, target] = p
    rows = []
    for s, t in (("smoothed", dist), ("one-hot", smoothed_distribution(torch.tensor([target]), vocab, 0.0,
                                                                        ignore_index)[0].double())):
        loss = -(t[None, :] * pred.log()).sum(-1)  # cross-entropy against the target distribution
        rows.append(pd.DataFrame({"confidence": p.numpy(), "loss": loss.numpy(), "target": s}))
    return bars, pd.concat(rows, ignore_index=True)


def label_smoothing_chart(vocab: int = 10, smoothing: float = 0.1, target: int = 2, ignore_index: int = 0):
    """Altair: the smoothed target distribution (bars) beside loss versus confidence (smoothed vs one-hot)."""
    bars, curve = label_smoothing_data(vocab, smoothing, target, ignore_index)
    left = alt.Chart(bars, title=f"target distribution (smoothing {smoothing}, vocab {vocab})").mark_bar().encode(
        x=alt.X("token:O"), y=alt.Y("probability:Q"), color=alt.Color("kind:N", legend=None),
        tooltip=["token", alt.Tooltip("probability:Q", format=".4f")])
    right = alt.Chart(curve, title="loss vs confidence in the gold token").mark_line().encode(
        x="confidence:Q", y="loss:Q",
        color=alt.Color("target:N", title=None, sort=["smoothed", "one-hot"],
                        legend=alt.Legend(orient="top", labelExpr="datum.label + ' target'")),
        tooltip=[alt.Tooltip("confidence:Q", format=".3f"), alt.Tooltip("loss:Q", format=".3f"), "target:N"])
    # each its own colours: a shared scale had merged the bars' two kinds with the lines' two targets and, as the
    # bars ask for no legend, left the lines without one
    return alt.hconcat(left, right.interactive()).resolve_scale(color="independent")


def confidence_data(gold: np.ndarray, top: np.ndarray, bins: int = 40) -> pd.DataFrame:
    """Long table (bin start, bin end, share of tokens, series) of two probability histograms over [0, 1]."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    rows = []
    for series, values in (("p(reference token)", gold), ("p(model's top choice)", top)):
        counts, _ = np.histogram(np.clip(values, 0.0, 1.0), bins=edges)
        share = counts / max(len(values), 1)
        rows.append(pd.DataFrame({"from": edges[:-1], "to": edges[1:], "share": share, "series": series}))
    return pd.concat(rows, ignore_index=True)


def confidence_chart(confidence, bins: int = 40):
    """Altair: the model's real confidence on held-out text
    (`workbench.analysis.training_dynamics.confidence.Confidence`), as histograms of p(reference) and p(top choice),
    with a rule where its label smoothing puts the optimum."""
    frame = confidence_data(confidence.gold, confidence.top, bins)
    bars = alt.Chart(frame).mark_bar(opacity=0.55, binSpacing=0).encode(
        x=alt.X("from:Q", bin="binned", title="probability the model gives", scale=alt.Scale(domain=[0, 1])),
        x2="to:Q", y=alt.Y("share:Q", stack=None, title="share of tokens", axis=alt.Axis(format="%")),
        color=alt.Color("series:N", title=None, legend=alt.Legend(orient="top")),
        tooltip=["series:N", alt.Tooltip("from:Q", format=".3f"), alt.Tooltip("to:Q", format=".3f"),
                 alt.Tooltip("share:Q", format=".1%")])
    optimum = pd.DataFrame({"x": [confidence.optimum],
                            "label": [f"smoothed optimum {confidence.optimum:.3f} (ε = {confidence.smoothing:g})"]})
    rule = alt.Chart(optimum).mark_rule(color="black", strokeDash=[4, 3]).encode(x="x:Q", tooltip=["label:N"])
    text = alt.Chart(optimum).mark_text(align="right", dx=-4, dy=8, baseline="top").encode(
        x="x:Q", y=alt.value(0), text="label:N")
    return (bars + rule + text).properties(title=f"confidence on {confidence.sentences} held-out sentences",
                                           width="container", height=260)


# -- learning-rate schedules ----------------------------------------------------------------------
def lr_schedule_data(
    schedules: Mapping[str, Mapping] | None = None,
    *,
    steps: int = 20000,
    log: Sequence[Mapping] | None = None,
    points: int = 400,
) -> pd.DataFrame:
    """Long table (step, lr, schedule) of named schedules plus a logged LR. `schedules` maps a label to
    make_schedule keywords, e.g. {"noam d512 w4000": {"name": "noam", "d_model": 512, "warmup": 4000}}."""

    if schedules is None:  # the paper's base model, and its fairseq / modern equivalents at the same peak
        w = max(1, min(4000, steps // 5))
        peak = 512**-0.5 * w**-0.5
        schedules = {
            f"noam (d=512, warmup={w})": {"name": "noam", "d_model": 512, "warmup": w, "factor": 1.0},
            f"inverse_sqrt (peak {peak:.1e}, warmup {w})": {"name": "inverse_sqrt", "peak_lr": peak, "warmup": w},
            f"cosine (peak {peak:.1e}, warmup {w})": {"name": "warmup_cosine", "peak_lr": peak, "warmup": w,
                                                     "total": steps},
        }
    grid = np.unique(np.linspace(0, steps, points).astype(int))
    frames = []
    for label, kw in schedules.items():
        kw = dict(kw)
        fn = make_schedule(kw.pop("name"), **kw)
        frames.append(pd.DataFrame({"step": grid, "lr": [fn(int(s)) for s in grid], "schedule": label}))
    if log:
        logged = [(r["step"], r["lr"]) for r in log if "lr" in r and "step" in r]
        if not logged:
            raise ValueError("the training log has no rows with both 'step' and 'lr'")
        s, lr = zip(*logged)
        frames.append(pd.DataFrame({"step": s, "lr": lr, "schedule": "logged (checkpoint)"}))
    return pd.concat(frames, ignore_index=True)


def lr_schedule_chart(schedules: Mapping[str, Mapping] | None = None, *, steps: int = 20000,
                      log: Sequence[Mapping] | None = None):
    """Altair: several schedules (and a checkpoint's logged LR) on one chart; legend click isolates one."""
    data = lr_schedule_data(schedules, steps=steps, log=log)
    pick = alt.selection_point(fields=["schedule"], bind="legend")
    return alt.Chart(data, title="learning-rate schedules").mark_line().encode(
        x="step:Q", y=alt.Y("lr:Q", title="learning rate"), color="schedule:N",
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
        tooltip=["schedule:N", "step:Q", alt.Tooltip("lr:Q", format=".3e")],
    ).add_params(pick).properties(width=560, height=300).interactive()


# -- training curves ------------------------------------------------------------------------------
def training_curves_data(log: Sequence[Mapping], metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Long table (step, metric, value) from a checkpoint's log rows; rows without a metric are skipped."""
    if not log:
        raise ValueError("the training log is empty")
    frame = pd.DataFrame(list(log))
    if "step" not in frame:
        raise ValueError(f"training log rows need a 'step' key; keys: {sorted(frame.columns)}")
    default = ["loss", "valid_loss", "valid_bleu", "valid_chrf", "lr", "grad_norm", "tokens_per_s"]
    metrics = [m for m in (metrics or default) if m in frame]
    if not metrics:
        raise ValueError(f"none of the metrics {list(metrics or default)} is in the log; keys: {sorted(frame.columns)}")
    long = frame.melt(id_vars=["step"], value_vars=metrics, var_name="metric", value_name="value")
    return long.dropna(subset=["value"]).reset_index(drop=True)


def training_curves_chart(log: Sequence[Mapping], metrics: Sequence[str] | None = None):
    """Altair: one small chart per metric (own y scale), shared step axis, brushing zooms them all."""
    data = training_curves_data(log, metrics)
    brush = alt.selection_interval(encodings=["x"], bind="scales")
    base = alt.Chart(data).mark_line(point=alt.OverlayMarkDef(size=12)).encode(
        x="step:Q", y=alt.Y("value:Q", title=None), color=alt.Color("metric:N", legend=None),
        tooltip=["metric:N", "step:Q", alt.Tooltip("value:Q", format=".4g")],
    ).properties(width=260, height=160).add_params(brush)
    return base.facet(facet="metric:N", columns=3).resolve_scale(y="independent")


# -- masks ----------------------------------------------------------------------------------------
def mask_view(src: torch.Tensor, tgt: torch.Tensor, *, pad_id: int = 0, batch: int = 0,
              src_pieces: Sequence[str] | None = None, tgt_pieces: Sequence[str] | None = None):
    """The masks of a padded batch, from `workbench.core.masks`: source padding for the whole batch (B x S),
    decoder causal (T x T) and cross-attention padding for one sentence (T x S). 1 = may attend.
    `src_pieces` / `tgt_pieces`: the token strings of sentence `batch` (padding shown as <pad>); ids otherwise."""

    if src.dim() != 2 or tgt.dim() != 2 or src.size(0) != tgt.size(0):
        raise ValueError(f"src and tgt must be (B, S) and (B, T) with the same B, got {tuple(src.shape)}, "
                         f"{tuple(tgt.shape)}")
    bsz, s = src.shape
    t = tgt.size(1)
    pad = padding_mask(src, pad_id)
    keep = torch.ones(bsz, s, dtype=torch.bool) if pad is None else pad[:, 0, 0, :].cpu()
    causal = causal_mask(t).cpu()
    cross = keep[batch][None, :].expand(t, s)
    rows_b = [f"sentence {b}" for b in range(bsz)]

    def names(ids, pieces):
        ids = [int(i) for i in ids]
        if pieces is None:
            return [str(i) for i in ids]
        out = [*pieces][: len(ids)] + ["<pad>"] * max(0, len(ids) - len(pieces))
        return [f"{j}: {p}" for j, p in enumerate(out)]  # numbered: repeated pieces stay distinct on the axis

    src_tok, tgt_tok = names(src[batch], src_pieces), names(tgt[batch], tgt_pieces)
    common = {"low": 0.0, "high": 1.0, "palette": ["#f3f3f3", "#2b6cb0"], "value_label": "may attend",
              "colorbar": False}
    figs = [
        matrix_figure(keep.float().numpy(), rows_b, [str(i) for i in range(s)], title="source padding mask (batch)",
                      axis_labels=("sentence", "source position"), **common),
        matrix_figure(causal.float().numpy(), tgt_tok, tgt_tok, title=f"decoder causal mask (sentence {batch})",
                      axis_labels=("query: decoder input", "key: decoder input"), **common),
        matrix_figure(cross.float().numpy(), tgt_tok, src_tok, title=f"cross-attention padding (sentence {batch})",
                      axis_labels=("query: decoder input", "key: source token"), **common),
    ]
    swatch = '<span style="display:inline-block;width:14px;height:14px;background:{};border:1px solid #888;' \
             'vertical-align:middle;margin:0 6px 0 18px"></span>{}'
    legend = Div(text="".join(swatch.format(colour, label) for colour, label in
                              ((common["palette"][1], "may attend (1)"), (common["palette"][0], "masked (0)"))),
                 css_classes=["mask-legend"])  # two values, no colour bar: a legend says which is which
    return column(row(*figs), legend)


def schedule_vs_log_chart(frame: pd.DataFrame, *, title: str = "learning rate"):
    """Altair: the checkpoint's own schedule (a line) over the learning rate its log recorded (points);
    `frame` has columns step, lr, source ("schedule" / "logged")."""
    base = alt.Chart(frame, title=title).encode(
        x="step:Q", y=alt.Y("lr:Q", title="learning rate"), color=alt.Color("source:N", title=None),
        tooltip=["source:N", "step:Q", alt.Tooltip("lr:Q", format=".3e")])
    line = base.transform_filter(alt.datum.source != "logged (checkpoint)").mark_line()
    dots = base.transform_filter(alt.datum.source == "logged (checkpoint)").mark_point(size=14, filled=True)
    return (dots + line).properties(width="container", height=280).interactive()

"""The same sentence's attention from two models or checkpoints: side by side and as a difference.

Two traces tokenized differently cannot be subtracted piece by piece, so when the pieces differ both are
merged to words (sum over key pieces, mean over query pieces) and must then spell the same words.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import numpy as np
from bokeh.layouts import row

from ..core.heads import AttentionKind
from ..core.trace import Trace
from .heatmap import DIVERGING, matrix_figure
from .select import Attention, Heads, select_attention, to_words
from .tokens import Scheme


def align(a: Attention, b: Attention, scheme: Scheme = "auto") -> tuple[Attention, Attention]:
    """Return a and b on a common token grid: unchanged if the pieces agree, else both merged to words."""
    if (a.queries, a.keys) == (b.queries, b.keys):
        return a, b
    wa, wb = to_words(a, scheme), to_words(b, scheme)
    for side in ("queries", "keys"):
        ta, tb = getattr(wa, side), getattr(wb, side)
        if ta != tb:
            at = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
            raise ValueError(
                f"cannot align {side}: after merging to words the two sides differ at word {at} "
                f"({ta[at:at + 3]} vs {tb[at:at + 3]}; {len(ta)} vs {len(tb)} words). Compare the same sentence."
            )
    return wa, wb


def difference(a: Attention, b: Attention, scheme: Scheme = "auto") -> tuple[np.ndarray, Attention, Attention]:
    """(B − A) of the head means on the aligned grid, plus the aligned inputs."""
    a, b = align(a, b, scheme)
    return b.mean - a.mean, a, b


def compare_attention(
    a: Attention,
    b: Attention,
    *,
    labels: Sequence[str] = ("A", "B"),
    names: Sequence[str] | None = None,
    wrap: int | None = None,
    scheme: Scheme = "auto",
    **kw,
):
    """Three heatmaps in a row: A, B (same colour scale) and B − A (diverging, symmetric around 0).

    Titles read "A = name: what is drawn" (`names`, if given, say which model each label is). `wrap`: lines of at
    most that many characters instead (the label, then what is drawn): figures that share a narrow page stay
    readable where one long line would be cut at the canvas edge."""
    diff, a, b = difference(a, b, scheme)
    high = float(max(np.nanmax(a.mean), np.nanmax(b.mean), 1e-6))
    span = float(np.nanmax(np.abs(diff))) or 1e-6
    who = [f"{label} = {name}" for label, name in zip(labels, names, strict=True)] if names else list(labels)
    titles = [_title(who[0], a.describe(), wrap), _title(who[1], b.describe(), wrap),
              _title(f"{labels[1]} − {labels[0]}", "", wrap)]
    lines = max(t.count("\n") for t in titles)
    titles = [t + "\n " * (lines - t.count("\n")) for t in titles]  # as many lines each: the matrices line up
    fa = matrix_figure(a.mean, a.queries, a.keys, masked=a.masked, high=high, title=titles[0], **kw)
    fb = matrix_figure(b.mean, b.queries, b.keys, masked=b.masked, high=high, title=titles[1], **kw)
    fd = matrix_figure(diff, a.queries, a.keys, masked=a.masked & b.masked, low=-span, high=span,
                       palette=DIVERGING, title=titles[2], value_label="difference", **kw)
    fb.x_range = fd.x_range = fa.x_range  # pan/zoom one, all follow
    fb.y_range = fd.y_range = fa.y_range
    return row(fa, fb, fd)


def _title(who: str, what: str, wrap: int | None) -> str:
    if wrap is None:
        return f"{who}: {what}" if what else who
    return "\n".join(textwrap.wrap(who, wrap) + textwrap.wrap(what, wrap))


def compare_blocks(
    trace_a: Trace,
    trace_b: Trace,
    kind: AttentionKind,
    layer: int,
    heads: Heads = None,
    *,
    layer_b: int | None = None,
    heads_b: Heads = None,
    batch: int = 0,
    words: bool = False,
    select_a: dict | None = None,
    select_b: dict | None = None,
    scheme: Scheme = "auto",
) -> tuple[Attention, Attention]:
    """The block of each trace that `compare_traces` draws, on a common token grid (`align`): plain numbers and
    tokens, so they can be computed in one process and drawn in another (`compare_attention`)."""
    a = select_attention(trace_a, kind, layer, heads, batch=batch, words=words, **(select_a or {}))
    b = select_attention(trace_b, kind, layer if layer_b is None else layer_b, heads if heads_b is None else heads_b,
                         batch=batch, words=words, **(select_b or {}))
    return align(a, b, scheme)


def compare_traces(
    trace_a: Trace,
    trace_b: Trace,
    kind: AttentionKind,
    layer: int,
    heads: Heads = None,
    *,
    layer_b: int | None = None,
    heads_b: Heads = None,
    batch: int = 0,
    words: bool = False,
    select_a: dict | None = None,
    select_b: dict | None = None,
    scheme: Scheme = "auto",
    **kw,
):
    """Compare one block of two traces (models may differ in depth and head count: pick layer_b/heads_b)."""
    a, b = compare_blocks(trace_a, trace_b, kind, layer, heads, layer_b=layer_b, heads_b=heads_b, batch=batch,
                          words=words, select_a=select_a, select_b=select_b, scheme=scheme)
    return compare_attention(a, b, scheme=scheme, **kw)

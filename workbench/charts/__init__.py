"""Attention views: data in (a `Trace` + token strings), Bokeh models / Altair charts out. No Panel.

    from workbench.charts import attention_heatmap, head_view, model_view, save_html
    fig = attention_heatmap(trace, "cross", layer=5, heads=[0, 3], words=True)
    save_html(fig, "cross.html")          # one offline file

`import workbench` does not import this package, so the model side never pays for Bokeh/Altair.
Some functions share their module's name (head_view, model_view): the names below are the functions.
"""

from __future__ import annotations

from .compare import align, compare_attention, compare_traces, difference
from .export import external_references, save_html, save_image, to_html
from .graph import attribution_graph_view, graph_data
from .head_view import head_view, head_view_figure, line_data
from .heatmap import altair_heatmap, attention_heatmap, heatmap, matrix_figure
from .internals import (
    confidence_chart,
    embedding_view,
    label_smoothing_chart,
    lr_schedule_chart,
    mask_view,
    position_table,
    positional_encoding_view,
    training_curves_chart,
)
from .model_view import model_view, model_view_figure
from .select import Attention, combined_attention, select_attention, to_words
from .tokens import WordGroups, merge_attention, word_groups

__all__ = [
    "Attention", "WordGroups", "align", "attribution_graph_view", "graph_data", "altair_heatmap", "attention_heatmap",
    "combined_attention", "compare_attention", "compare_traces", "confidence_chart", "difference",
    "embedding_view", "external_references", "head_view", "head_view_figure",
    "heatmap", "label_smoothing_chart", "line_data", "lr_schedule_chart", "mask_view", "matrix_figure",
    "merge_attention", "model_view", "model_view_figure", "position_table", "positional_encoding_view", "save_html",
    "save_image", "select_attention", "to_html", "to_words", "training_curves_chart", "word_groups",
]

"""Attention views: data in (a `Trace` + token strings), Bokeh models / Altair charts out. No Panel.

    from workbench.charts import attention_heatmap, head_view, model_view, save_html
    fig = attention_heatmap(trace, "cross", layer=5, heads=[0, 3], words=True)
    save_html(fig, "cross.html")          # one offline file

Submodules import Bokeh/Altair lazily from here, so `import workbench` stays light.
"""

from __future__ import annotations

from importlib import import_module

_EXPORTS = {
    "word_groups": "tokens", "merge_attention": "tokens", "WordGroups": "tokens",
    "Attention": "select", "select_attention": "select", "combined_attention": "select", "to_words": "select",
    "attention_heatmap": "heatmap", "heatmap": "heatmap", "matrix_figure": "heatmap",
    "head_view": "head_view", "head_view_figure": "head_view",
    "model_view": "model_view", "model_view_figure": "model_view",
    "compare_attention": "compare", "compare_traces": "compare",
    "positional_encoding_view": "internals", "label_smoothing_chart": "internals", "lr_schedule_chart": "internals",
    "training_curves_chart": "internals", "mask_view": "internals",
    "save_html": "export", "save_image": "export", "to_html": "export", "external_references": "export",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

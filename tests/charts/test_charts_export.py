"""Exports: offline HTML (no external reference) under 5 MB at 300 tokens on a base-size trace; PNG/SVG."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.charts import (
    attention_heatmap,
    external_references,
    head_view,
    lr_schedule_chart,
    model_view,
    save_html,
    save_image,
    to_html,
)

LIMIT = 5 * 1024 * 1024


@pytest.fixture(scope="module")
def base_trace_300():
    """The paper's base size (6+6 layers, d=512, 8 heads) with a small vocabulary; one 300-token pair."""
    cfg = presets.base(vocab=64, max_positions=512)
    torch.manual_seed(0)
    src, tgt = make_batch(cfg, batch=1, src_len=300, tgt_len=300, pad=False)
    with torch.no_grad():
        _, trace = make_model(cfg).run_with_cache(src, tgt)
    rng = np.random.default_rng(0)
    trace.meta["src_pieces"] = [("▁" if rng.random() < 0.6 else "") + f"w{i}" for i in range(300)]
    trace.meta["tgt_pieces"] = ["<s>"] + [f"▁v{i}" for i in range(299)]
    return trace


def test_external_references_finds_cdn_links():
    page = '<html><script src="https://cdn.example/x.js"></script><link href="//fonts.example/f.css">' \
           '<style>@import "https://a.example/b.css"; div{background:url(http://c.example/i.png)}</style></html>'
    assert len(external_references(page)) == 4
    assert external_references('<script type="text/javascript">var u="https://docs.example";</script>') == []


@pytest.mark.slow
@pytest.mark.parametrize("view", ["heatmap_cross", "head_view_all_layers", "model_view_all_kinds"])
def test_offline_html_small_at_300_tokens(base_trace_300, view, tmp_path):
    build = {
        "heatmap_cross": lambda t: attention_heatmap(t, "cross", 5),
        "head_view_all_layers": lambda t: head_view(t, "cross"),
        "model_view_all_kinds": lambda t: model_view(t),
    }[view]
    path = save_html(build(base_trace_300), tmp_path / f"{view}.html")
    html = path.read_text(encoding="utf-8")
    assert external_references(html) == []
    assert path.stat().st_size < LIMIT, f"{view}: {path.stat().st_size / 1e6:.2f} MB"
    assert "Bokeh" in html and "<script src" not in html


def test_altair_html_is_inlined(tmp_path):
    html = to_html(lr_schedule_chart(steps=1000))
    assert external_references(html) == []
    assert "vegaEmbed" in html


def test_altair_png_and_svg_without_a_browser(tmp_path):
    chart = lr_schedule_chart(steps=1000)
    png = save_image(chart, tmp_path / "lr.png")
    svg = save_image(chart, tmp_path / "lr.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert svg.read_text().lstrip().startswith("<svg")


def test_image_export_refuses_other_suffixes(tmp_path):
    with pytest.raises(ValueError, match=".png or .svg"):
        save_image(lr_schedule_chart(steps=10), tmp_path / "x.jpg")


@pytest.mark.browser
def test_bokeh_png_and_svg_with_headless_chromium(tmp_path):
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("Bokeh PNG/SVG export needs Debian's chromium + chromium-driver (apt-get install both)")
    cfg = presets.tiny(vocab=30, enc_layers=1, dec_layers=1)
    src, tgt = make_batch(cfg, batch=1, src_len=5, tgt_len=4)
    _, trace = make_model(cfg).run_with_cache(src, tgt)
    png = save_image(attention_heatmap(trace, "cross", 0), tmp_path / "h.png")
    svg = save_image(attention_heatmap(trace, "cross", 0), tmp_path / "h.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000
    assert "<svg" in svg.read_text()[:500]


def test_views_command_writes_offline_pages(tmp_path, capsys):
    from workbench.cli import main

    cfg = presets.tiny(vocab=30, dec_layers=3)
    src, tgt = make_batch(cfg, batch=2, src_len=6, tgt_len=5)
    _, trace = make_model(cfg).run_with_cache(src, tgt)
    trace.meta["src_pieces"] = [[f"▁s{i}" for i in range(6)]] * 2
    trace.save(tmp_path / "t.safetensors")
    assert main(["views", str(tmp_path / "t.safetensors"), "-o", str(tmp_path / "out"), "--words"]) == 0
    pages = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert pages == ["head_view_combined.html", "head_view_cross.html", "head_view_dec_self.html",
                     "head_view_enc_self.html", "heatmap_cross_layer2.html", "heatmap_dec_self_layer2.html",
                     "heatmap_enc_self_layer1.html", "model_view.html"]
    assert all(external_references(p.read_text()) == [] for p in (tmp_path / "out").iterdir())
    assert main(["views", str(tmp_path / "missing.safetensors"), "-o", str(tmp_path)]) == 2
    assert "no trace file" in capsys.readouterr().err


def test_html_export_inside_a_closed_sessions_curdoc():
    """A server callback can run with curdoc() set to a destroyed session's document (its callback manager
    emptied); Bokeh's file_html copies that curdoc's JS callbacks and failed with AttributeError there."""
    from bokeh.document import Document
    from bokeh.io.doc import patch_curdoc
    from bokeh.plotting import figure

    closed = Document()
    closed.callbacks.destroy()  # what Bokeh's server does to a discarded session's document
    fig = figure(title="exported")
    fig.line([1, 2], [3, 4])
    with patch_curdoc(closed):
        html = to_html(fig)
    assert "exported" in html and external_references(html) == []

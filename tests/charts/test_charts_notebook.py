"""Altair in JupyterLab: charts go out as Vega 5 specs for JupyterLab's own renderer, never as inline scripts."""

from __future__ import annotations

import json

import altair as alt
import pandas as pd
import pytest

from workbench.charts import label_smoothing_chart
from workbench.charts.notebook import RENDERER, VEGA_MIMETYPE, compile_version, enable_altair


@pytest.fixture
def altair_renderer():
    """Altair's renderer is process-wide: put the one the test found back."""
    before = alt.renderers.active
    yield
    alt.renderers.enable(before)


def test_charts_become_vega5_specs_without_scripts(altair_renderer):
    enable_altair()
    assert alt.renderers.active == RENDERER
    chart = alt.Chart(pd.DataFrame({"x": [1, 2, 3], "y": [3, 1, 2]})).mark_line().encode(x="x:Q", y="y:Q")
    bundles = [chart._repr_mimebundle_(), label_smoothing_chart(vocab=10, smoothing=0.4)._repr_mimebundle_()]
    for bundle in bundles:
        assert set(bundle) == {VEGA_MIMETYPE, "text/plain"}
        assert bundle[VEGA_MIMETYPE]["$schema"] == "https://vega.github.io/schema/vega/v5.json"
        text = json.dumps(bundle)
        # the "html" renderer's failure: a <script> per output, ~900 KB of inlined Vega, a CDN otherwise
        assert "<script" not in text and "cdn.jsdelivr" not in text and len(text) < 100_000
    assert bundles[0][VEGA_MIMETYPE]["data"][0]["values"][0] == {"x": 1, "y": 3}


def test_compiles_with_a_vega_lite_5():
    assert compile_version().startswith("5.")


def test_the_notebooks_use_it_not_the_html_renderer():
    from pathlib import Path

    sources = {p.name: p.read_text(encoding="utf-8")
               for p in (Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.py")}
    assert sources and any("enable_altair()" in text for text in sources.values())
    assert not [name for name, text in sources.items() if 'renderers.enable("html"' in text]

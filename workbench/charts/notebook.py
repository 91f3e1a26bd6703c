"""Altair charts in JupyterLab, offline and any number per notebook: `enable_altair()`.

Altair's "html" renderer writes a <script> per output that declares top-level constants (`const spec`) in the
window every output shares, so in JupyterLab each chart after the first fails ("Identifier 'spec' has already
been declared") and each output inlines ~900 KB of Vega. Altair's "jupyterlab" renderer emits Vega-Lite 6's
mimetype, which JupyterLab 4 does not draw. This renderer compiles the chart to a Vega 5 spec here (vl-convert,
offline) and emits `application/vnd.vega.v5+json`, which JupyterLab 4's own Vega renderer draws: no script, no
CDN, a few KB of JSON per chart, tooltips and actions as usual.
"""

from __future__ import annotations

VEGA_MIMETYPE = "application/vnd.vega.v5+json"
RENDERER = "workbench"


def compile_version() -> str:
    """The newest Vega-Lite 5 that vl-convert ships: it compiles to Vega 5, the Vega JupyterLab 4 bundles."""
    import vl_convert  # optional heavy dependency, only where charts are drawn

    fives = [v for v in vl_convert.get_vegalite_versions() if v.startswith("5.")]
    if not fives:
        raise RuntimeError(f"vl-convert {vl_convert.__version__} compiles no Vega-Lite 5 "
                           f"(it has {vl_convert.get_vegalite_versions()}); install vl-convert-python<2")
    return max(fives, key=lambda v: tuple(int(p) for p in v.split(".")))


def vega5_renderer(spec: dict, **metadata) -> dict:
    """Altair renderer: the chart as a Vega 5 spec, for JupyterLab's built-in Vega renderer."""
    import vl_convert  # optional heavy dependency, only where charts are drawn

    vega = vl_convert.vegalite_to_vega(spec, vl_version=compile_version())
    return {VEGA_MIMETYPE: vega, "text/plain": "<Altair chart (Vega 5; shown by JupyterLab's Vega renderer)>"}


def enable_altair() -> None:
    """Draw Altair charts through JupyterLab's own Vega renderer (call once per notebook; idempotent)."""
    import altair as alt

    alt.renderers.register(RENDERER, vega5_renderer)
    alt.renderers.enable(RENDERER)

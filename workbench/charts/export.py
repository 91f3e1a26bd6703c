"""Export any view to one self-contained HTML file (offline), PNG or SVG.

HTML: Bokeh's `file_html(..., INLINE)` inlines BokehJS (~1.3 MB) and the document (arrays as gzip+base64),
so the file opens from disk with no network (tested in Chromium with every request blocked). It renders in
a fresh Document of its own, so it works inside a server callback (where Bokeh's `curdoc()` may be another,
even a destroyed, session's document); linked scripts and stylesheets (Panel's server-relative extension
files) are dropped, and BokehJS's CDN fallbacks (MathJax for TeX labels, Tabler icons) point nowhere.
Altair charts are saved with `inline=True`, which inlines Vega via the `vl-convert-python` package;
plain `chart.save()` would load Vega from a CDN and be blank offline.
PNG/SVG: Altair through vl-convert (no browser); Bokeh needs a headless browser (selenium + Debian's
`chromium` and `chromium-driver`): a clear error says what to install when it is missing.
"""

from __future__ import annotations

import re
import shutil
from html import escape as html_escape
from pathlib import Path

from bokeh.document import Document
from bokeh.embed import file_html
from bokeh.io.doc import patch_curdoc
from bokeh.model import Model
from bokeh.resources import INLINE

_LINKED = re.compile(r'<script[^>]*\bsrc="(?!data:)[^"]*"[^>]*>\s*</script>\s*'
                     r'|<link\b[^>]*\bhref="(?!data:)[^"]*"[^>]*>\s*', re.I)
_CDN_FALLBACK = re.compile(r'"https://cdn\.jsdelivr\.net/npm/[^"\s]*"')
_SCRIPT = re.compile(r"<script\b([^>]*)>(.*?)</script>", re.S | re.I)
_URL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?\s*(?:https?:)?//|@import\s+["']https?:""",
                  re.I)


def _is_altair(obj) -> bool:
    return type(obj).__module__.startswith("altair")


def to_html(obj, title: str = "Attention Workbench", caption: str | None = None) -> str:
    """A self-contained HTML page for a Bokeh model/layout or an Altair chart; `caption` (plain text, shown
    escaped) goes above a Bokeh figure: what it shows, for a file read away from the app."""
    if isinstance(obj, Model) and caption:
        from bokeh.layouts import column
        from bokeh.models import Div

        lines = "<br>".join(html_escape(line) for line in caption.splitlines())
        obj = column(Div(text=f'<p class="caption" style="font: 13px sans-serif; margin: 4px 0 8px">{lines}</p>'),
                     obj)
    if isinstance(obj, Model):
        # An explicit fresh curdoc: file_html's temporary document copies curdoc()'s JS callbacks, and in a
        # server callback curdoc() can be a closed session's document whose callback manager is gone.
        fresh = Document()  # held here: patch_curdoc keeps only a weak reference
        with patch_curdoc(fresh):
            html = file_html(obj, INLINE, title=title)
        # Once Panel is imported (the app, notebooks), Bokeh bundles every registered extension's relative
        # `static/extensions/...` files; a file on disk cannot load them and plain Bokeh models do not need them.
        # A data: URL in place of the CDN fallbacks: a TeX-looking token label must not fetch MathJax.
        return _CDN_FALLBACK.sub('"data:,"', _LINKED.sub("", html))
    if _is_altair(obj):
        _need_vl_convert("self-contained Altair HTML")
        return obj.to_html(inline=True)
    raise TypeError(f"cannot export {type(obj).__name__}: expected a Bokeh model or an Altair chart")


def save_html(obj, path: str | Path, title: str = "Attention Workbench", caption: str | None = None) -> Path:
    """Write `to_html(obj)` to path; returns the path."""
    path = Path(path)
    path.write_text(to_html(obj, title, caption), encoding="utf-8")
    return path


def external_references(html: str) -> list[str]:
    """Every place the page would fetch from the network: `src=`/`href=`/`url(`/`@import` to http(s) or `//`.

    The bodies of inline library scripts are skipped: BokehJS and Vega mention URLs in their code (licence
    headers, map-tile templates) that a page without those models never fetches. JSON document scripts
    (our data) are checked too.
    """
    found = []

    def strip(m: re.Match) -> str:
        attrs, body = m.group(1), m.group(2)
        if re.search(r"\bsrc\s*=", attrs, re.I):
            found.append(f"<script{attrs}>")
        if "application/json" in attrs or "application/vnd" in attrs:
            found.extend(re.findall(r"https?://[^\s\"'\\]+", body))
        return "<script>"

    rest = _SCRIPT.sub(strip, html)
    found.extend(m.group(0) + rest[m.end(): m.end() + 60] for m in _URL.finditer(rest))
    return found


def save_image(obj, path: str | Path, *, scale: float = 1.0) -> Path:
    """PNG or SVG by the file's suffix. Altair: vl-convert (no browser). Bokeh: headless Chromium."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise ValueError(f"image export writes .png or .svg, got {path.name!r}")
    if _is_altair(obj):
        _need_vl_convert("PNG/SVG export of Altair charts")
        obj.save(str(path), scale_factor=scale) if suffix == ".png" else obj.save(str(path))
        return path
    if not isinstance(obj, Model):
        raise TypeError(f"cannot export {type(obj).__name__}: expected a Bokeh model or an Altair chart")
    driver = _chromium_driver()
    try:
        if suffix == ".png":
            from bokeh.io import export_png

            export_png(obj, filename=str(path), webdriver=driver, scale_factor=scale)
        else:
            from bokeh.io import export_svg

            _svg_backend(obj)
            export_svg(obj, filename=str(path), webdriver=driver)
    finally:
        driver.quit()
    return path


def _svg_backend(obj: Model) -> None:
    from bokeh.plotting import figure

    for fig in obj.select({"type": figure}):
        fig.output_backend = "svg"


def _chromium_driver():
    """A headless Chromium selenium driver, or a RuntimeError saying exactly what to install."""
    try:
        from selenium import webdriver
    except ImportError:
        raise RuntimeError(
            "Bokeh PNG/SVG export needs selenium and a headless Chromium: `pip install selenium` and "
            "`apt-get install chromium chromium-driver` (or export HTML, which needs neither)"
        ) from None
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    chromedriver = shutil.which("chromedriver")
    if not binary or not chromedriver:
        raise RuntimeError(
            f"Bokeh PNG/SVG export needs Chromium and chromedriver on PATH (found browser={binary}, "
            f"driver={chromedriver}): `apt-get install chromium chromium-driver`"
        )
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(chromedriver), options=opts)


def _need_vl_convert(what: str) -> None:
    try:
        import vl_convert  # noqa: F401
    except ImportError:
        raise RuntimeError(f"{what} needs the vl-convert-python package: pip install vl-convert-python") from None

"""Panel in a notebook with nothing fetched from outside the machine: `offline_notebook()` after `pn.extension`.

`pn.extension(inline=True)` inlines Panel's JS and turns the stylesheets of the first render into inline ones,
but the models later updates from the kernel create (a `pn.bind`-ed Markdown re-rendered when the sentence
changes) still carry Panel's CDN stylesheets (loading.css, markdown.css, theme/default.css, theme/native.css:
ERR_NAME_NOT_RESOLVED offline, unstyled text; holoviz/panel #6759, #7073, open in Panel 1.9). These models are
sent before any hook sees them, so the fix sits where Panel resolves each stylesheet's URL (`patch_stylesheet`,
called for every one it sends): a CDN URL whose file ships in Panel's dist folder becomes a data: URL of it.
"""

from __future__ import annotations

import base64

import panel as pn
import panel.io.resources as resources
import panel.reactive as reactive
from bokeh.models import UIElement
from panel.io.notebook import patch_inline_stylesheets
from panel.viewable import Viewable

_PANEL_PATCH_STYLESHEET = resources.patch_stylesheet


def _local_stylesheet(stylesheet, dist_url) -> None:
    """Panel's `patch_stylesheet`, then a CDN URL is replaced by the same file's content as a data: URL."""
    _PANEL_PATCH_STYLESHEET(stylesheet, dist_url)
    try:
        url = str(stylesheet.url)
    except Exception:  # Panel's own guard: some stylesheets have no URL set yet
        return
    if not url.startswith(resources.CDN_DIST):
        return
    path = resources.DIST_DIR / url[len(resources.CDN_DIST):].split("?")[0]
    if path.is_file():
        stylesheet.url = "data:text/css;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _inline_stylesheets(viewable, root, *_) -> None:
    """Panel preprocessing hook: CDN stylesheets under `root` become inline ones (from Panel's dist)."""
    if pn.config.inline:
        for model in root.select({"type": UIElement}):
            patch_inline_stylesheets(model)


def offline_notebook() -> None:
    """Keep every Panel output of this kernel free of CDN stylesheets (idempotent; after pn.extension(inline=True))."""
    if not pn.config.inline:
        raise RuntimeError("offline_notebook() needs pn.extension(..., inline=True) first (pn.config.inline is False)")
    if _inline_stylesheets not in Viewable._preprocessing_hooks:
        Viewable._preprocessing_hooks.append(_inline_stylesheets)
    resources.patch_stylesheet = reactive.patch_stylesheet = _local_stylesheet

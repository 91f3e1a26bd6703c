"""Panel in a notebook with nothing fetched from outside the machine: `offline_notebook()` after `pn.extension`.

`pn.extension(inline=True)` inlines Panel's JS and turns the stylesheets of the first render into inline ones,
but models created by later updates from the kernel (a `pn.bind`-ed Markdown re-rendered when the sentence
changes) still carry Panel's CDN stylesheets (loading.css, markdown.css, theme/default.css, theme/native.css:
ERR_NAME_NOT_RESOLVED offline, unstyled text). The hook below inlines them on every render and update.
"""

from __future__ import annotations

import panel as pn
from bokeh.models import UIElement
from panel.io.notebook import patch_inline_stylesheets
from panel.viewable import Viewable


def _inline_stylesheets(viewable, root, *_) -> None:
    """Panel preprocessing hook: every CDN stylesheet under `root` becomes an inline one (from Panel's dist)."""
    if pn.config.inline:
        for model in root.select({"type": UIElement}):
            patch_inline_stylesheets(model)


def offline_notebook() -> None:
    """Keep every Panel output of this kernel free of CDN stylesheets (idempotent; after pn.extension(inline=True))."""
    if not pn.config.inline:
        raise RuntimeError("offline_notebook() needs pn.extension(..., inline=True) first (pn.config.inline is False)")
    if _inline_stylesheets not in Viewable._preprocessing_hooks:
        Viewable._preprocessing_hooks.append(_inline_stylesheets)

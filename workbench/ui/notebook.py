"""Panel in a notebook with nothing fetched from outside the machine: `offline_notebook()` after `pn.extension`.

`pn.extension(inline=True)` inlines Panel's JS and turns the stylesheets of the first render into inline ones,
but the models later updates from the kernel create (a `pn.bind`-ed Markdown re-rendered when the sentence
changes) still carry Panel's CDN stylesheets (loading.css, markdown.css, theme/default.css, theme/native.css:
ERR_NAME_NOT_RESOLVED offline, unstyled text; holoviz/panel #6759, #7073, open in Panel 1.9). These models are
sent before any hook sees them, so the fix sits where Panel resolves each stylesheet's URL (`patch_stylesheet`,
called for every one it sends): a CDN URL whose file ships in Panel's dist folder becomes a data: URL of it.

`ordered_notebook_updates()` (called by both `offline_notebook()` and a notebook `Workbench`) keeps the kernel's
updates to a shown dashboard in the order they were made. Panel's `push` holds an update back while the output's
comm is not open yet (a cell that changes the dashboard right after the cell that shows it, as "Run All" does)
and retries each held update on its own 0.1 s timer; an update made after the comm opened goes out at once,
ahead of older held ones. Bokeh sends a new model in full once and by reference afterwards, so the browser then
meets a reference to a model it has not received ("reference … isn't known", the update lost). Here every
update waits behind the held ones of its comm.
"""

from __future__ import annotations

import base64
import sys
import warnings
from collections import deque

import panel as pn
import panel.io.notebook as panel_notebook
import panel.io.resources as resources
import panel.reactive as reactive
from bokeh.models import UIElement
from panel.io.notebook import patch_inline_stylesheets
from panel.viewable import Viewable
from tornado.ioloop import IOLoop

_PANEL_PATCH_STYLESHEET = resources.patch_stylesheet
_PANEL_PUSH = panel_notebook.push
RETRY_S = 0.1  # Panel's own retry interval while a comm is not open
_held: dict[int, tuple[object, deque]] = {}  # id(comm) -> (comm, its held messages, oldest first)


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
    ordered_notebook_updates()


def _ordered_push(doc, comm, binary: bool = True, msg=None) -> None:
    """Panel's `push`, except that an update never overtakes an older one held back for the same comm."""
    if msg is None:
        msg = panel_notebook.diff(doc, binary=binary)
    if msg is None:
        return
    if comm._comm and id(comm) not in _held:
        panel_notebook.send(comm, msg)
        return
    if id(comm) not in _held:
        try:
            IOLoop.current().call_later(RETRY_S, _send_held, comm)
        except Exception:  # as Panel: no event loop to retry on
            warnings.warn("A notebook update could not be sent: its comm is not open and there is no event loop "
                          "to retry on.", UserWarning, stacklevel=2)
            return
        _held[id(comm)] = (comm, deque())
    _held[id(comm)][1].append(msg)


def _send_held(comm) -> None:
    """Once the comm is open, its held updates in the order they were made; until then, look again later."""
    if not comm._comm:
        IOLoop.current().call_later(RETRY_S, _send_held, comm)
        return
    _, queue = _held.pop(id(comm))
    while queue:
        panel_notebook.send(comm, queue.popleft())


def ordered_notebook_updates() -> None:
    """Route Panel's notebook pushes through `_ordered_push` (idempotent). Panel's modules import `push` by
    name, so each loaded module's reference to it is replaced."""
    for name, module in list(sys.modules.items()):
        if (name == "panel" or name.startswith("panel.")) and getattr(module, "push", None) is _PANEL_PUSH:
            module.push = _ordered_push

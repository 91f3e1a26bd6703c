"""The dashboard in a notebook: it asks no CDN for anything, also after updates from the kernel, and the kernel's
updates reach the page in the order they were made, also those made before the output's comm opened."""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import panel as pn
import panel.io.notebook as panel_notebook
import panel.io.resources as resources
import panel.reactive as reactive
import pytest
from bokeh.document import Document
from bokeh.model import Model
from bokeh.models import ImportedStyleSheet, UIElement
from panel.config import panel_extension
from panel.io.state import state
from panel.viewable import Viewable

from workbench.ui import notebook
from workbench.ui.notebook import _inline_stylesheets, offline_notebook


@pytest.fixture
def inline_panel(monkeypatch):
    """pn.config.inline on, Panel's hook list and view registry as they were after the test."""
    monkeypatch.setattr(pn.config, "inline", True)
    monkeypatch.setattr(panel_extension, "_loaded", True)  # as after pn.extension() in a notebook
    monkeypatch.setattr(state, "_location", state._location)
    monkeypatch.setattr(Viewable, "_preprocessing_hooks", list(Viewable._preprocessing_hooks))
    monkeypatch.setattr(resources, "patch_stylesheet", resources.patch_stylesheet)
    monkeypatch.setattr(reactive, "patch_stylesheet", reactive.patch_stylesheet)
    views = dict(state._views)
    yield
    state._views.clear()
    state._views.update(views)


def _cdn_stylesheets(roots) -> set[str]:
    return {str(s.url) for root in roots for m in root.select({"type": UIElement}) for s in m.stylesheets
            if isinstance(s, ImportedStyleSheet) and str(s.url).startswith("http")}


def _shown_dashboard(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "ui"))
    from app_fixtures import build_checkpoint

    from workbench.ui import Workbench

    wb = Workbench(build_checkpoint(tmp_path / "ck", steps=0), sentence="Ein Hund läuft.")
    before = set(state._views)
    wb._repr_mimebundle_()  # what a notebook does to show it (a comm-backed document)
    roots = [state._views[ref][1] for ref in set(state._views) - before]
    assert roots
    return wb, roots


def test_updates_from_the_kernel_bring_no_cdn_stylesheets(tmp_path, monkeypatch, inline_panel):
    offline_notebook()
    wb, roots = _shown_dashboard(tmp_path, monkeypatch)
    assert _cdn_stylesheets(roots) == set()
    wb.session.sentence = "Zwei Katzen schlafen."  # re-renders the bound translation Markdown
    assert _cdn_stylesheets(roots) == set()


def test_without_it_panel_fetches_stylesheets_from_its_cdn(tmp_path, monkeypatch, inline_panel):
    """The upstream behaviour the hook works around (if this starts failing, Panel fixed it: drop the hook)."""
    wb, roots = _shown_dashboard(tmp_path, monkeypatch)
    wb.session.sentence = "Zwei Katzen schlafen."
    assert any("markdown.css" in url for url in _cdn_stylesheets(roots))


def test_needs_inline_and_registers_once(monkeypatch, inline_panel):
    offline_notebook()
    offline_notebook()
    assert Viewable._preprocessing_hooks.count(_inline_stylesheets) == 1
    monkeypatch.setattr(pn.config, "inline", False)
    with pytest.raises(RuntimeError, match="inline=True"):
        offline_notebook()


@pytest.fixture
def panel_push(monkeypatch):
    """Panel's own `push` in every Panel module while the test runs, whatever an earlier Workbench installed;
    the modules' references as they were afterwards."""
    _restore_panel_push(monkeypatch)
    monkeypatch.setattr(notebook, "_held", {})


def _restore_panel_push(monkeypatch) -> None:
    """Panel's own `push` back in every Panel module that uses it (until monkeypatch undoes it)."""
    for name, module in list(sys.modules.items()):
        if (name == "panel" or name.startswith("panel.")) and getattr(module, "push", None) in (
                notebook._PANEL_PUSH, notebook._ordered_push):
            monkeypatch.setattr(module, "push", notebook._PANEL_PUSH)


def _updates_around_the_comm_opening(tmp_path, monkeypatch, ordered: bool) -> tuple[dict, list, Document]:
    """Show the dashboard; change its sentence before the output's comm is open (a "Run All" cell right after
    the one that shows it), then open the comm and change it again at once. Returns the document the page
    started from, the messages in the order they went out, and the kernel's document."""
    sent = []
    monkeypatch.setattr(panel_notebook, "send", lambda comm, msg: sent.append(msg))

    async def scenario():
        wb, roots = _shown_dashboard(tmp_path, monkeypatch)  # Workbench() installs the ordered pushes...
        if not ordered:  # ...which the upstream-behaviour test takes away again
            _restore_panel_push(monkeypatch)
        [(_, _, doc, comm)] = [v for v in state._views.values() if v[1] in roots]
        start = doc.to_json(deferred=False)
        assert not comm._comm  # no browser has opened it yet
        wb.session.sentence = "Zwei Katzen schlafen im Garten."
        await asyncio.sleep(0.25)  # Panel retries the held updates: the comm is still closed
        assert sent == []
        monkeypatch.setattr(comm, "_comm", object())  # the page rendered and opened the comm
        wb.session.sentence = "Ein Mann fährt mit dem Fahrrad."
        await asyncio.sleep(0.5)
        return start, doc

    # its own thread and event loop: the browser tests' sync Playwright may have left a loop running in this one
    with ThreadPoolExecutor(1) as pool:
        start, doc = pool.submit(asyncio.run, scenario()).result()
    return start, sent, doc


def _replay(start: dict, messages: list) -> Document:
    """What the page does: the first render's document, then each message applied in arrival order."""
    page = Document.from_json(start)
    for msg in messages:
        msg.apply_to_document(page)
    return page


def _plain(value):
    """A property value with models as their ids and arrays as lists, comparable across documents."""
    if isinstance(value, Model):
        return {"id": value.id}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):  # a set's repr follows its insertion order and the string hash seed
        return sorted(repr(_plain(v)) for v in value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return repr(value)


def _state(doc: Document) -> dict:
    """Every model of the document with every property, for comparing the page's copy with the kernel's."""
    return {m.id: {k: _plain(v) for k, v in m.properties_with_values(include_defaults=True).items()}
            for m in doc.models}


def test_updates_made_before_the_comm_opened_arrive_in_order(tmp_path, monkeypatch, inline_panel, panel_push):
    start, sent, kernel_doc = _updates_around_the_comm_opening(tmp_path, monkeypatch, ordered=True)
    assert len(sent) >= 2
    page = _replay(start, sent)  # raises on a reference to a model the page never received
    assert _state(page) == _state(kernel_doc)  # the page ends where the kernel is


def test_panel_alone_sends_a_newer_update_first(tmp_path, monkeypatch, inline_panel, panel_push):
    """The upstream behaviour `ordered_notebook_updates` fixes: the page ends on an older state or cannot apply
    a message at all (if this starts failing, Panel keeps its order itself: drop the fix)."""
    start, sent, kernel_doc = _updates_around_the_comm_opening(tmp_path, monkeypatch, ordered=False)
    try:
        page = _replay(start, sent)
    except Exception as e:  # Bokeh's "can't resolve reference": the browser's "reference … isn't known"
        assert "reference" in str(e).lower(), e
    else:
        assert _state(page) != _state(kernel_doc)


def test_ordered_updates_reach_every_panel_module_once(panel_push):
    notebook.ordered_notebook_updates()
    notebook.ordered_notebook_updates()
    users = [name for name, module in sys.modules.items() if name.startswith("panel")
             and getattr(module, "push", None) in (notebook._PANEL_PUSH, notebook._ordered_push)]
    assert {"panel.io.notebook", "panel.reactive", "panel.pane.base"} <= set(users)
    assert all(sys.modules[name].push is notebook._ordered_push for name in users)

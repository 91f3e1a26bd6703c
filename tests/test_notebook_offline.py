"""The inline dashboard in a notebook asks no CDN for anything, also after updates from the kernel."""

from __future__ import annotations

from pathlib import Path

import panel as pn
import panel.io.resources as resources
import panel.reactive as reactive
import pytest
from bokeh.models import ImportedStyleSheet, UIElement
from panel.config import panel_extension
from panel.io.state import state
from panel.viewable import Viewable

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

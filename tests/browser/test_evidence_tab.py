"""The Evidence tab in a real browser: the alignment lines, the source-share bars and the role grids draw for
every method, with no console error, failed or external request, and no error message on the page."""

from __future__ import annotations

import os
from pathlib import Path

from test_app import TIMEOUT, open_app, submit


def test_evidence_tab_draws_for_every_method(page, app_server, tmp_path):
    page.set_viewport_size({"width": 1400, "height": 1200})
    watch = open_app(page, app_server + "?ckpt=demo")
    submit(page, "Ein Hund läuft im Schnee.")
    page.locator(".main-tabs").get_by_text("Evidence", exact=True).click()
    methods = page.locator(".evidence-method button")
    methods.first.wait_for(timeout=TIMEOUT)
    shots = Path(os.environ.get("EVIDENCE_SHOTS", tmp_path))
    for i, (label, method) in enumerate([("attention weights", "weights"), ("value-weighted norms", "norms"),
                                         ("ALTI+ contributions", "alti")]):
        page.locator(".evidence-method").get_by_text(label, exact=True).click()
        page.get_by_text(f"Word alignment: {method} AWO").wait_for(timeout=TIMEOUT)  # this method's answer
        page.get_by_text("Head roles").first.wait_for(timeout=TIMEOUT)
        page.locator(".bk-Canvas, canvas").last.wait_for(timeout=TIMEOUT)
        page.wait_for_timeout(800)
        assert page.get_by_text("could not be drawn").count() == 0, label
        page.screenshot(path=str(shots / f"evidence_{i}.png"), full_page=True)
    assert watch.errors == [] and watch.external == []

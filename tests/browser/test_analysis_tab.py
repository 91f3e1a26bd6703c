"""The Model analysis tab in a real browser: every analysis draws a figure, with no console error,
failed or external request, and no error message on the page."""

from __future__ import annotations

from test_app import TIMEOUT, open_app, submit

from workbench.ui.analysis_views import ANALYSES


def test_model_analysis_tab_draws_every_analysis(page, app_server):
    watch = open_app(page, app_server + "?ckpt=demo")
    submit(page, "Ein Hund läuft.")  # short: attention flow is limited to short sources
    page.locator(".main-tabs").get_by_text("Model analysis", exact=True).click()
    picker = page.locator(".analysis-picker select")
    picker.wait_for(timeout=TIMEOUT)
    for name in ANALYSES[1:]:
        picker.select_option(label=name)
        page.locator(".bk-Canvas, canvas").last.wait_for(timeout=TIMEOUT)
        page.wait_for_timeout(600)
        assert page.get_by_text("could not be drawn").count() == 0, name
    assert watch.errors == [] and watch.external == []

"""The "Start here" tour in Chromium: the card opens, a step's "Show me" opens its tab (and the link says so),
and the glossary is one click away (issue 37 point 5)."""

from __future__ import annotations

from test_app import TIMEOUT, open_app


def test_a_tour_step_opens_its_tab(page, app_server, tmp_path):
    watch = open_app(page, app_server + "?ckpt=multi30k-de-en")
    page.locator(".start-here .card-header").first.click()
    steps = page.locator(".start-here .tour-open button")
    steps.first.wait_for(timeout=TIMEOUT)
    assert steps.count() == 9
    steps.nth(7).click()  # 6. Label smoothing
    page.locator(".smoothing-note").first.wait_for(timeout=TIMEOUT)
    page.wait_for_function("() => location.search.includes('tab=internals')", timeout=TIMEOUT)
    page.locator(".glossary-card .card-header").first.click()
    page.get_by_text("Alignment error rate").first.wait_for(timeout=TIMEOUT)
    page.get_by_text("Fraction of variance unexplained").first.wait_for(timeout=TIMEOUT)
    page.screenshot(path=str(tmp_path / "start_here.png"))
    assert watch.errors == [] and watch.external == []

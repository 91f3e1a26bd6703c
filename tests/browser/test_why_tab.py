"""The Why tab in Chromium: tapping an output token redraws its logit attribution, and a changed source
patches; no console error, failed or external request, no view error (and no server traceback: conftest)."""

from __future__ import annotations

from test_app import TIMEOUT, open_app, submit

BARS_JS = """() => { const v = [...Bokeh.index.all_views()].filter(
    v => v.model.name === 'dla_bars' && v.el.isConnected);
    return v.length === 1 ? v[0].model.title.text : null; }"""


def test_why_tab_explains_the_tapped_token(page, app_server):
    watch = open_app(page, app_server + "?ckpt=demo")
    submit(page, "Ein Hund läuft durch den Park.")
    page.locator(".main-tabs").get_by_text("Why", exact=True).click()
    page.wait_for_function(f"({BARS_JS})() !== null", timeout=TIMEOUT)
    assert "output position 0" in page.evaluate(BARS_JS)
    page.locator(".why-tokens button").nth(2).click()
    page.wait_for_function(f"({BARS_JS})().includes('output position 2')", timeout=TIMEOUT)
    box = page.locator(".why-corrupted input")
    box.fill("Ein Hund läuft durch den großen grünen Park.")
    box.press("Enter")
    page.get_by_text("patching needs the same positions").wait_for(timeout=TIMEOUT)
    assert page.locator(".view-error").count() == 0
    assert watch.errors == [] and watch.external == []

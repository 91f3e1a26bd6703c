"""The Internals tab teaches label smoothing with the checkpoint's own ε and its measured confidence (issue 37
point 5), drawn in Chromium with no page error."""

from __future__ import annotations

from test_app import TIMEOUT, open_app, text


def test_internals_shows_the_checkpoints_label_smoothing_and_confidence(page, app_server, tmp_path):
    watch = open_app(page, app_server + "?ckpt=multi30k-de-en")
    page.locator(".main-tabs").get_by_text("Internals", exact=True).click()
    page.locator(".confidence-note").first.wait_for(timeout=TIMEOUT)
    assert "ε = 0.1" in text(page, ".smoothing-note")
    note = text(page, ".confidence-note")
    assert "held-out sentences" in note and "above the smoothed optimum 0.900" in note, note
    page.locator(".confidence-note").first.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    page.screenshot(path=str(tmp_path / "internals_smoothing.png"), full_page=False)
    assert watch.errors == [] and watch.external == []

"""Export view (offline HTML) in Chromium, on a server that has already served and closed other sessions:
the download arrives, and the file draws its figure with every network request blocked."""

from __future__ import annotations

from test_app import TIMEOUT, open_app

from workbench.charts import external_references

FIGURE_DRAWN_JS = """() => typeof Bokeh !== 'undefined' && [...Bokeh.index.all_views()].some(
    v => v.model.type === 'Figure' && v.has_finished() && v.el.isConnected)"""


def test_export_downloads_a_file_that_draws_offline(browser, app_server, tmp_path):
    ctx = browser.new_context(accept_downloads=True)
    first = ctx.new_page()
    open_app(first, app_server + "?ckpt=demo&head=999")
    first.close()
    first_gone = ctx.new_page()
    open_app(first_gone, app_server + "?ckpt=demo")
    first_gone.close()
    page = ctx.new_page()
    page.wait_for_timeout(12_000)  # the server destroys closed sessions within ~11 s (conftest)
    open_app(page, app_server + "?ckpt=demo")
    with page.expect_download(timeout=TIMEOUT) as info:
        page.locator(".export-html button").click()
    assert info.value.suggested_filename == "demo_heatmap_cross-L0-Hmean.html"  # checkpoint, view, kind, layer, head
    path = tmp_path / info.value.suggested_filename
    info.value.save_as(path)
    html = path.read_text(encoding="utf-8")
    assert "Checkpoint: demo" in html and "Sentence: " in html and "Translation: " in html  # the caption
    assert "cdn.jsdelivr.net" not in html and external_references(html) == []  # no CDN, not even MathJax's
    ctx.close()

    offline = browser.new_context(offline=True)
    asked: list[str] = []

    def block(route):
        asked.append(route.request.url)
        route.abort()

    offline.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else block(route))
    viewer = offline.new_page()
    failed: list[str] = []
    viewer.on("requestfailed", lambda r: failed.append(r.url))
    viewer.on("pageerror", lambda e: failed.append(str(e)))
    viewer.goto(path.as_uri())
    viewer.wait_for_function(FIGURE_DRAWN_JS, timeout=TIMEOUT)
    box = viewer.locator("canvas").first.bounding_box()
    assert box and box["width"] > 200 and box["height"] > 150
    assert asked == [] and failed == []
    offline.close()

"""The served app in a real Chromium: loads clean and offline, reacts to input, shares state by URL, isolates sessions.

Marker `browser` (added by conftest). Run: `pytest tests/browser -q` (screenshots: test_compare_and_layout.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

ROOT = Path(__file__).resolve().parents[2]
# A wait, not a timing: the first page of a session pays for the model load and Chromium's first (software)
# paint; on a loaded 2-core machine that took more than 30 s once, so allow 90 s before calling it broken.
TIMEOUT = 90_000

FIGURE_JS = """() => {
    // The heatmap on screen: replaced figures may linger in the document until Bokeh collects them.
    const views = [...Bokeh.index.all_views()].filter(v => v.model.name === 'attn_fig' && v.el.isConnected);
    if (views.length !== 1) return null;
    const f = views[0].model;
    return {title: f.title.text, keys: f.x_range.end + 0.5, queries: f.y_range.start + 0.5};
}"""


class Watch:
    """Console errors, page errors, failed and external requests of one page."""

    def __init__(self, page, base: str):
        self.errors: list[str] = []
        self.external: list[str] = []
        host = urlparse(base).netloc
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        # a request the page cancels itself (ERR_ABORTED: e.g. the progress bar's stylesheet, when the bar is gone
        # before its CSS arrived) is no failure of the server; a refused, reset or failed one is
        page.on("requestfailed", lambda r: None if "ERR_ABORTED" in (r.failure or "") else self.errors.append(
            f"request failed: {r.url} ({r.failure})"))
        page.on("request", lambda r: self.external.append(r.url)
                if urlparse(r.url).scheme in ("http", "https", "ws", "wss") and urlparse(r.url).netloc != host
                else None)


def open_app(page, url: str) -> Watch:
    watch = Watch(page, url)
    page.goto(url)
    try:
        page.locator(".translation").get_by_text("log p").wait_for(timeout=TIMEOUT)
        page.locator("canvas").first.wait_for(timeout=TIMEOUT)
    except PlaywrightTimeoutError as e:  # say what the page showed and logged, not only what it lacked
        shown = page.locator("body").inner_text(timeout=5000)[:500]
        raise AssertionError(f"the page did not open: {e.message.splitlines()[0]}\nerrors: {watch.errors}\n"
                             f"it shows: {shown!r}") from e
    return watch


TEXT_JS = """el => { const root = el.shadowRoot || el;
    return [...root.children].filter(c => !['STYLE', 'LINK'].includes(c.tagName)).map(c => c.innerText).join(' '); }"""


def text(page, css: str) -> str:
    """Visible text of a Panel component (it renders in an open shadow root, so the host's innerText is empty)."""
    return page.locator(css).first.evaluate(TEXT_JS, timeout=TIMEOUT)


def version(page) -> int:
    """How many answers the page has applied (a hidden status element: textContent, not innerText)."""
    content = page.locator(".status").first.evaluate("el => (el.shadowRoot || el).textContent", timeout=TIMEOUT)
    return int(re.search(r"version=(\d+)", content).group(1))


def wait_version(page, above: int) -> int:
    deadline = time.monotonic() + TIMEOUT / 1000
    while time.monotonic() < deadline:
        if version(page) > above:
            return version(page)
        page.wait_for_timeout(50)
    raise AssertionError(f"the page stayed at version {above}: {text(page, '.message')!r}")


def figure(page) -> dict:
    page.wait_for_function(f"({FIGURE_JS})() !== null", timeout=TIMEOUT)
    return page.evaluate(FIGURE_JS)


def source_tokens(page) -> int:
    return int(re.search(r"(\d+) source tokens", text(page, ".translation")).group(1))


def submit(page, text: str) -> int:
    v = version(page)
    box = page.locator(".sentence-input textarea")
    box.fill(text)
    page.locator(".translate-btn button").click()  # the box commits when it loses focus
    return wait_version(page, v)


def test_loads_clean_offline_and_reacts(page, app_server, tmp_path):
    page.set_viewport_size({"width": 1400, "height": 1000})
    watch = open_app(page, app_server)
    fig = figure(page)
    assert fig["title"].startswith("cross-attention, layer 0")
    assert fig["keys"] == source_tokens(page)
    page.screenshot(path=str(tmp_path / "app.png"), full_page=True)

    # typing a sentence updates the translation and the heatmap
    before = text(page, ".translation")
    submit(page, "Zwei Hunde spielen am Strand mit einem roten Ball.")
    assert text(page, ".translation") != before
    page.wait_for_function(f"({FIGURE_JS})().keys === {source_tokens(page)}", timeout=TIMEOUT)

    # picking a head updates the view
    page.locator(".head-picker select").select_option(label="head 2")
    page.wait_for_function(f"({FIGURE_JS})().title.includes('head 2')", timeout=TIMEOUT)

    # ablating that head changes the output's log-probability (shown beside the original)
    v = version(page)
    page.locator(".ablate-btn button").click()
    wait_version(page, v)
    out = text(page, ".ablation-out")
    assert "Δ =" in out and "original" in out
    delta = float(re.search(r"Δ = ([-+]\d+\.\d+)", out).group(1))
    assert delta != 0.0

    # the URL now carries the state; a new page opened on it shows the same
    query = parse_qs(urlparse(page.url).query)
    assert query["head"] == ["2"] and "Strand" in query["src"][0] and "cross:0:2" in query["ablate"][0]
    translation = text(page, ".translation")
    page2 = page.context.new_page()
    watch2 = open_app(page2, page.url)
    page2.wait_for_function(f"({FIGURE_JS})().title.includes('head 2')", timeout=TIMEOUT)
    assert text(page2, ".translation").split("log p")[0] == translation.split("log p")[0]
    deadline = time.monotonic() + TIMEOUT / 1000  # the link's ablation is its own answer, after the translation's
    while "Ablating" in text(page2, ".ablation-out") and time.monotonic() < deadline:
        page2.wait_for_timeout(50)
    assert f"Δ = {delta:+.3f}" in text(page2, ".ablation-out")

    assert watch.errors == [] and watch2.errors == []
    assert watch.external == [] and watch2.external == []


def test_two_sessions_do_not_share_ablations(browser, app_server):
    a, b = browser.new_context(), browser.new_context()
    pa, pb = a.new_page(), b.new_page()
    open_app(pa, app_server + "?ckpt=demo")
    open_app(pb, app_server + "?ckpt=demo")
    b_before = text(pb, ".translation")
    pa.locator(".head-picker select").select_option(label="head 1")
    v = version(pa)
    pa.locator(".ablate-btn button").click()
    wait_version(pa, v)
    assert "Δ =" in text(pa, ".ablation-out")
    # B: same sentence re-run after A's ablation; its page has no ablation and the same result as before
    vb = version(pb)
    pb.locator(".beam-slider").first.focus()
    submit(pb, pb.locator(".sentence-input textarea").input_value() + " ")
    assert version(pb) > vb
    assert "Δ =" not in text(pb, ".ablation-out")
    assert text(pb, ".translation").split("log p")[0] == b_before.split("log p")[0]
    a.close()
    b.close()


SHOWN_IMAGE_JS = """() => {
    const views = [...Bokeh.index.all_views()].filter(v => v.model.name === 'attn_fig' && v.el.isConnected);
    if (views.length !== 1) return null;
    const f = views[0].model;
    const r = f.renderers.find(r => r.name === 'attention_image');
    const data = r.data_source.data;
    const image = (data instanceof Map ? data.get('image') : data.image)[0];
    let sum = 0, k = 0;  // weighted by position: every row of attention sums to 1 whatever the head
    for (const x of image) { k += 1; if (!Number.isNaN(x)) sum += k * x; }
    return {id: f.id, title: f.title.text, sum: sum};
}"""

# A head picked and a button clicked in one task of the page: the click reaches the server within the pick's
# debounce, so Panel applies the pick in the click's handler, outside the document's lock (tests/ui/
# test_served_attention.py does the same without a browser, deterministically).
PICK_AND_CLICK_JS = """([picker, button, label]) => {
    picker.value = [...picker.options].find(o => o.text === label).value;
    picker.dispatchEvent(new Event('change'));
    button.click();
}"""


def test_head_picks_in_two_pages_change_each_shown_heatmap_in_place(browser, app_server, tmp_path):
    """Two pages pick heads and layers, some picks with a click at once: each page's heatmap (the same figure,
    changed in place) shows its own pick with new values, and the server logs no error."""
    contexts = [browser.new_context(viewport={"width": 1400, "height": 1000}) for _ in range(2)]
    pages = [c.new_page() for c in contexts]
    watches = [open_app(p, app_server + "?ckpt=demo") for p in pages]
    for p in pages:
        p.wait_for_function(f"({SHOWN_IMAGE_JS})() !== null", timeout=TIMEOUT)
    first = [p.evaluate(SHOWN_IMAGE_JS) for p in pages]
    seen = [{f["sum"]} for f in first]
    picks = [("1", "head 1", True), ("1", "head 2", False), ("0", "head 3", True), ("0", "head 0", False)]
    for step, (layer, head, click) in enumerate(picks):
        for i, page in enumerate(pages):
            mine = head if i == 0 else f"head {3 - int(head[-1])}"  # the two pages pick different heads
            page.locator(".layer-picker select").select_option(label=layer)
            if click:
                page.evaluate(PICK_AND_CLICK_JS, [page.locator(".head-picker select").element_handle(),
                                                  page.locator(".ablate-btn button").element_handle(), mine])
            else:
                page.locator(".head-picker select").select_option(label=mine)
            page.wait_for_function(f"() => {{ const f = ({SHOWN_IMAGE_JS})(); return f !== null && "
                                   f"f.title.includes('layer {layer}, {mine} '); }}", timeout=TIMEOUT)
            shown = page.evaluate(SHOWN_IMAGE_JS)
            assert shown["id"] == first[i]["id"], "the heatmap was drawn anew, not changed in place"
            assert shown["sum"] not in seen[i], f"page {i}, pick {step}: the title changed but not the values"
            seen[i].add(shown["sum"])
    pages[0].screenshot(path=str(tmp_path / "attention_after_picks.png"), full_page=True)
    assert [w.errors for w in watches] == [[], []]
    for c in contexts:
        c.close()


BAD_INPUTS = [
    ("", "Type a sentence"),
    ("x" * 5001, "only the first 5,000"),
    ("Ein Hund 🐕 läuft 🎉", None),
    ("كلب يجري في الحديقة", None),
    ("一只狗在公园里跑。", None),
    ("Ein\x00Hund\x07\x1b[31m läuft\u202e", None),
]


def test_bad_input_shows_a_message_and_the_page_keeps_working(page, app_server):
    watch = open_app(page, app_server + "?ckpt=demo")
    for sentence, expect in BAD_INPUTS:
        submit(page, sentence)
        assert "Traceback" not in page.locator("body").inner_text()
        if expect:
            assert expect in text(page, ".message"), sentence[:20]
        else:
            assert "log p" in text(page, ".translation"), sentence
            assert not text(page, ".message").strip().startswith(("Cannot", "The model")), sentence
            continue
        submit(page, "Ein Hund.")  # still working after the message
        assert "log p" in text(page, ".translation") and text(page, ".message").strip() == ""
    assert watch.errors == []


def test_corrupt_checkpoint_is_a_message(page, app_server):
    watch = open_app(page, app_server + "?ckpt=demo")
    v = version(page)
    page.locator(".ckpt-picker select").select_option(label="zz_broken")
    wait_version(page, v)
    assert "Cannot load this checkpoint" in text(page, ".message")
    v = version(page)
    page.locator(".ckpt-picker select").select_option(label="demo")
    wait_version(page, v)
    assert "log p" in text(page, ".translation")
    assert watch.errors == []


def test_a_bad_link_is_ignored_with_a_message(page, app_server):
    """A path in the link is never used: only labels from the discovered list are; the rest still applies."""
    watch = open_app(page, app_server + "?ckpt=%2Fetc%2Fpasswd&head=1&src=Ein+Hund+l%C3%A4uft.")
    assert "could not be used" in text(page, ".message") and "/etc/passwd" in text(page, ".message")
    assert page.locator(".sentence-input textarea").input_value() == "Ein Hund läuft."
    page.wait_for_function(f"({FIGURE_JS})().title.includes('head 1')", timeout=TIMEOUT)
    assert watch.errors == []


# Every stylesheet the page's Bokeh documents hold (requested yet or not: a hidden component's too).
STYLESHEETS_JS = """() => [...Bokeh.documents].flatMap(d => [...d.all_models])
    .filter(m => (m.constructor.__qualified__ || '').endsWith('ImportedStyleSheet'))
    .map(m => m.url)"""


def off_host(urls: list[str], base: str) -> list[str]:
    host = urlparse(base).netloc
    return [u for u in urls if urlparse(u).scheme in ("http", "https") and urlparse(u).netloc != host]


def test_every_tab_and_view_draws_without_errors(page, app_server):
    watch = open_app(page, app_server + "?ckpt=demo")
    for i in (1, 2):  # lines, grid
        page.locator(".view-picker button").nth(i).click()
        page.wait_for_timeout(500)
    for tab in ("Internals", "Compare", "Analysis"):
        page.locator(".main-tabs").get_by_text(tab, exact=True).click()
        page.locator(".bk-Canvas, canvas").last.wait_for(timeout=TIMEOUT)
        page.wait_for_timeout(800)
    assert page.locator(".view-error").count() == 0
    assert watch.errors == [] and watch.external == []
    sheets = page.evaluate(STYLESHEETS_JS)
    assert sheets and off_host(sheets, app_server) == []  # from the server's static route, not Panel's CDN


def test_a_session_the_websocket_creates_names_no_cdn_stylesheet(app_server):
    """A page whose first session expired before its scripts connected gets a session made by the websocket, which
    Panel never rewrote to the server's static route: every stylesheet came from its CDN (a busy machine; the Graph
    tab's tests with graphs in the worker processes). `pull_session` makes such a session directly (in a child
    process: the client imports Panel, which this test process must not; and the app's own components, such as
    the glossary, whose models a Bokeh client must know to read the document)."""
    pull = ("import json, sys, panel\n"
            "import workbench.ui\n"
            "from bokeh.client import pull_session\n"
            "from bokeh.models import ImportedStyleSheet\n"
            "with pull_session(url=sys.argv[1], arguments={'ckpt': 'demo'}) as s:\n"
            "    print(json.dumps([str(m.url) for m in s.document.models if isinstance(m, ImportedStyleSheet)]))\n")
    out = subprocess.run([sys.executable, "-c", pull, app_server], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, check=True)
    sheets = json.loads(out.stdout.strip().splitlines()[-1])
    assert sheets and off_host(sheets, app_server) == [], sheets

"""The link is the page (issue 37): after a random (seeded) sequence of clicks, the page's URL opened in a fresh
browser context shows the same controls and the same figures; the issue's own sequence opens without a message
and with its ablation; a link's `tab=` opens its tab; Compare's picker shows B and a choice sets it.

No duration is asserted: every wait is for a state (the page settled: no spinner, the URL and the figures'
titles unchanged over two looks)."""

from __future__ import annotations

import random
from urllib.parse import parse_qs, urlparse

import pytest
from test_app import TIMEOUT, open_app, submit, text, version, wait_version
from test_graph_tab import DRAWN_JS, PANEL_JS, tap

TITLES_JS = """() => [...Bokeh.index.all_views()]
    .filter(v => v.el instanceof Element && v.el.isConnected && v.el.getClientRects().length > 0
                 && v.model.title && v.model.title.text)
    .map(v => v.model.title.text).sort()"""  # shown ones: a tab being swapped keeps the old one's, hidden
SENTENCES = ["Ein Hund läuft durch den Park.", "Zwei Männer spielen «Fußball» & lachen 🎉.",
             "Eine Frau <b>liest</b> ein Buch?"]
CHECKPOINTS = ["demo", "demo_early", "other"]  # small ones (the default directory's are slower to load)
TABS = ["Attention", "Compare", "Analysis"]


def _selected(page, css: str) -> str | None:
    return page.locator(css + " select").evaluate(
        "s => s.options[s.selectedIndex] ? s.options[s.selectedIndex].text : null", timeout=TIMEOUT)


def _busy(page) -> bool:
    return page.locator(".busy").first.is_visible()


def settle(page) -> None:
    """Wait until nothing changes: no spinner, a figure shown, and the URL and the shown figures' titles the same
    over three looks. (A tab is drawn by the server after its click: until its answer the page shows no figure.)"""
    looks = []
    for _ in range(TIMEOUT // 400):
        page.wait_for_timeout(400)
        now = (page.url, page.evaluate(TITLES_JS), text(page, ".translation").split("log p")[0])
        looks = [*looks[-2:], now]
        if (len(looks) == 3 and looks.count(now) == 3 and now[1] and not _busy(page)
                and page.locator(".main-tabs .pn-loading").count() == 0):
            return
    raise AssertionError(f"the page never settled: {page.url}")


def state(page) -> dict:
    """What the page shows: the controls of the open tab, the translation, the drawn figures' titles."""
    tab = page.locator(".main-tabs .bk-tab.bk-active").first.inner_text(timeout=TIMEOUT)
    out = {"tab": tab, "ckpt": _selected(page, ".ckpt-picker"),
           "src": page.locator(".sentence-input textarea").input_value(timeout=TIMEOUT),
           "translation": text(page, ".translation").split("log p")[0], "titles": page.evaluate(TITLES_JS)}
    if tab == "Attention":
        out.update(kind=page.locator(".kind-picker button.bk-active").inner_text(timeout=TIMEOUT),
                   view=page.locator(".view-picker button.bk-active").inner_text(timeout=TIMEOUT),
                   layer=_selected(page, ".layer-picker"), head=_selected(page, ".head-picker"),
                   token=_selected(page, ".token-picker"),
                   words=page.locator(".words-toggle input").is_checked(timeout=TIMEOUT),
                   ablation=text(page, ".ablation-out").split("Log-probability")[0])
    if tab == "Compare":
        out.update(b=_selected(page, ".compare-picker"), note=text(page, ".compare-note"))
    return out


def _pick(page, rng, css: str) -> None:
    options = page.locator(css + " select option").all_inner_texts()
    page.locator(css + " select").select_option(label=rng.choice(options))


def act(page, rng) -> str:
    """One random click of a control on the open tab (or a tab, a checkpoint, a sentence)."""
    tab = page.locator(".main-tabs .bk-tab.bk-active").first.inner_text(timeout=TIMEOUT)
    choices = ["tab", "ckpt", "sentence"]
    if tab == "Attention":
        choices += ["kind", "layer", "head", "head", "token", "words", "view", "ablate"]
    if tab == "Compare":
        choices += ["b", "b"]
    what = rng.choice(choices)
    if what == "tab":
        page.locator(".main-tabs").get_by_text(rng.choice(TABS), exact=True).click()
    elif what == "ckpt":
        page.locator(".ckpt-picker select").select_option(label=rng.choice(CHECKPOINTS))
    elif what == "sentence":
        submit(page, rng.choice(SENTENCES))
    elif what == "kind":
        page.locator(".kind-picker button").nth(rng.randrange(3)).click()
    elif what == "view":
        page.locator(".view-picker button").nth(rng.randrange(3)).click()
    elif what == "words":
        page.locator(".words-toggle input").click()
    elif what == "ablate":
        if _selected(page, ".head-picker") != "all (mean)":
            v = version(page)
            page.locator(".ablate-btn button").click()
            wait_version(page, v)
    elif what == "b":
        _pick(page, rng, ".compare-picker")
    else:
        _pick(page, rng, f".{what}-picker")
    settle(page)
    return what


@pytest.mark.parametrize("seed", [37, 38, 39])
def test_a_copied_link_opens_the_same_page(browser, app_server, seed):
    rng = random.Random(seed)
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    watch = open_app(page, app_server + "?ckpt=demo")
    done = [act(page, rng) for _ in range(7)]
    settle(page)
    url = page.url
    fresh = browser.new_context(viewport={"width": 1400, "height": 1000})
    copy = fresh.new_page()
    watch_copy = open_app(copy, url)
    settle(copy)
    assert "could not be used" not in text(copy, ".message"), (done, url)
    assert state(copy) == state(page), (done, url)
    assert copy.url == url  # written back in the same spelling
    for p in (page, copy):  # the attention controls and figure too, whichever tab was open
        p.locator(".main-tabs").get_by_text("Attention", exact=True).click()
        settle(p)
    assert state(copy) == state(page), (done, url)
    assert watch.errors == [] and watch_copy.errors == []
    assert watch.external == [] and watch_copy.external == []
    ctx.close()
    fresh.close()


def test_the_issue_sequence_opens_with_its_ablation_and_no_message(browser, app_server):
    """Head 2; ablate it; layer 1; head all; words: the copied URL (and its old Panel spelling) opens the same."""
    ctx = browser.new_context()
    page = ctx.new_page()
    open_app(page, app_server + "?ckpt=demo")
    page.locator(".head-picker select").select_option(label="head 2")
    settle(page)
    v = version(page)
    page.locator(".ablate-btn button").click()
    wait_version(page, v)
    page.locator(".layer-picker select").select_option(label="1")
    page.locator(".head-picker select").select_option(label="all (mean)")
    page.locator(".words-toggle input").click()
    settle(page)
    query = parse_qs(urlparse(page.url).query)
    assert (query["ablate"], query["head"], query["layer"], query["words"]) == (["cross:0:2"], ["-1"], ["1"], ["true"])
    old = page.url.replace("ablate=cross%3A0%3A2", "ablate=%5B%27cross%3A0%3A2%27%5D").replace(
        "head=-1", "head=-1.0").replace("words=true", "words=True")
    for url in (page.url, old):
        copy = browser.new_context().new_page()
        open_app(copy, url)
        settle(copy)
        assert "could not be used" not in text(copy, ".message")
        assert state(copy) == state(page)
        assert "ablated (1 heads)" in text(copy, ".ablation-out")
        assert copy.url == page.url
        copy.context.close()
    ctx.close()


def test_a_links_tab_opens_and_a_refused_head_of_ablate_is_named(page, app_server):
    open_app(page, app_server + "?ckpt=demo&tab=compare&ablate=cross:0:1,cross:9:9")
    assert page.locator(".main-tabs .bk-tab.bk-active").first.inner_text() == "Compare"
    page.locator(".compare-note").wait_for(timeout=TIMEOUT)
    page.locator(".message").get_by_text("ablate=cross:9:9").wait_for(timeout=TIMEOUT)  # with the ablation's answer
    message = text(page, ".message")
    assert "ablate=cross:9:9" in message and "cross:0:1" not in message.split("ignored:")[1]
    settle(page)
    assert parse_qs(urlparse(page.url).query)["ablate"] == ["cross:0:1"]


def test_compare_picker_shows_b_and_a_choice_sets_b(page, app_server):
    open_app(page, app_server + "?ckpt=demo")
    page.locator(".main-tabs").get_by_text("Compare", exact=True).click()
    page.locator(".compare-note").wait_for(timeout=TIMEOUT)
    assert _selected(page, ".compare-picker") == "demo_early"  # the partner, another snapshot of the same run
    assert "B = demo_early" in text(page, ".compare-note")
    page.locator(".compare-picker select").select_option(label="other")
    page.locator(".compare-note").get_by_text("B = other: chosen by you").wait_for(timeout=TIMEOUT)
    settle(page)
    assert parse_qs(urlparse(page.url).query)["cmp"] == ["other"]


def test_a_tapped_graph_node_is_in_the_link(browser, app_server):
    """The Graph tab's token, threshold and tapped node: the link opens the same graph with that node's panel."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1100})
    page = ctx.new_page()
    open_app(page, app_server + "?ckpt=demo&tab=graph&gtok=1&gthr=0.5")
    page.wait_for_function(DRAWN_JS, timeout=TIMEOUT)
    node = tap(page, "head")
    page.wait_for_function("() => /[?&]gnode=\\d/.test(window.location.search)", timeout=TIMEOUT)
    settle(page)
    url = page.url
    assert parse_qs(urlparse(url).query)["gtok"] == ["1"]
    copy = browser.new_context(viewport={"width": 1400, "height": 1100}).new_page()
    open_app(copy, url)
    copy.wait_for_function(DRAWN_JS, timeout=TIMEOUT)
    copy.wait_for_function(f"() => {{ const p = ({PANEL_JS})(); return p && p.text.includes({node['label']!r}); }}",
                           timeout=TIMEOUT)
    assert copy.evaluate(PANEL_JS)["text"] == node["text"]
    settle(copy)
    assert copy.url == url and "could not be used" not in text(copy, ".message")
    copy.context.close()
    ctx.close()

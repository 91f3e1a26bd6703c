"""Links with values the app cannot use: each gets the "could not be used" message, nothing is run or
rendered from them, the page keeps working, and the server logs no traceback (conftest checks each test)."""

from __future__ import annotations

import pytest
from test_app import FIGURE_JS, TIMEOUT, figure, open_app, source_tokens, submit, text

BAD_LINKS = [  # (query, what the message must name)
    ("head=999", "head=999"),
    ("layer=7", "layer=7"),
    ("kind=enc_self&layer=2", "layer=2"),
    ("head=abc", "head=abc"),
    ("layer=-4", "layer=-4"),
    ("beam=100000000000000000000", "beam="),
    ("alpha=1e308", "alpha="),
    ("tok=999", "tok=999"),
    ("view=%3Cscript%3Ealert(1)%3C%2Fscript%3E", "view="),
    ("ckpt=..%2F..%2Fetc%2Fpasswd", "../../etc/passwd"),
    ("ckpt=nonexistent-model", "nonexistent-model"),
    ("ablate=%5B%22cross%3A9%3A9%22%5D", "cross:9:9"),
]


@pytest.mark.parametrize("query, named", BAD_LINKS)
def test_a_bad_value_in_the_link_is_named_and_the_page_keeps_working(page, app_server, query, named):
    page.on("dialog", lambda d: (_ for _ in ()).throw(AssertionError(f"a dialog opened: {d.message}")))
    watch = open_app(page, app_server + "?" + (query if "ckpt=" in query else "ckpt=demo&" + query))
    message = text(page, ".message")
    assert "could not be used" in message and named in message, message
    fig = figure(page)
    assert fig["keys"] == source_tokens(page)
    submit(page, "Zwei Hunde spielen im Schnee.")  # the next sentence: no errors from the rejected values
    page.wait_for_function(f"({FIGURE_JS})().keys === {source_tokens(page)}", timeout=TIMEOUT)
    assert "could not be used" not in text(page, ".message")
    assert watch.errors == [] and watch.external == []


def test_markup_in_text_values_is_shown_as_text(page, app_server):
    page.on("dialog", lambda d: (_ for _ in ()).throw(AssertionError(f"a dialog opened: {d.message}")))
    src = "%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E%3Cscript%3Ealert(2)%3C%2Fscript%3E%20Ein%20Hund"
    watch = open_app(page, app_server + f"?ckpt=demo&src={src}&tgt=%3Cb%3Ebold%3C%2Fb%3E")
    assert page.locator(".sentence-input textarea").input_value().startswith("<img src=x onerror=alert(1)>")
    assert page.locator(".translation img, .translation script, .translation b").count() == 0
    assert "<b>bold</b>" in text(page, ".translation").replace("\\", "")
    assert watch.errors == [] and watch.external == []


def test_a_100_kb_link_opens_with_the_cut_and_a_message(page, app_server):
    """The URL carries the sentence: a 100 KB one gets the page (the server's header limit is raised by
    apps/serve_setup.py), the sentence cut to 5,000 characters, and the message saying so."""
    watch = open_app(page, app_server + "?ckpt=demo&src=" + "Ein+Hund+" * 11_200)
    assert len(page.url) > 100_000
    assert "only the first 5,000" in text(page, ".message")
    assert watch.errors == []


def test_ten_pages_at_once(browser, app_server):
    ctx = browser.new_context()
    pages = [ctx.new_page() for _ in range(10)]
    for i, p in enumerate(pages):
        p.goto(app_server + f"?ckpt=demo&src=Ein+Hund+l%C3%A4uft+{i}+mal.", wait_until="commit")
    for p in pages:
        p.locator(".translation").get_by_text("log p").wait_for(timeout=TIMEOUT * 3)
        assert figure(p)["keys"] == source_tokens(p)
    ctx.close()

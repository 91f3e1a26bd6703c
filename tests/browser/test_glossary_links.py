"""A term of art is a way into the glossary (issue 37 point 5): in Chromium, a click on a term in the header and on
the tabs whose texts name one (Attention, Graph, Evidence) opens the glossary, even from collapsed
cards, scrolls to that term's entry and highlights it, with a way back to the text; the URL gets no anchor.

The terms live in the views' shadow DOM and the glossary in a collapsed card inside another, where a `#anchor`
link cannot reach (the old links only showed their hover title and added a hash to the URL)."""

from __future__ import annotations

import os
from pathlib import Path

from playwright.sync_api import expect
from test_app import TIMEOUT, open_app

# (tab, the glossary anchor of a term that a text of that tab names); None: the header, above the tabs. The texts
# are Markdown panes and, in Evidence, a Bokeh Div. The Why and Features tabs' texts are Markdown panes too, left
# out for time (Why's note comes after its patching, Features' after a dictionary's dashboard); their terms are
# checked without a browser (tests/ui/test_why_view.py, tests/ui/test_learn.py).
PLACES = [(None, "head"), ("Attention", "ablation"), ("Graph", "attribution-graph"), ("Evidence", "alti")]


def test_a_term_opens_its_glossary_entry_from_the_header_and_the_tabs(page, app_server, tmp_path):
    page.set_viewport_size({"width": 1400, "height": 1000})
    watch = open_app(page, app_server + "?ckpt=demo&src=Ein+Hund+läuft+durch+den+Park.")
    shots = Path(os.environ.get("GLOSSARY_SHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    glossary = page.locator("dl.glossary")
    for tab, name in PLACES:
        if glossary.count() and glossary.first.is_visible():  # close "Start here" (and the glossary in it) again
            page.locator(".start-here .card-header").first.click()
        expect(glossary).to_be_hidden(timeout=TIMEOUT)
        scope = page.locator(".wb-header")
        if tab is not None:
            page.locator(".main-tabs").get_by_text(tab, exact=True).click()
            scope = page.locator(".main-tabs")
        link = scope.locator(f'a.term[href="#glossary-{name}"]').first
        link.wait_for(timeout=TIMEOUT)
        link.click()
        lit = page.locator(f"dl.glossary dt#glossary-{name}.glossary-hit")
        expect(lit).to_have_count(1, timeout=TIMEOUT)
        expect(lit).to_be_in_viewport(timeout=TIMEOUT)
        expect(page.locator("dl.glossary .glossary-hit")).to_have_count(1)  # only the clicked term's entry is lit
        assert page.evaluate("() => location.hash") == "", tab  # the click went to the glossary, not to the URL
        page.screenshot(path=str(shots / f"glossary_{tab or 'header'}.png"))
    # the text the term was read in is drawn again meanwhile (as when a tab's answer arrives): Evidence's Bokeh Div
    redrawn = page.evaluate("""() => {
        let n = 0;
        for (const doc of Bokeh.documents) for (const m of doc.all_models) {
            if (m.type === "Div" && typeof m.text === "string" && m.text.includes('href="#glossary-alti"')) {
                m.text = m.text + " "; n++; }
        }
        return n; }""")
    assert redrawn >= 1
    page.locator("dl.glossary .glossary-back").click()  # and back to the text the last term was read in
    expect(link).to_be_in_viewport(timeout=TIMEOUT)
    page.screenshot(path=str(shots / "glossary_back.png"))
    assert page.locator("dl.glossary .glossary-back").count() == 0 and page.evaluate("() => location.hash") == ""
    assert watch.errors == [] and watch.external == []

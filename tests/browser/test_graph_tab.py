"""The Graph tab in Chromium: the graph draws; selecting a node (by Bokeh JS, or a mouse tap) shows its panel
(for a head: its attention bars over the keys; for heads and FFNs: corpus contexts); the token and threshold are in
the URL and a link's unusable values are named and dropped; the export downloads one self-contained HTML file that
loads no http(s) script or stylesheet; no console error, failed or external request.

`shoot(page, url, folder)` takes the docs' screenshots (graph_1000.png, graph_1500.png) of any served app: the
docs' come from `panel serve apps/attention.py` on the shipped checkpoints, opened on
`?ckpt=multi30k-de-en&src=Ein+Mann+mit+einem+orangefarbenen+Hut+starrt+auf+etwas.&gtok=5`.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from test_app import TIMEOUT, open_app, submit, text

from workbench.charts import external_references

DRAWN_JS = """() => [...Bokeh.index.all_views()].some(
    v => v.model.name === 'attribution_graph' && v.el.isConnected && v.has_finished())"""

NODES_JS = """() => { const v = [...Bokeh.index.all_views()].filter(
    v => v.model.name === 'graph_dots' && v.el.isConnected);
    return v.length ? v[v.length - 1].model.data_source : null; }"""

# Select the first node of a kind, as a tap does: the panel's JavaScript runs on the selection's change.
SELECT_JS = f"""(kind) => {{ const src = ({NODES_JS})();
    const i = src.data.kind.indexOf(kind);
    if (i < 0) return null;
    src.selected.indices = [i];
    return src.data.label[i]; }}"""

# The newest drawing's panel, as NODES_JS reads the newest drawing's nodes: a tab drawn again (a link's graph
# pruned anew) can keep the older drawing's views on the page, hidden, before the new ones, its panel never filled.
PANEL_JS = """() => { const last = (name) => [...Bokeh.index.all_views()].filter(
    v => v.model.name === name && v.el.isConnected).pop();
    const doc = last('graph_detail'), att = last('graph_node_attention');
    if (!doc) return null;
    const bars = att.model.renderers[0].data_source.data;
    return {text: doc.model.text, visible: att.model.visible, bars: bars.w.length, labels: [...bars.text]}; }"""


def open_graph(page, url: str):
    watch = open_app(page, url)
    page.locator(".main-tabs").get_by_text("Graph", exact=True).click()
    page.wait_for_function(DRAWN_JS, timeout=TIMEOUT)
    return watch


def tap(page, kind: str) -> dict:
    label = page.evaluate(SELECT_JS, kind)
    assert label is not None, f"no {kind} node drawn"
    page.wait_for_function(f"() => {{ const p = ({PANEL_JS})(); return p && p.text.includes({label!r}); }}",
                           timeout=TIMEOUT)
    return {"label": label, **page.evaluate(PANEL_JS)}


# Where a node of a kind is drawn, in page pixels (the figure scrolled into view first), for a real mouse tap.
WHERE_JS = """(kind) => { const v = [...Bokeh.index.all_views()].filter(
    v => v.model.name === 'attribution_graph' && v.el.isConnected).pop();
    v.el.scrollIntoView();
    const dots = [...v.renderer_views.values()].find(r => r.model.name === 'graph_dots');
    const d = dots.model.data_source.data, i = d.kind.indexOf(kind);
    const box = v.canvas_view.el.getBoundingClientRect();
    return {x: box.left + v.frame.x_scale.compute(d.x[i]), y: box.top + v.frame.y_scale.compute(d.y[i]),
            label: d.label[i]}; }"""


def click(page, kind: str) -> dict:
    """Tap the first node of a kind with the mouse (Bokeh's TapTool) and read its panel."""
    where = page.evaluate(WHERE_JS, kind)
    page.mouse.click(where["x"], where["y"])
    page.wait_for_function(f"() => {{ const p = ({PANEL_JS})(); return p && p.text.includes({where['label']!r}); }}",
                           timeout=TIMEOUT)
    return {"label": where["label"], **page.evaluate(PANEL_JS)}


def shoot(page, url: str, folder: Path, widths=(1000, 1500)) -> list[Path]:
    """Screenshots of the Graph tab with a head node tapped, one per page width."""
    out = []
    for width in widths:
        page.set_viewport_size({"width": width, "height": 1100})
        open_graph(page, url)
        tap(page, "head")
        page.wait_for_timeout(800)
        path = Path(folder) / f"graph_{width}.png"
        page.screenshot(path=str(path), full_page=True)
        out.append(path)
    return out


def test_graph_tab_draws_taps_links_and_exports(browser, app_server, tmp_path):
    ctx = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1100})
    page = ctx.new_page()
    watch = open_graph(page, app_server + "?ckpt=demo")
    before = text(page, ".graph-note")
    submit(page, "Ein Hund läuft im Schnee.")
    # the new sentence's graph, not the last one still on the page under the loading spinner (which takes the taps)
    for _ in range(TIMEOUT // 100):
        if text(page, ".graph-note") != before:
            break
        page.wait_for_timeout(100)
    page.wait_for_function(DRAWN_JS, timeout=TIMEOUT)
    head = tap(page, "head")
    assert "strongest edges in" in head["text"] and head["visible"] and head["bars"] > 0
    assert "corpus contexts" in head["text"] and "Multi30k test2016" in head["text"]
    assert all(re.search(r" \d\.\d\d$", t) for t in head["labels"])  # a piece and its weight per bar
    ffn = click(page, "ffn")  # a real mouse tap
    assert "context:" in ffn["text"] and not ffn["visible"]  # no attention for an FFN node
    assert "corpus contexts" in ffn["text"]
    # the token picker and the threshold write the URL
    page.locator(".graph-tokens button").nth(1).click()
    page.wait_for_function("() => window.location.search.includes('gtok=1')", timeout=TIMEOUT)
    page.get_by_text("at output position 1").first.wait_for(timeout=TIMEOUT)
    # export: one self-contained file, named after the checkpoint, the view and the token
    with page.expect_download(timeout=TIMEOUT) as info:
        page.locator(".graph-export button").click()
    assert info.value.suggested_filename == "demo_graph_tok1-thr0.8-cap100.html"
    path = tmp_path / info.value.suggested_filename
    info.value.save_as(path)
    html = path.read_text(encoding="utf-8")
    assert "Checkpoint: demo" in html and "Sentence: Ein Hund" in html and "Translation: " in html
    assert not re.search(r"<(script|link)[^>]+(src|href)\s*=\s*[\"']?(https?:)?//", html, re.I)
    assert external_references(html) == []
    assert page.locator(".view-error").count() == 0
    assert watch.errors == [] and watch.external == []
    # the exported file: drawn and tappable with every network request blocked
    offline = browser.new_context(offline=True)
    asked: list[str] = []
    offline.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:")
                  else (asked.append(r.request.url), r.abort()))
    viewer = offline.new_page()
    errors: list[str] = []
    viewer.on("pageerror", lambda e: errors.append(str(e)))
    viewer.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    viewer.goto(path.as_uri())
    viewer.wait_for_function(DRAWN_JS, timeout=TIMEOUT)
    assert "strongest edges in" in tap(viewer, "head")["text"]
    assert asked == [] and errors == []
    offline.close()
    # a link: usable values set the controls, the others are named and leave the URL
    watch = open_graph(page, app_server + "?ckpt=demo&gtok=2&gthr=0.5&gcap=abc")
    page.get_by_text("at output position 2").first.wait_for(timeout=TIMEOUT)
    page.locator(".message").get_by_text("gcap=abc").wait_for(timeout=TIMEOUT)
    page.wait_for_function("() => window.location.search.includes('gcap=100')", timeout=TIMEOUT)
    query = page.evaluate("() => window.location.search")
    assert "gtok=2" in query and "gthr=0.5" in query and "gcap=abc" not in query  # the refused value left the URL
    assert page.locator(".graph-tokens .bk-active").first.inner_text().startswith("2:")  # the picker agrees
    assert "0.50" in text(page, ".graph-threshold")  # the slider agrees
    watch = open_graph(page, app_server + "?ckpt=demo&gtok=999")
    page.locator(".message").get_by_text("gtok=999").wait_for(timeout=TIMEOUT)
    page.wait_for_function("() => window.location.search.includes('gtok=0')", timeout=TIMEOUT)
    assert watch.errors == [] and watch.external == []
    ctx.close()


# Select the first drawn cross-attention head, as a tap does (the server hears the selection and explains its score).
SELECT_CROSS_JS = f"""() => {{ const src = ({NODES_JS})();
    const i = src.data.label.findIndex(l => l.startsWith('cross:'));
    if (i < 0) return null;
    src.selected.indices = [i];
    return src.data.label[i]; }}"""


def test_a_tapped_cross_attention_head_lists_why_it_attends(browser, app_server):
    """Issue 36 point 4: tapping a cross-attention head shows, under the graph, the top query x key pairs of its
    score at the piece it attends most; picking another piece redraws the table."""
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    watch = open_graph(page, app_server + "?ckpt=demo&gthr=1.0&gcap=400")
    label = page.evaluate(SELECT_CROSS_JS)
    assert label is not None, "no cross-attention head drawn"
    page.locator(".graph-qk-table").wait_for(timeout=TIMEOUT)
    table = text(page, ".graph-qk-table")
    assert "query side" in table and "key side" in table and "share of score" in table
    note = text(page, ".graph-qk-note")
    head = label.split(" @")[0]  # "cross:1:2 @3" -> "cross:1:2"
    assert head in note and "sum to" in note
    first = note.split("reading source piece ")[1].split(" ")[0]
    select = page.locator(".graph-qk-key select")
    other = next(v for v in select.locator("option").evaluate_all("os => os.map(o => o.textContent)")
                 if not v.startswith(f"{first}:"))
    select.select_option(label=other)
    want = f"reading source piece {other.split(':')[0]} "
    deadline = time.monotonic() + TIMEOUT / 1000
    while want not in text(page, ".graph-qk-note") and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert want in text(page, ".graph-qk-note")
    assert watch.errors == [] and watch.external == []
    page.close()


def test_a_tapped_feature_node_links_its_dashboard(browser, app_server):
    """Issue 36 point 3: in a feature graph (*Dictionary features*, the shipped checkpoint's dictionaries) a tapped
    feature node shows its dashboard link, top contexts and output effects under the graph; following the link opens
    the Features tab on that dictionary and feature, with the same checkpoint and sentence."""
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    sentence = "Ein Hund läuft durch den Park."
    watch = open_graph(page, app_server + "?ckpt=multi30k-de-en&src=Ein+Hund+l%C3%A4uft+durch+den+Park.&gtok=1"
                                          "&gfeat=true")
    label = page.evaluate(SELECT_JS, "feature")
    assert label is not None, "no feature node drawn"
    site, feature = re.match(r"(.+)#(\d+) @", label).groups()
    link = page.locator(".graph-feature a.graph-feature-link")
    link.wait_for(timeout=TIMEOUT)
    assert link.get_attribute("data-site") == site and link.get_attribute("data-feature") == feature
    page.locator(".graph-feature .feature-context").first.wait_for(timeout=TIMEOUT)  # its top contexts
    card = page.locator(".graph-feature-card").first.inner_text(timeout=TIMEOUT)
    assert "Output effects" in card and "raises" in card, card
    link.click()
    page.locator(".features-sentence").first.wait_for(timeout=TIMEOUT)  # the Features tab opened
    query = page.evaluate("() => Object.fromEntries(new URLSearchParams(location.search))")
    assert query["tab"] == "features" and query["site"] == site and query["feature"] == feature, query
    assert query["ckpt"] == "multi30k-de-en" and query["src"] == sentence, query
    assert page.locator(".ckpt-picker select").evaluate("s => s.options[s.selectedIndex].text") == "multi30k-de-en"
    assert page.locator(".features-id input").input_value() == feature
    assert watch.errors == [] and watch.external == []
    page.close()

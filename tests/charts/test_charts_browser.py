"""The views' in-page JavaScript, run in headless Chromium from an offline file (marker: browser)."""

from __future__ import annotations

import shutil

import pytest
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.charts import head_view, model_view, save_html

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def driver():
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("needs Debian's chromium + chromium-driver (apt-get install chromium chromium-driver)")
    from workbench.charts.export import _chromium_driver

    drv = _chromium_driver()
    yield drv
    drv.quit()


@pytest.fixture(scope="module")
def trace():
    cfg = presets.tiny(vocab=40, dec_layers=3)
    src, tgt = make_batch(cfg, batch=2, src_len=9, tgt_len=8)
    _, tr = make_model(cfg).run_with_cache(src, tgt)
    return tr


def _open(driver, view, tmp_path, name):
    path = save_html(view, tmp_path / f"{name}.html")
    driver.get(path.as_uri())
    driver.set_script_timeout(20)
    driver.execute_async_script("""
        const done = arguments[0];
        const poll = () => (window.Bokeh && Bokeh.documents.length) ? done() : setTimeout(poll, 50);
        poll();""")
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def _settle(driver):
    """CustomJS runs asynchronously in BokehJS 3: wait two animation frames."""
    driver.execute_async_script("requestAnimationFrame(() => requestAnimationFrame(arguments[0]));")


def test_head_view_toggles_taps_and_layer_picker(driver, trace, tmp_path):
    _open(driver, head_view(trace, "cross"), tmp_path, "hv")
    run = lambda code: driver.execute_script("const doc = Bokeh.documents[0];" + code)
    lines = "doc.get_model_by_name('head_lines').data"
    run("doc.get_model_by_name('head_toggles').active = [1];")
    _settle(driver)
    h, alpha, w = run(f"const d = {lines}; return [Array.from(d.h), Array.from(d.alpha), Array.from(d.w)];")
    assert all((a == 0) == (hh != 1) for hh, a in zip(h, alpha)) and any(a > 0 for a in alpha)
    colors, n_drawn = run("const p = doc.get_model_by_name('head_paths').data;"
                          "return [p.color, p.ys.reduce((n, y) => n + y.length / 3, 0)];")
    assert len(set(colors)) == 1 and n_drawn == sum(a > 0 for a in alpha)  # only head 1's paths are drawn
    n_before = len(w)
    run("doc.get_model_by_name('layer_picker').value = 'layer 2';")
    _settle(driver)
    h2, alpha2, w2 = run(f"const d = {lines}; return [Array.from(d.h), Array.from(d.alpha), Array.from(d.w)];")
    assert (len(w2), w2[:3]) != (n_before, w[:3])  # another layer's lines
    assert all((a == 0) == (hh != 1) for hh, a in zip(h2, alpha2))  # toggles survive the switch
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []


def test_model_view_tap_enlarges_the_tile(driver, trace, tmp_path):
    _open(driver, model_view(trace, "dec_self"), tmp_path, "mv")
    # CustomJS callbacks run asynchronously in BokehJS 3: tap, then poll for the enlarged panel's title.
    titles = driver.execute_async_script("""
        const done = arguments[0], doc = Bokeh.documents[0];
        doc.get_model_by_name('model_view_tiles_dec_self').selected.indices = [6];  // layer 1, head 2 (4 a row)
        const titles = () => [...doc.all_models].filter(m => m.title && m.title.text !== undefined)
                                                .map(f => f.title.text);
        let n = 0;
        const poll = () => (titles().includes('layer 1, head 2') || ++n > 100) ? done(titles()) : setTimeout(poll, 20);
        poll();""")
    assert "layer 1, head 2" in titles


def test_scrolling_a_long_head_view_redraws_the_lines_of_the_new_window(driver, tmp_path):
    from workbench.charts.head_view import WINDOW_MARGIN

    cfg = presets.tiny(vocab=40)
    _, long_trace = make_model(cfg).run_with_cache(*make_batch(cfg, batch=1, src_len=60, tgt_len=60))
    _open(driver, head_view(long_trace, "cross", 0, max_height=400, min_weight=0.0), tmp_path, "long")
    run = lambda code: driver.execute_script("const doc = Bokeh.documents[0];" + code)
    yr = "[...doc.all_models].find(m => m.type == 'Range1d' && m.bounds && m.start > m.end)"
    run(f"const yr = {yr}; yr.setv({{start: 59.5, end: 42.5}});")  # scrolled to the last 17 rows
    _settle(driver)
    q, k, drawn = run("const d = doc.get_model_by_name('head_lines').data;"
                      "const p = doc.get_model_by_name('head_paths').data;"
                      "return [Array.from(d.q), Array.from(d.k), p.ys.map(y => Array.from(y))];")
    lo, hi = 42.5 - WINDOW_MARGIN * 17, 59.5 + WINDOW_MARGIN * 17
    expected = sorted((a, b) for a, b in zip(q, k) if max(a, b) >= lo and min(a, b) <= hi)
    got = sorted((int(ys[i]), int(ys[i + 1])) for ys in drawn for i in range(0, len(ys), 3))
    assert got == expected and len(expected) < len(q)
    run("const d = doc.get_model_by_name('head_paths'); window.before = d.data;"
        "window.src_before = doc.get_model_by_name('head_lines').data;")
    run(f"const yr = {yr}; yr.setv({{start: 56.5, end: 39.5}});")  # 3 rows up: still inside the drawn margin
    _settle(driver)
    assert run("return doc.get_model_by_name('head_paths').data === window.before"
               " && doc.get_model_by_name('head_lines').data === window.src_before;")
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []

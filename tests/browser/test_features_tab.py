"""The Features tab in Chromium: a dictionary shipped with the checkpoint shows the sentence's features and a
feature's dashboard; the feature id is in the URL, and a link with ?feature= opens on that feature; "Why this word"
lists the features behind a picked output token, and a feature's button opens its dashboard. Screenshots go to
$FEATURES_SHOTS when set."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import parse_qs, parse_qsl, urlparse

import torch
from test_app import TIMEOUT, open_app, submit

from workbench.corpus.data import ParallelData, load_dataset
from workbench.decoding.translator import load
from workbench.features import DictionaryConfig, SparseDictionary
from workbench.features.stats import corpus_feature_stats

TITLE_JS = """() => { const v = [...Bokeh.index.all_views()].filter(
    v => v.model.name === 'feature_output_tokens' && v.el.isConnected);
    return v.length === 1 ? v[0].model.title.text : null; }"""


def _ship_dictionary(checkpoint: Path) -> None:
    tm = load(checkpoint)
    torch.manual_seed(0)
    d = SparseDictionary(DictionaryConfig("hook_memory", tm.model.cfg.d_model, 48, k=4, model_name="demo"))
    src, tgt = load_dataset("multi30k", "valid", "de", "en", limit=40)
    stats = corpus_feature_stats(tm, d, ParallelData.encode(src, tgt, tm.src_tokenizer, tm.tgt_tokenizer), top=4,
                                 meta={"corpus": "multi30k:valid"})
    d.save(checkpoint / "features" / "hook_memory")
    stats.save(checkpoint / "features" / "hook_memory" / "stats.safetensors")


def _shot(page, name: str) -> None:
    folder = os.environ.get("FEATURES_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name), full_page=True)


def test_features_tab_dashboard_and_link(page, app_server):
    checkpoint = Path(app_server.log).parent / "demo"
    if not (checkpoint / "features" / "hook_memory" / "stats.safetensors").is_file():
        _ship_dictionary(checkpoint)
    watch = open_app(page, app_server + "?ckpt=demo")
    submit(page, "Ein Hund läuft durch den Park.")
    page.locator(".main-tabs").get_by_text("Features", exact=True).click()
    page.locator(".features-sentence").get_by_text("Hund").wait_for(timeout=TIMEOUT)
    page.wait_for_function(f"({TITLE_JS})() !== null", timeout=TIMEOUT)
    href = page.locator(".features-sentence a.feature-link").first.get_attribute("href")
    query = parse_qs(urlparse(href).query)  # a feature's link is this page on that feature (issue 37)
    assert query["ckpt"] == ["demo"] and query["src"] == ["Ein Hund läuft durch den Park."], href
    assert query["tab"] == ["features"] and query["site"] == ["hook_memory"] and query["feature"][0].isdigit(), href
    # a click on it opens that feature in this page: no reload (the page's own state survives), the URL follows
    page.evaluate("() => { window.__same_page = true; }")
    page.locator(".features-sentence a.feature-link").first.click()
    page.wait_for_function(f"() => window.location.search.includes('feature={query['feature'][0]}')",
                           timeout=TIMEOUT)
    page.get_by_text(f"feature #{query['feature'][0]}").first.wait_for(timeout=TIMEOUT)
    assert page.evaluate("() => window.__same_page === true"), "the feature link reloaded the page"
    _shot(page, "features_tab.png")
    # a feature id typed in: its dashboard, and the URL names it
    box = page.locator(".features-id input")
    box.fill("5")
    box.press("Enter")
    page.wait_for_function("() => window.location.search.includes('feature=5')", timeout=TIMEOUT)
    page.get_by_text("feature #5").wait_for(timeout=TIMEOUT)
    # search by token lists the features whose contexts fire on it
    search = page.locator(".features-search input")
    search.fill("Hund")
    search.press("Enter")
    page.locator(".features-hits").wait_for(timeout=TIMEOUT)
    # why this word: pick an output token, its features are listed; a feature's button opens its dashboard
    picker = page.locator(".features-output select")
    options = picker.locator("option")
    assert options.count() >= 2
    label = options.nth(1).inner_text()
    picker.select_option(label=label)
    head = page.locator(".features-why").get_by_text("output token 1,")
    head.wait_for(timeout=TIMEOUT)
    rows = page.locator(".features-why-row")
    assert rows.count() >= 1
    second = rows.nth(min(1, rows.count() - 1)).get_attribute("data-feature")
    page.locator(".features-why-link button").nth(min(1, rows.count() - 1)).click()
    page.wait_for_function(f"() => window.location.search.includes('feature={second}')", timeout=TIMEOUT)
    page.get_by_text(f"feature #{second}").wait_for(timeout=TIMEOUT)
    assert picker.input_value() == options.nth(1).get_attribute("value")  # the picked token stays
    _shot(page, "features_tab_why.png")
    assert page.locator(".view-error").count() == 0
    assert watch.errors == [] and watch.external == []
    # a link with ?feature= opens on that feature
    watch = open_app(page, app_server + "?ckpt=demo&feature=7&site=hook_memory")
    page.locator(".main-tabs").get_by_text("Features", exact=True).click()
    page.get_by_text("feature #7").wait_for(timeout=TIMEOUT)
    _shot(page, "features_tab_link.png")
    assert page.locator(".view-error").count() == 0
    assert watch.errors == [] and watch.external == []


def test_a_checkpoint_without_dictionaries_points_to_one_that_ships_them(page, app_server):
    """The default checkpoint ships no dictionaries: the tab says so and offers the listed checkpoints that ship
    some; the button switches as the picker does, the Features tab and the link following."""
    watch = open_app(page, app_server + "?ckpt=demo_early")
    page.locator(".main-tabs").get_by_text("Features", exact=True).click()
    page.locator(".features-note").get_by_text("No dictionaries ship with").wait_for(timeout=TIMEOUT)
    button = page.locator(".features-open-other button").first  # the same pair (de-en), the most dictionaries
    assert re.fullmatch(r"Open multi30k-de-en \(\d+ dictionaries\)", button.inner_text(timeout=TIMEOUT).strip())
    button.wait_for(timeout=TIMEOUT)
    button.click()
    page.wait_for_function("() => new URLSearchParams(location.search).get('ckpt') === 'multi30k-de-en'",
                           timeout=TIMEOUT)
    page.locator(".features-sentence").wait_for(timeout=TIMEOUT)  # its dictionary's features of the sentence
    assert new_query(page)["tab"] == "features" and page.locator(".features-note").count() == 0
    _shot(page, "features_tab_elsewhere.png")
    assert page.locator(".view-error").count() == 0
    assert watch.errors == [] and watch.external == []


def new_query(page) -> dict:
    return dict(parse_qsl(urlparse(page.url).query))

"""The Features tab without a browser: "Why this word" lists, for the picked output token, the features the library
attributes it to (`feature_attribution`), largest first; the output-token list follows the output's length; a
feature's button opens its dashboard."""

from __future__ import annotations

import sys
from pathlib import Path

import panel as pn
import pytest
import torch
from bokeh.models import Div

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint  # noqa: E402

from workbench.corpus.data import ParallelData, load_dataset  # noqa: E402
from workbench.decoding.translator import load  # noqa: E402
from workbench.features import DictionaryConfig, SparseDictionary  # noqa: E402
from workbench.features.attribution import feature_attribution  # noqa: E402
from workbench.features.stats import corpus_feature_stats  # noqa: E402
from workbench.ui import loader  # noqa: E402
from workbench.ui.features_view import WHY_TOP, FeaturesView  # noqa: E402
from workbench.ui.session import Session  # noqa: E402

SENTENCE = "Ein Hund läuft durch den Park."


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    path = build_checkpoint(root / "alpha", seed=0, steps=0)
    tm = load(path)
    torch.manual_seed(0)
    d = SparseDictionary(DictionaryConfig("hook_memory", tm.model.cfg.d_model, 48, k=4))
    src, tgt = load_dataset("multi30k", "valid", "de", "en", limit=12)
    stats = corpus_feature_stats(tm, d, ParallelData.encode(src, tgt, tm.src_tokenizer, tm.tgt_tokenizer), top=4,
                                 meta={"corpus": "multi30k:valid"})
    d.save(path / "features" / "hook_memory")
    stats.save(path / "features" / "hook_memory" / "stats.safetensors")
    return loader.discover([root], default=None)[0]


@pytest.fixture
def session(entries):
    return Session(entries, checkpoint="alpha", sentence=SENTENCE)


def _why(view) -> pn.Column:
    return next(o for o in view.content if "features-why" in o.css_classes)


def test_why_this_word_lists_the_librarys_top_features_and_a_button_opens_one(session):
    view = FeaturesView(session=session)
    view.show()
    r = session.result
    assert list(view.param.output.objects.values()) == list(range(len(r.out_pieces)))
    view.output = 2
    why = _why(view)
    picker, head, per_position, *rows = why.objects
    assert picker.value == 2 and "output token 2" in head.object
    d = SparseDictionary.load(Path(r.model.meta["path"]) / "features" / "hook_memory")
    fa = feature_attribution(r.model, d, list(r.src_ids), list(r.out_ids[:-1]), 2)
    want = fa.top(WHY_TOP)
    assert [row[0].label for row in rows] == [f"#{w['feature']}" for w in want]
    assert f"{want[0]['attribution']:+.4f} on source {want[0]['position']}" in rows[0][1].object
    assert f"together {float(fa.total.sum()):+.4f}" in head.object
    # per source token: the input x gradient of the encoder output there (features + error + bias)
    assert per_position.object.count("<span title=") == len(r.src_ids)
    assert f"title='{float(fa.by_position()[1]):+.4f}'" in per_position.object
    # a feature's button opens its dashboard
    target = want[1]["feature"]
    rows[1][0].clicks += 1
    assert view.feature == target
    dashboard = next(o.object for o in view.content if isinstance(o, pn.pane.Bokeh))
    assert any(f"feature #{target}</b>" in div.text for div in dashboard.select({"type": Div}))


def test_the_output_list_follows_the_output(session):
    view = FeaturesView(session=session)
    view.show()
    view.output = len(session.result.out_pieces) - 1
    session.target = "A dog runs through the big green park with many trees and two children"
    r = session.result
    assert list(view.param.output.objects.values()) == list(range(len(r.out_pieces)))
    assert f"output token {view.output}" in _why(view).objects[1].object
    session.sentence = "Zwei Männer spielen Fußball."
    assert view.output == 0 and "output token 0" in _why(view).objects[1].object


def test_a_links_dictionary_and_feature_are_checked(session):
    """A link's feature past the dictionary's 48 is named when the tab shows it, and the URL then holds the one
    shown; a dictionary the checkpoint lacks is named at once; a feature's link is this page on that feature."""
    from workbench.ui.link import Link

    view = FeaturesView(session=session)
    link = Link("?feature=99999&site=nowhere")
    view.bind_link(link)
    assert "site=nowhere" in link.finish()
    view.show()
    assert view.feature == 47 and "feature=99999 (the dictionary has 48 features)" in session.message
    assert "feature=47" in link.query()
    view.feature = 3  # a feature chosen later is not checked as the link's
    assert view.feature == 3 and session.message.count("feature=") == 1
    links = next(o for o in view.content if "features-sentence" in o.css_classes)
    href = links.html
    assert "href='?site=hook_memory&feature=" in href and "&fq=&fout=0&steer='" in href  # the link's other keys too
    # a plain click on a feature link (its JavaScript sets `clicked`) opens that feature here, with no reload
    links.clicked = {"feature": 7, "site": "", "n": 1}
    assert view.feature == 7 and view.site == "" and "feature=7" in link.query()  # the dictionary shown (the first)
    links.clicked = {"feature": -2, "site": "", "n": 2}  # nothing a page of ours sends: ignored
    assert view.feature == 7


def test_the_dictionary_picker_names_each_dictionary_and_switches(session, entries, tmp_path):
    """Issue 37 point 3: a picker whose labels carry the architecture, width, L0 and FVU (from the card), that sets
    the site and starts at its first feature; the page never shows a server path."""
    import json
    import shutil

    root = entries[0].path / "features"
    second = root / "enc_copy"
    shutil.copytree(root / "hook_memory", second)
    (second / "eval.json").write_text(json.dumps({"l0": 4.0, "fvu": 0.25}))
    try:
        view = FeaturesView(session=Session(entries, checkpoint="alpha", sentence=SENTENCE))
        view.show()
        picker = view._site_picker
        assert set(picker.options.values()) == {"enc_copy", "hook_memory"}
        assert picker.value == "enc_copy" and view.site == ""  # no site asked for: the first, and the picker says so
        label = next(k for k, v in picker.options.items() if v == "enc_copy")
        assert label == "enc_copy — topk 48, L0 4, FVU 0.250"
        view.feature = 5
        picker.value = "hook_memory"
        assert view.site == "hook_memory" and view.feature == 0
        page = " ".join(str(getattr(o, "object", "")) for o in view.content)
        assert str(entries[0].path) not in page
    finally:
        shutil.rmtree(second)


def test_search_covers_source_and_output_sides_of_the_shipped_dictionaries():
    """Issue 37 point 3: "Hund" finds the encoder-side features that fire on it, "dog" decoder-side ones."""
    from workbench.ui.features_view import search_all, sites_of

    tm = load(Path(__file__).resolve().parents[2] / "checkpoints" / "multi30k-de-en")
    dirs = {p.name: p for p in sites_of(tm)}
    hund, dog = search_all(tm, dirs, "Hund"), search_all(tm, dirs, "dog")
    assert hund and {h["side"] for h in hund} == {"src"} and hund[0]["matches"] == hund[0]["of"]
    assert dog and {h["side"] for h in dog} == {"tgt"}


def test_a_typed_feature_past_the_end_is_said_and_shown_as_the_last(session):
    view = FeaturesView(session=session)
    view.show()
    view.feature = 99999
    assert view.feature == 47 and view._feature_box.value == 47
    assert "Feature 99999 does not exist" in session.message and "0–47" in session.message
    view._feature_box.value = -5  # typed in the box: refused aloud, the box shows the feature shown
    assert view.feature == 47 and view._feature_box.value == 47
    assert "Feature -5 does not exist: feature numbers start at 0; showing 47." in session.message
    assert "Feature 99999" not in session.message  # the newest refusal replaces the last one: no pile of them


def test_steering_shows_the_steered_translation_beside_the_plain_one(session):
    """Issue 36 point 6: a value for the shown feature gives the sentence translated with it steered (the library's
    `translate(steer=...)` with the dictionary spliced in), beside the plain translation; the value is in the URL."""
    from workbench.features import splice
    from workbench.ui.link import Link

    view = FeaturesView(session=session)
    link = Link("?feature=5&steer=%2B40")
    view.bind_link(link)
    link.finish()
    view.show()
    r = session.result
    pane = next(o for o in view.content if "features-steer" in str(getattr(o, "object", "")))
    d = SparseDictionary.load(Path(r.model.meta["path"]) / "features" / "hook_memory")
    with splice(r.model.model, d):
        steered = r.model.translate([SENTENCE], beam=r.request.beam, steer={"hook_memory": {5: "+40"}})[0]
    assert "Steering feature #5</b> (+40 added on every word)" in pane.object
    assert f"features-steer-plain'>{r.text}<" in pane.object and f"features-steer-steered'>{steered}" in pane.object
    assert "steer=%2B40" in link.query() and r.model.model.hook_memory._modules.get("sae") is None
    view.steer = "=-2"
    assert "held at -2" in next(o for o in view.content if "features-steer" in str(getattr(o, "object", ""))).object
    with pytest.raises(ValueError):
        view.steer = "<b>5</b>"
    view.steer = ""
    assert not any("features-steer'" in str(getattr(o, "object", "")) for o in view.content)


def test_another_checkpoints_dictionary_gives_way_and_the_picker_follows(entries, tmp_path):
    """Issue 37 point 2: after a switch to a checkpoint that lacks the chosen dictionary, the tab shows that
    checkpoint's own (here none) and `site` says so (''), so the URL never names a dictionary a link to the page
    would refuse; the picker no longer lists the old checkpoint's dictionaries."""
    build_checkpoint(tmp_path / "beta", seed=1, steps=0)
    both = loader.discover([entries[0].path.parent, tmp_path], default=None)[0]
    session = Session(both, checkpoint="alpha", sentence=SENTENCE)
    view = FeaturesView(session=session)
    view.site = "hook_memory"
    view.show()
    assert view._site_picker.value == "hook_memory"
    session.checkpoint = "beta"
    view.show()
    assert view.site == "" and view._site_picker.options == {}
    assert "No dictionaries ship with this checkpoint" in " ".join(str(getattr(o, "object", "")) for o in view.content)
    # and it points to the listed checkpoint that ships some: one button, which switches as the picker does
    buttons = [b for row in view.content if isinstance(row, pn.Row) for b in row if isinstance(b, pn.widgets.Button)]
    assert [b.name for b in buttons] == ["Open alpha (1 dictionary)"]
    buttons[0].clicks += 1
    assert session.checkpoint == "alpha"
    view.show()
    assert view.site == "" and view._site_picker.value == "hook_memory"  # the first: what '' means
    assert not [b for row in view.content if isinstance(row, pn.Row) for b in row
                if isinstance(b, pn.widgets.Button) and b.name.startswith("Open ")]


def test_the_tab_shows_the_dictionarys_card_beside_its_baselines_and_seeds(session, entries):
    """Issue 38 point 2: the Features tab shows the card's figures (FVU, L0, ΔCE, KL, CE recovered against zero and
    mean ablation, dead and dense shares with their token counts) beside PCA and the random dictionary, and the
    spread over seeds; a dictionary without a card shows none."""
    import json

    from workbench.ui.features_view import card_markdown

    path = entries[0].path / "features" / "hook_memory"
    figures = {"fvu": 0.1, "l0": 4.0, "delta_ce": 0.02, "kl": 0.03, "ce_recovered": 0.9, "ce_recovered_mean": 0.8,
               "dead_frac": 0.01, "dense_frac": 0.0}
    spread = {k: {"mean": v, "sd": 0.001, "min": v, "max": v} for k, v in figures.items()}
    card = figures | {"split": "multi30k:valid", "tokens": 1234, "density_tokens": 5678,
                      "density_split": "multi30k:train[:99]",
                      "baselines": {"pca": figures | {"fvu": 0.5, "counted_tokens": 1234, "dense_frac": 1.0}},
                      "seeds": {"count": 3, "values": [0, 1, 2], "spread": spread}}
    assert card_markdown(path) is None  # no eval.json
    (path / "eval.json").write_text(json.dumps(card))
    try:
        text = card_markdown(path)
        own = "| this dictionary | 0.1000 | 4.0 | +0.0200 | 0.0300 | 90.0% | 80.0% | 1.0% | 0.0% (5,678 tokens) |"
        assert own in text and "multi30k:valid (1,234 tokens)" in text
        assert "| PCA, L0 components | 0.5000 |" in text and "100.0% (1,234 tokens)" in text
        assert "mean ± s.d. over 3 seeds" in text and "| CE recovered vs mean | 80.0% |" in text
        view = FeaturesView(session=Session(entries, checkpoint="alpha", sentence=SENTENCE))
        view.show()
        (box,) = [o for o in view.content if "features-card" in o.css_classes]
        assert box.collapsed and box.objects[0].object == text
    finally:
        (path / "eval.json").unlink()

"""The app's store and views without a browser (Panel's pytest approach): set params, assert derived state."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import sys
import threading
from pathlib import Path

import numpy as np
import panel as pn
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint, corrupt_checkpoint  # noqa: E402

from workbench.core.interventions import ablate_heads  # noqa: E402
from workbench.ui import loader  # noqa: E402
from workbench.ui.session import Session  # noqa: E402
from workbench.ui.work import Request, compute  # noqa: E402

SENTENCE = "Ein Hund läuft durch den Park."


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ckpts")
    build_checkpoint(root / "alpha", seed=0, steps=0)
    build_checkpoint(root / "beta", seed=1, steps=0)
    corrupt_checkpoint(root / "broken")
    return root


@pytest.fixture(scope="module")
def entries(ckpt_dir):
    found, problems = loader.discover([ckpt_dir], default=None)
    assert problems == []
    return found


@pytest.fixture
def session(entries):
    return Session(entries, checkpoint="alpha", sentence=SENTENCE)


def test_discovery_lists_checkpoints_and_reports_missing_directories(ckpt_dir, tmp_path):
    found, problems = loader.discover([ckpt_dir, tmp_path / "nowhere"], default=None)
    assert [e.label for e in found] == ["alpha", "beta", "broken"]
    assert problems == [f"checkpoint directory {tmp_path / 'nowhere'} does not exist"]
    assert loader.parse_args(["--checkpoints", "a", "b", "--other"]) == [Path("a"), Path("b")]


def test_paths_come_only_from_the_list(entries):
    with pytest.raises(ValueError, match="not in the list"):
        Session(entries, checkpoint="/etc")
    s = Session(entries, checkpoint="alpha")
    with pytest.raises(ValueError):
        s.checkpoint = "/tmp"  # a Selector: only listed labels


def test_opens_on_a_translation_with_cross_attention(session):
    r = session.result
    assert session.message == "" and session.version == 1
    assert r is not None and r.trace.layers("cross") == 2
    probs = r.trace.attention("cross", 0)
    assert probs.shape[-2:] == (len(r.out_pieces), len(r.src_pieces))
    assert probs.dtype == torch.float16  # compact per-session storage


def test_store_agrees_with_the_translation_api(session):
    tm = session.translation_model()
    for beam in (1, 3):
        session.beam = beam
        api = tm.translate([SENTENCE], beam=beam, n_best=1, alpha=session.alpha, return_scores=True)[0]
        assert session.result.text == api.text
        assert session.result.log_prob == pytest.approx(api.log_prob, abs=1e-4)


def test_teacher_forcing_scores_what_greedy_produced(session):
    """Two paths: greedy's own log-probability vs teacher-forcing its output through the store."""
    greedy = session.result
    tm = session.translation_model()
    forced_text = "A dog runs through the park."
    session.target = forced_text
    r = session.result
    assert r.forced and list(r.out_ids) == tm.tgt_tokenizer.encode(forced_text) + [tm.model.cfg.eos_id]
    again = compute(Request(greedy.request.path, SENTENCE, target_ids=greedy.out_ids)).result
    assert again.forced and again.log_prob == pytest.approx(greedy.log_prob, abs=1e-3)


def test_ablation_changes_log_prob_and_matches_a_direct_intervention(session):
    base = session.result
    session.ablate = ["cross:0:1", "enc_self:1:0"]
    a = session.ablation
    assert a is not None and a.heads == (("cross", 0, 1), ("enc_self", 1, 0))
    tm = session.translation_model()
    src = torch.tensor([tm.encode_source(SENTENCE)[0]])
    tgt_in = torch.tensor([[tm.model.cfg.start_id, *base.out_ids[:-1]]])
    with tm.model.intervene(ablate_heads({("cross", 0): [1], ("enc_self", 1): [0]})), torch.no_grad():
        logits = tm.model(src, tgt_in)
    lp = torch.log_softmax(logits[0], -1)[torch.arange(len(base.out_ids)), torch.tensor(base.out_ids)].sum()
    assert a.original_log_prob == pytest.approx(float(lp), abs=1e-4)
    assert a.delta == pytest.approx(float(lp) - base.log_prob, abs=1e-4) and abs(a.delta) > 1e-4
    assert session.result is base  # the translation itself is reused, not recomputed
    session.reset_ablation()
    assert session.ablation is None and session.ablate == []


def test_toggle_head_uses_the_selection(session):
    session.param.update(kind="dec_self", layer=1, head=2)
    session.toggle_head()
    assert session.ablate == ["dec_self:1:2"]
    session.toggle_head()
    assert session.ablate == []
    session.head = -1
    session.toggle_head()
    assert "Pick one head" in session.message and session.ablate == [] and session.error == ""


def test_sessions_do_not_share_ablations_across_threads(entries):
    """Ablated and plain requests at once in worker threads give exactly what each gives alone."""
    path = str(entries[0].path)
    plain, ablated = Request(path, SENTENCE), Request(path, SENTENCE, ablate=(("cross", 1, 0), ("cross", 1, 1)))
    alone = {plain: compute(plain), ablated: compute(ablated)}
    results: dict = {}

    def run(req, i):
        results[(req, i)] = compute(req)

    threads = [threading.Thread(target=run, args=(req, i)) for i in range(2) for req in (plain, ablated)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (req, _), out in results.items():
        assert out.result.log_prob == alone[req].result.log_prob
        assert (out.ablation is None) == (req is plain)
        if out.ablation:
            assert out.ablation.original_log_prob == alone[req].ablation.original_log_prob


def test_the_selection_offers_only_what_the_model_and_sentence_have(session):
    r = session.result
    assert list(session.param.layer.objects) == [0, 1] and list(session.param.head.objects) == [-1, 0, 1, 2, 3]
    assert list(session.param.token.objects) == list(range(-1, len(r.out_pieces)))
    assert session.param.head.names["head 2"] == 2 and session.param.head.names["all (mean)"] == -1
    with pytest.raises(ValueError):
        session.head = 99  # refused, not clamped later
    session.param.update(layer=1, head=3, token=len(r.out_pieces) - 1)
    session.sentence = "Hallo."  # fewer tokens: the token falls back to none
    assert session.token < session.query_count() and (session.layer, session.head) == (1, 3)
    session.kind = "enc_self"
    assert list(session.param.token.objects) == list(range(-1, len(session.result.src_pieces)))


@pytest.mark.parametrize("text, expect", [
    ("", "Type a sentence"),
    ("   \n ", "Type a sentence"),
    ("x" * 5001, "only the first 5,000"),
    ("Hund " * 300, "truncated to"),
])
def test_bad_input_gives_a_message(session, text, expect):
    session.sentence = text
    assert expect in session.message
    assert bool(session.error) == (expect == "Type a sentence")  # an error, or a note beside a result
    session.sentence = SENTENCE
    assert session.message == "" and session.result is not None


UNUSUAL = ["Ein Hund 🐕 läuft 🎉", "كلب يجري في الحديقة", "一只狗在公园里跑。", "Ein\x00Hund\x07\x1b[31m läuft\u202e"]


@pytest.mark.parametrize("text", UNUSUAL)
def test_unusual_text_is_translated(session, text):
    session.sentence = text
    assert session.result is not None and session.result.request.sentence == text
    assert session.error == ""


def test_corrupt_checkpoint_is_a_message_and_the_session_recovers(session):
    session.checkpoint = "broken"
    assert session.error.startswith("Cannot load this checkpoint") and session.result is None
    session.checkpoint = "beta"
    assert session.message == "" and session.result is not None


def test_no_checkpoints_is_a_message(tmp_path):
    entries, problems = loader.discover([tmp_path / "missing"], default=None)
    s = Session(entries, problems=problems)
    assert s.result is None and "No workbench checkpoint found" in s.error and "missing" in s.error


def test_a_stale_result_is_dropped(entries):
    """Background mode: the second request supersedes the first; only the last sentence's result lands."""
    async def main():
        s = Session(entries, checkpoint="alpha", sentence=SENTENCE, autorun=False, background=True)
        s.autorun = True
        s.sentence = "Erster Satz."
        s.sentence = "Zweiter Satz, der zählt."
        while s.busy or s.result is None:
            await asyncio.sleep(0.01)
        return s

    # a thread of its own: pytest-playwright's sync API may leave an event loop running in this one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        s = pool.submit(asyncio.run, main()).result(timeout=120)
    assert s.result.request.sentence == "Zweiter Satz, der zählt." and s.version == 1


# -- views, headless ----------------------------------------------------------------------------


def test_attention_view_draws_every_kind_and_mode(session):
    from workbench.ui.views import AttentionView

    view = AttentionView(session=session)
    view.__panel__()  # its widgets and the export button's name follow the session
    for kind in ("enc_self", "dec_self", "cross"):
        for mode in ("heatmap", "lines", "grid"):
            session.param.update(kind=kind, view=mode)
            assert view.figure is not None, (kind, mode)
    session.param.update(kind="cross", view="heatmap", layer=1, head=2)
    assert view.figure.title.text.startswith("cross-attention, layer 1, head 2")
    html = view.export_html().getvalue()  # a fresh figure of the same view, self-contained
    assert "cross-attention, layer 1, head 2" in html and "<script src" not in html
    assert view.export_name() == "alpha_heatmap_cross-L1-H2.html"
    assert "Sentence: Ein Hund l" in html and "Checkpoint: alpha" in html  # the caption (JSON-escaped text)
    session.param.update(view="grid", kind="enc_self")
    assert view.export_name() == "alpha_grid_enc_self-Lall-Hall.html"


def test_workbench_assembles_for_notebooks(ckpt_dir):
    from workbench.ui import Workbench

    wb = Workbench(ckpt_dir / "beta", checkpoints=[ckpt_dir], default_dir=None)
    assert wb.session.checkpoint == "beta" and wb.session.result is not None
    assert wb.session.background is False  # no server: inline
    wb.__panel__()
    wb.compare.show()
    assert _figures(wb.compare.content) == 3 and not _alerts(wb.compare.content)  # A, B, B - A
    wb.internals.show()  # positional encodings, masks, LR formula vs log, curves: all drawn, none failed
    headings = " ".join(o.object for o in wb.internals.content if isinstance(o, pn.pane.Markdown))
    headings = re.sub(r"<[^>]+>", "", headings)  # the text a reader sees (terms of art are glossary links)
    for part in ("Positional encodings", "Masks", "Learning-rate schedule", "validation curves"):
        assert part in headings
    assert _figures(wb.internals.content) >= 2 and not _alerts(wb.internals.content)
    assert "noam: warm-up 30 steps" in headings  # read from the checkpoint's stored train_config
    wb.analysis.show()
    for analysis in ("head statistics", "decoder rollout"):
        wb.analysis.analysis = analysis
        assert _figures(wb.analysis.content) == 1 and not _alerts(wb.analysis.content), analysis


def _alerts(objects) -> list:
    return [a for o in objects for a in pn.Column(o).select(pn.pane.Alert)]


def _figures(objects) -> int:
    return sum(len(pn.Column(o).select(pn.pane.Bokeh)) for o in objects)


def test_the_example_sentence_follows_the_checkpoints_source_language(entries, tmp_path):
    import json

    from workbench.ui.session import EXAMPLES

    english = tmp_path / "english"
    import shutil

    shutil.copytree(entries[0].path, english)
    meta = json.loads((english / "meta.json").read_text())
    (english / "meta.json").write_text(json.dumps(meta | {"src_lang": "en", "tgt_lang": "de"}))
    both = [loader.Entry("english", english), entries[0]]
    s = Session(both, checkpoint="english", autorun=False)
    assert s.sentence == EXAMPLES["en"]
    s.autorun = True
    s.checkpoint = entries[0].label  # German source: the example follows, and the result is for it
    assert s.sentence == EXAMPLES["de"] and s.result.request.sentence == EXAMPLES["de"]
    s.sentence = "Ein Hund."
    s.checkpoint = "english"  # a typed sentence is the user's: never replaced
    assert s.sentence == "Ein Hund."
    assert Session(both, checkpoint="english", sentence="Hallo", autorun=False).sentence == "Hallo"


def test_the_length_penalty_starts_at_the_checkpoints_own_default(entries, tmp_path):
    import json
    import shutil

    tuned = tmp_path / "tuned"
    shutil.copytree(entries[0].path, tuned)
    meta = json.loads((tuned / "meta.json").read_text())
    generation = {"append_eos": True, "length_penalty": {"alpha": 1.6, "kind": "average"}}  # as ship_checkpoint
    (tuned / "meta.json").write_text(json.dumps(meta | {"generation": generation}))
    both = [loader.Entry("tuned", tuned), entries[0]]
    s = Session(both, checkpoint="tuned", autorun=False)
    assert s.alpha == pytest.approx(1.6)
    s.autorun = True
    s.checkpoint = entries[0].label  # names no alpha: back to 1.0, and the result used it
    assert s.alpha == 1.0 and s.result.request.alpha == 1.0
    s.alpha = 0.4
    s.checkpoint = "tuned"  # a value the user chose is kept
    assert s.alpha == pytest.approx(0.4)
    assert Session(both, checkpoint="tuned", alpha=0.7, autorun=False).alpha == pytest.approx(0.7)
    (tuned / "meta.json").write_text(json.dumps(meta | {"generation": {"alpha": 9.0}}))
    assert Session(both, checkpoint="tuned", autorun=False).alpha == 2.0  # clipped to the slider's range
    (tuned / "meta.json").write_text(json.dumps(meta | {"generation": {"length_penalty": {"alpha": "x"}}}))
    assert Session(both, checkpoint="tuned", autorun=False).alpha == 1.0  # malformed: the plain default


def test_served_model_work_runs_off_the_event_loop_under_the_callers_hooks(entries):
    """Background mode: while the model sits in a hook, the event loop keeps running; the hook (entered around
    the change, in the caller's context) is seen by the worker thread, so call-scoped interventions apply."""
    started, release = threading.Event(), threading.Event()

    def hook(x, point):
        started.set()
        assert release.wait(60), "the event loop never got to release the model"

    async def main():
        s = Session(entries, checkpoint="alpha", sentence=SENTENCE, autorun=False, background=True)
        s.autorun = True
        with s.translation_model().model.hooks({"hook_src_embed": hook}):
            s.sentence = "Ein anderer Satz."
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, started.wait, 60), "the hook never ran in the worker"
            assert s.busy and s.result is None  # the loop is free while the model works
            release.set()
            while s.busy:
                await asyncio.sleep(0.01)
        return s

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        s = pool.submit(asyncio.run, main()).result(timeout=120)
    assert s.result.request.sentence == "Ein anderer Satz." and s.error == ""


def test_compare_defaults_to_a_checkpoint_of_the_same_languages_and_run(tmp_path):
    root = tmp_path / "ckpts"
    build_checkpoint(root / "final", steps=0, run="runs/a", step=500)
    build_checkpoint(root / "early", steps=0, seed=1, run="runs/a", step=50)
    build_checkpoint(root / "stranger", steps=0, seed=2, run="runs/b", step=500)
    build_checkpoint(root / "reverse", steps=0, seed=3, langs=("en", "de"))
    entries, _ = loader.discover([root], default=None)
    assert loader.partner(entries, "final")[0].label == "early"  # same run: the early snapshot
    assert loader.partner(entries, "early")[0].label == "final"
    assert loader.partner(entries, "stranger")[0].label in ("early", "final")  # same languages, another run
    none, why = loader.partner(entries, "reverse")
    assert none is None and why == "no other listed checkpoint translates en→de"

    from workbench.ui.views import CompareView

    view = CompareView(session=Session(entries, checkpoint="reverse", sentence="A dog runs."))
    assert view.other is None
    view.show()
    assert "no other listed checkpoint translates en→de" in view.content[0].object
    view.session.checkpoint = "final"
    assert view.other == "early" and "same run" in view.content[0].object


def test_a_served_page_loads_its_first_model_off_the_event_loop(ckpt_dir, monkeypatch):
    """A served page built from the discovered list: the (deliberately slow) first model load runs in a worker
    while the event loop stays free and the page shows busy; the translation follows once it is loaded."""
    from workbench.ui import Workbench

    real, loop_thread, threads = loader.load_model, [], []
    started, release = threading.Event(), threading.Event()

    def slow_load(path):
        threads.append(threading.current_thread())
        if threading.current_thread() is not loop_thread[0]:  # on the loop it would hang the test: recorded instead
            started.set()
            assert release.wait(60), "the event loop never got to release the load"
        return real(path)

    monkeypatch.setattr(loader, "load_model", slow_load)
    monkeypatch.setattr(loader, "DEFAULT_DIR", ckpt_dir)  # no DEFAULT marker there: the first listed is the default

    async def main():
        loop_thread.append(threading.current_thread())
        wb = Workbench(checkpoints=[ckpt_dir], default_dir=None, background=True)
        s = wb.session
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, started.wait, 60), "the model was never loaded in a worker"
        assert s.busy and s.result is None  # the page is built and waiting; the loop is free
        release.set()
        while s.busy or s.result is None:
            await asyncio.sleep(0.01)
        return s

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        s = pool.submit(asyncio.run, main()).result(timeout=120)
    assert loop_thread[0] not in threads and threads
    assert s.checkpoint == "alpha" and s.error == "" and s.result.text


def test_another_head_changes_the_shown_heatmap_in_place_and_a_new_sentence_draws_anew(session):
    """A head, layer or token pick keeps the heatmap (its image, title, colour range and highlighted row change: one
    data source for the page to update, not a new plot) with exactly a new figure's values; anything else in the
    layout (the words toggle, another kind, a new sentence) draws a new figure."""
    from workbench.charts.heatmap import HIGHLIGHT_NAME, IMAGE_NAME
    from workbench.ui.views import AttentionView

    def image(fig):
        glyph = fig.select_one({"name": IMAGE_NAME})
        return np.asarray(glyph.data_source.data["image"][0]), glyph.glyph.color_mapper.high

    view = AttentionView(session=session)
    view._redraw()
    shown = view.figure
    for layer, head, token in ((0, 1, -1), (1, 0, 2), (1, -1, 0), (0, 0, -1)):
        session.layer, session.head, session.token = layer, head, token
        view._redraw()
        fresh = view.build(session.result)
        assert view.figure is shown and shown.title.text == fresh.title.text
        values, high = image(shown)
        assert np.array_equal(values, image(fresh)[0], equal_nan=True) and high == image(fresh)[1]
        mark = lambda fig: dict(fig.select_one({"name": HIGHLIGHT_NAME}).data_source.data)  # noqa: E731
        assert mark(shown) == mark(fresh) and len(mark(shown)["top"]) == (token >= 0)
    session.words = True
    view._redraw()
    assert view.figure is not shown
    shown = view.figure
    session.sentence = "Zwei Hunde spielen im Park ."
    view._redraw()
    assert view.figure is not shown and view.figure.title.text == view.build(session.result).title.text


def test_switching_from_the_grid_or_the_lines_to_the_heatmap_draws_a_new_heatmap(session):
    """The shown figure may be a layout of many figures (grid, head view): the heatmap is then drawn anew."""
    from workbench.ui.views import AttentionView

    view = AttentionView(session=session)
    for other in ("grid", "lines"):
        session.view = other
        view._redraw()
        before = view.figure
        session.view = "heatmap"
        view._redraw()
        assert view.figure is not before and view.figure.title.text == view.build(session.result).title.text

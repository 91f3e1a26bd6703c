"""The app's store and views without a browser (Panel's pytest approach): set params, assert derived state."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint, corrupt_checkpoint  # noqa: E402

from workbench.interventions import ablate_heads  # noqa: E402
from workbench.ui import loader  # noqa: E402
from workbench.ui.session import Request, Session, compute  # noqa: E402

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
    tm = session.model
    for beam in (1, 3):
        session.beam = beam
        api = tm.translate([SENTENCE], beam=beam, n_best=1, alpha=session.alpha, return_scores=True)[0]
        assert session.result.text == api.text
        assert session.result.log_prob == pytest.approx(api.log_prob, abs=1e-4)


def test_teacher_forcing_scores_what_greedy_produced(session):
    """Two paths: greedy's own log-probability vs teacher-forcing its output through the store."""
    greedy = session.result
    tm = session.model
    forced_text = "A dog runs through the park."
    session.target = forced_text
    r = session.result
    assert r.forced and list(r.out_ids) == tm.tgt_tokenizer.encode(forced_text) + [tm.model.cfg.eos_id]
    from workbench.ui.session import _forced

    src = torch.tensor([tm.encode_source(SENTENCE)[0]])
    lp, _ = _forced(tm, src, list(greedy.out_ids))
    assert lp == pytest.approx(greedy.log_prob, abs=1e-3)


def test_ablation_changes_log_prob_and_matches_a_direct_intervention(session):
    base = session.result
    session.ablate = ["cross:0:1", "enc_self:1:0"]
    a = session.ablation
    assert a is not None and a.heads == (("cross", 0, 1), ("enc_self", 1, 0))
    tm = session.model
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
    assert "Pick one head" in session.message and session.ablate == []


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


def test_selection_is_clamped_to_the_model(session):
    session.param.update(layer=1, head=3, token=2)
    session.head = 99
    session.sentence = "Hallo."
    assert session.head == -1 or session.head < 4
    assert session.token < session.query_count()


@pytest.mark.parametrize("text, expect", [
    ("", "Type a sentence"),
    ("   \n ", "Type a sentence"),
    ("x" * 5001, "only the first 5,000"),
    ("Hund " * 300, "cut to the model's limit"),
])
def test_bad_input_gives_a_message(session, text, expect):
    session.sentence = text
    assert expect in session.message
    session.sentence = SENTENCE
    assert session.message == "" and session.result is not None


UNUSUAL = ["Ein Hund 🐕 läuft 🎉", "كلب يجري في الحديقة", "一只狗在公园里跑。", "Ein\x00Hund\x07\x1b[31m läuft\u202e"]


@pytest.mark.parametrize("text", UNUSUAL)
def test_unusual_text_is_translated(session, text):
    session.sentence = text
    assert session.result is not None and session.result.request.sentence == text
    assert not session.message.startswith(("Cannot", "The model"))


def test_corrupt_checkpoint_is_a_message_and_the_session_recovers(session):
    session.checkpoint = "broken"
    assert session.message.startswith("Cannot load this checkpoint") and session.result is None
    session.checkpoint = "beta"
    assert session.message == "" and session.result is not None


def test_no_checkpoints_is_a_message(tmp_path):
    entries, problems = loader.discover([tmp_path / "missing"], default=None)
    s = Session(entries, problems=problems)
    assert s.result is None and "No workbench checkpoint found" in s.message and "missing" in s.message


def test_a_stale_result_is_dropped(entries):
    """Background mode: the second request supersedes the first; only the last sentence's result lands."""
    async def main():
        s = Session(entries, checkpoint="alpha", sentence=SENTENCE, autorun=False, background=True)
        s._autorun = True
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
    for kind in ("enc_self", "dec_self", "cross"):
        for mode in ("heatmap", "lines", "grid"):
            session.param.update(kind=kind, view=mode)
            assert view.figure is not None, (kind, mode)
    session.param.update(kind="cross", view="heatmap", layer=1, head=2)
    assert view.figure.title.text.startswith("cross-attention, layer 1, head 2")
    assert view._head.value == 2 and view._layer.value == 1


def test_workbench_assembles_for_notebooks(ckpt_dir):
    from workbench.ui import Workbench

    wb = Workbench(ckpt_dir / "beta", default_dir=None)
    assert wb.session.checkpoint == "beta" and wb.session.result is not None
    assert wb.session.background is False  # no server: inline
    wb.__panel__()
    wb.compare.show()
    assert wb.compare._box.objects and not _alerts(wb.compare._box)
    wb.internals.show()  # positional encodings, masks, LR formula vs log, curves: all drawn, none failed
    assert len(wb.internals._box.objects) == 9 and not _alerts(wb.internals._box)
    assert wb.internals.warmup == 30  # read from the checkpoint's meta["train"]
    wb.analysis.show()
    for analysis in ("head statistics", "decoder rollout"):
        wb.analysis.analysis = analysis
        assert len(wb.analysis._box.objects) == 1 and not _alerts(wb.analysis._box), analysis


def _alerts(layout) -> list:
    import panel as pn

    return [o for o in layout.select(pn.pane.Alert)]


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
    s._autorun = True
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
    s._autorun = True
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

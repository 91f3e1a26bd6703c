"""The Why tab without a browser: attribution of the picked token sums to its logit (grid and bars agree with the
library), patching runs once per (sentence, changed source), starts with the estimate on long outputs, reports
progress and stops; the token picker follows the output length; a new sentence resets the changed source."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import numpy as np
import panel as pn
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_requests import on_loop, until  # noqa: E402

from workbench.analysis.attribution.decompose import direct_logit_attribution  # noqa: E402
from workbench.analysis.circuits.patching import log_prob, patching_sweep  # noqa: E402
from workbench.ui import Workbench, why_view, workers  # noqa: E402
from workbench.ui.session import Session  # noqa: E402
from workbench.ui.why_view import TAB, WhyView, explain_token, patch  # noqa: E402

SENTENCE = "Ein Hund läuft durch den Park."


@pytest.fixture
def session(entries):
    return Session(entries, checkpoint="alpha", sentence=SENTENCE)


def _note(view) -> str:
    return next(o.object for o in view.content if "why-patching-note" in o.css_classes)


def _swapped(session) -> str:
    """The sentence with its first two pieces swapped: the same token count (skips if the tokenizer re-splits)."""
    tm = session.model
    ids, _ = tm.encode_source(SENTENCE)
    swapped = tm.src_tokenizer.decode([ids[1], *ids[:1], *ids[2:-1]])
    if tm.encode_source(swapped)[0] == ids or len(tm.encode_source(swapped)[0]) != len(ids):
        pytest.skip("this tokenizer re-splits the swapped text")
    return swapped


def test_attribution_grid_and_bars_sum_to_the_picked_tokens_logit(session):
    r = session.result
    answer = explain_token(r, 2)
    tm = session.model
    tgt = torch.tensor([[tm.model.cfg.start_id, *r.out_ids[:-1]]])
    with torch.no_grad():
        logit = tm.model(torch.tensor([list(r.src_ids)]), tgt)[0, 2, r.out_ids[2]]
    dla = answer["dla"]
    assert float(dla.values.sum()) == pytest.approx(float(logit), abs=1e-3)
    again = direct_logit_attribution(tm.model, torch.tensor([list(r.src_ids)]), tgt, 2, r.out_ids[2])
    assert torch.allclose(dla.values, again.values)
    grid = answer["grid"]
    cross = grid.select_one({"name": "dla_grid_cross-attention"})
    image = cross.renderers[0].data_source.data["image"][0]  # (layers, heads), drawn as stored
    want = np.array([[float(v) for lab, v in zip(dla.labels, dla.values) if lab == f"cross:{i}:{h}"]
                     for i in range(2) for h in range(4)]).reshape(2, 4)
    assert np.allclose(image, want)
    bars = grid.select_one({"name": "dla_bars"}).renderers[0].data_source.data
    assert sum(bars["value"]) == pytest.approx(float(logit), abs=1e-3)  # top-k, the rest summed, the heads' sum
    sizes = [abs(v) for v in bars["value"][:-1]]
    assert sizes == sorted(sizes, reverse=True)  # largest first (the last bar is the rest)


def test_patching_runs_once_per_sentence_and_changed_source(session, monkeypatch):
    calls = []
    monkeypatch.setattr(why_view, "patch", lambda *a, **k: calls.append(a[1]) or patch(*a, **k))
    view = WhyView(session=session)
    view.show()
    assert len(calls) == 1 and calls[0] is None  # prefilled for this sentence
    for position in (1, 2, 0):
        view.position = position  # a token tap redraws attribution only
    assert len(calls) == 1
    view.corrupted = "Ein Hund läuft durch den großen Park mit Bäumen."
    assert "tokens and the original" in _note(view) and len(calls) == 2
    swapped = _swapped(session)
    view.corrupted = swapped
    assert "log p of the output" in _note(view) and len(calls) == 3
    maps = [o for o in view.content if isinstance(o, pn.pane.Bokeh) and o.object.name == "why_patching_map"]
    titles = [m.object.title.text for m in maps]
    assert len(maps) == 3 and "encoder stream" in titles[0] and "encoder self-attention heads" in titles[1]
    assert "decoder heads" in titles[2] and maps[2].object.xaxis[0].axis_label == "query: output token produced"
    view.position = 1
    view.corrupted = "Ein Hund läuft durch den großen Park mit Bäumen."
    view.corrupted = swapped  # both are answers it has: cached
    assert len(calls) == 3


def test_the_exact_sweeps_effect_is_centred_on_no_effect(session):
    """Two ways: the view's effect map against the library's sweep, normalised by hand."""
    r = session.result
    swapped = _swapped(session)
    p = patch(r, swapped, exact=True)
    tm = session.model
    src = torch.tensor([list(r.src_ids)])
    tgt = torch.tensor([[tm.model.cfg.start_id, *r.out_ids[:-1]]])
    c_src = torch.tensor([tm.encode_source(swapped)[0]])
    sweep = patching_sweep(tm.model, src, tgt, corrupted_src=c_src, sites="resid_enc", metric=log_prob(list(r.out_ids)))
    by_hand = (sweep.clean_metric - sweep.values.numpy()) / (sweep.clean_metric - sweep.corrupted_metric)
    assert p.exact and np.allclose(p.maps[0][1], by_hand, equal_nan=True)
    # the embeddings of the unchanged tokens (all but the two swapped) are the same in both runs: no effect, 0
    assert np.allclose(p.maps[0][1][0, 2:], 0.0, atol=1e-9) and np.abs(p.maps[0][1][0, :2]).max() > 1e-3
    fig = why_view.patching_heatmap(p.maps[0][1], p.maps[0][2], p.maps[0][3])
    mapper = fig.renderers[0].glyph.color_mapper
    assert mapper.low == -mapper.high  # white = no effect


def test_long_outputs_start_with_the_estimate_and_offer_the_exact_sweep(session, monkeypatch):
    monkeypatch.setattr(why_view, "EXACT_AT_ONCE", 0)
    view = WhyView(session=session)
    view.show()
    view.corrupted = _swapped(session)
    assert "attribution patching" in _note(view) and view._exact.visible
    assert 'href="#glossary-attribution-patching"' in _note(view)  # its method's term opens the glossary
    view.refresh_patching(exact=True)
    assert "exact sweep" in _note(view) and not view._exact.visible
    assert 'href="#glossary-activation-patching"' in _note(view)


def test_the_token_picker_follows_the_output_and_a_new_sentence_resets_the_changed_source(session):
    view = WhyView(session=session)
    view.show()
    assert isinstance(view._picker.objects[0], pn.widgets.RadioButtonGroup)
    first = view.corrupted = "Ein Hund läuft durch den großen Park mit Bäumen."  # the user's edit
    assert "tokens and the original" in _note(view)
    view.position = 2
    session.target = " ".join(["A dog runs through the big green park"] * 4)  # a long (teacher-forced) output
    assert len(session.result.out_pieces) > why_view.MAX_BUTTONS
    assert isinstance(view._picker.objects[0], pn.widgets.Select)
    session.target = ""
    session.sentence = "Zwei Männer spielen Fußball im Park."
    assert view.position == 0 and view.corrupted != first
    assert "tokens and the original" not in _note(view)  # the new sentence's own changed source


def test_the_tab_joins_through_the_constructor(session):
    wb = Workbench(session.entry.path, default_dir=None, extra_tabs=[TAB])
    assert [t for t, _ in wb.tabs][-1] == "Why"


def test_served_progress_arrives_on_the_loop_and_stop_ends_the_sweep(entries, monkeypatch):
    """Background: progress is applied on the loop's thread while the sweep runs; Stop ends it at its next batch
    (the worker patches no further batch) and its answer never lands."""
    monkeypatch.setattr(why_view, "EXACT_AT_ONCE", 0)
    monkeypatch.setattr(workers, "_PLACEMENT", None)  # the server's threads: the slowed sweep is patched here
    monkeypatch.setattr(workers, "_REFUSED", True)
    batches, first_batch, release = [], threading.Event(), threading.Event()

    def slow_sweep(*args, progress=None, **kw):
        def counted(done, total):
            batches.append(done)
            first_batch.set()
            release.wait(60)
            progress(done, total)
        return patching_sweep(*args, progress=counted, **{**kw, "batch_size": 8})

    monkeypatch.setattr(why_view, "patching_sweep", slow_sweep)
    loop_thread, applied = [], []

    async def main():
        loop_thread.append(threading.current_thread())
        s = Session(entries, checkpoint="alpha", sentence=SENTENCE, background=True)
        await until(lambda: s.result is not None and not s.busy, "the translation")
        view = WhyView(session=s)
        view._progress_text.param.watch(lambda e: applied.append((threading.current_thread(), e.new)), "object")
        view.show()
        view.corrupted = _swapped(s)
        await until(lambda: view._exact.visible, "the estimate")
        view.refresh_patching(exact=True)
        await asyncio.get_running_loop().run_in_executor(None, first_batch.wait, 60)
        release.set()
        await until(lambda: applied, "the first progress report")
        maps.extend(o for o in view._patch_box.objects if isinstance(o, pn.pane.Bokeh))
        view.stop()
        await asyncio.sleep(0.5)
        return view

    maps = []
    view = on_loop(main)
    assert applied and all(t is loop_thread[0] for t, _ in applied)
    assert "Stopped the exact sweep" in _note(view) and "attribution patching" in _note(view)
    # the estimate shown while the sweep ran stays, figures and all: Stop changes its note, it draws nothing anew
    assert maps and [o for o in view._patch_box.objects if isinstance(o, pn.pane.Bokeh)] == maps
    total = why_view.site_count(view.session.result)
    assert len(batches) < total / 8 - 1  # it stopped early


def test_the_estimate_is_shown_in_nats_and_the_sweep_as_a_share_with_their_agreement(session):
    """Issue 37: the estimate's cells are Δ log p in nats with their measured error, never a share; the sweep's
    answer carries Spearman, top-k overlap and the scale ratio against the estimate, recomputed here by hand."""
    import pandas as pd  # a second Spearman: pandas ranks on its own

    r = session.result
    swapped = _swapped(session)
    est = patch(r, swapped, exact=False)
    assert not est.exact and "nats" in est.value_label and "not a share" in est.note
    assert "Expected error" in est.note
    for (_t, values, *_), delta in zip(est.maps, est.deltas, strict=True):
        assert np.array_equal(values, delta, equal_nan=True)  # drawn as they are: nats
    sums = np.nansum(est.deltas[0], axis=1)  # a whole stream row patched at once is the changed run
    assert f"{sums.min():+.2f}" in est.note and f"{est.gap:+.2f}" in est.note
    exact = patch(r, swapped, exact=True, estimate=est)
    assert exact.exact and exact.value_label == "effect (share)" and exact.gap == pytest.approx(est.gap)
    for (_t, values, *_), delta in zip(exact.maps, exact.deltas, strict=True):
        assert np.allclose(values, delta / exact.gap, equal_nan=True)
    a = exact.agreement
    e = np.concatenate([m.ravel() for m in est.deltas])
    x = np.concatenate([m.ravel() for m in exact.deltas])
    keep = np.isfinite(e) & np.isfinite(x)
    assert a.cells == keep.sum()
    assert a.spearman == pytest.approx(pd.Series(e[keep]).corr(pd.Series(x[keep]), method="spearman"))
    assert a.scale == pytest.approx(np.abs(x[keep]).max() / np.abs(e[keep]).max())
    assert 0 <= a.overlap <= a.top_k == 10 and "Spearman" in exact.note and "top-10 overlap" in exact.note


def test_an_exact_answer_shows_the_estimate_first(session, monkeypatch):
    shown = []
    view = WhyView(session=session)
    monkeypatch.setattr(view, "_show_patching", lambda p, extra="": shown.append(p.exact))
    view.show()
    view.corrupted = _swapped(session)  # a short sentence: the exact sweep at once, the estimate shown first
    assert shown[-2:] == [False, True]


def test_sweep_progress_is_shown_at_most_every_quarter_second_and_its_last_report_always(session):
    """Each shown report is a message to the page on the shared event loop: reports closer together than
    `PROGRESS_EVERY` are skipped, except the sweep's last (and its first, which follows the estimate)."""
    view = WhyView(session=session)
    view._progress_at = time.monotonic() + 3600  # as if a report had just been shown
    view._report(5, 100)
    assert not view._progress_text.visible and view._bar.value == 0  # skipped
    view._report(100, 100)
    assert "patched 100 of 100 sites" in view._progress_text.object and view._bar.value == 100  # the last: shown
    view._progress_at = 0.0  # long ago
    view._report(50, 100)
    assert "patched 50 of 100 sites" in view._progress_text.object and view._bar.value == 50


def test_a_second_page_gets_the_patching_answer_another_page_computed(entries, monkeypatch):
    # one cache keyed by checkpoint (issue 37 pt 6): the answer is the checkpoint's, not one page's
    calls = []
    monkeypatch.setattr(why_view, "patch", lambda *a, **k: calls.append(a[1]) or patch(*a, **k))
    first = WhyView(session=Session(entries, checkpoint="alpha", sentence=SENTENCE))
    first.show()
    assert len(calls) == 1
    second = WhyView(session=Session(entries, checkpoint="alpha", sentence=SENTENCE))
    second.show()
    assert len(calls) == 1 and _note(second) == _note(first)
    third = WhyView(session=Session(entries, checkpoint="alpha", sentence="Zwei Hunde laufen."))
    third.show()
    assert len(calls) == 2  # another sentence is another question

"""The Why tab without a browser: attribution of the tapped token sums to its logit, and patching runs against
a changed source (or says why it cannot)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
from pathlib import Path

import panel as pn
import pytest
import torch
from bokeh.models import GlyphRenderer

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint  # noqa: E402

from workbench.ui import Workbench, loader  # noqa: E402
from workbench.ui.session import Session  # noqa: E402
from workbench.ui.why_view import TAB, WhyView  # noqa: E402

SENTENCE = "Ein Hund läuft durch den Park."


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    build_checkpoint(root / "alpha", seed=0, steps=0)
    entries, _ = loader.discover([root], default=None)
    return Session(entries, checkpoint="alpha", sentence=SENTENCE)


def _bokeh(view) -> list:
    return [o.object for o in view.content if isinstance(o, pn.pane.Bokeh)]


def _note(view) -> str:
    return next(o.object for o in view.content if "why-patching-note" in o.css_classes)


def test_attribution_bars_sum_to_the_tapped_tokens_logit(session):
    view = WhyView(session=session)
    assert view.content == []  # hidden: no work
    view.position = 2
    view.show()
    bars = _bokeh(view)[0]
    values = bars.select_one({"type": GlyphRenderer}).data_source.data["value"]
    r = session.result
    tm = session.translation_model()
    tgt = torch.tensor([[tm.model.cfg.start_id, *r.out_ids[:-1]]])
    with torch.no_grad():
        logit = tm.model(torch.tensor([list(r.src_ids)]), tgt)[0, 2, r.out_ids[2]]
    assert sum(values) == pytest.approx(float(logit), abs=1e-3)
    assert f"{r.out_pieces[2]!r} at output position 2" in bars.title.text


def test_patching_needs_the_same_token_count_and_draws_two_maps(session):
    view = WhyView(session=session)
    view.show()
    view.corrupted = "Ein Hund läuft durch den großen Park mit Bäumen."
    assert "tokens and the original" in _note(view)
    tm = session.translation_model()
    ids, _ = tm.encode_source(SENTENCE)
    swapped = tm.src_tokenizer.decode([ids[1], *ids[:1], *ids[2:-1]])  # same pieces, two swapped
    if tm.encode_source(swapped)[0] == ids or len(tm.encode_source(swapped)[0]) != len(ids):
        pytest.skip("this tokenizer re-splits the swapped text")
    view.corrupted = swapped
    assert "log p of the output" in _note(view) and len(_bokeh(view)) == 4  # bars, reads, stream, heads


def test_the_tab_joins_through_the_constructor(session, tmp_path):
    wb = Workbench(session.entry.path, default_dir=None, extra_tabs=[TAB])
    assert [t for t, _ in wb.tabs][-1] == "Why"


def _swapped(session) -> str:
    """The sentence with its first two pieces swapped: the same token count (skips if the tokenizer re-splits)."""
    tm = session.translation_model()
    ids, _ = tm.encode_source(SENTENCE)
    swapped = tm.src_tokenizer.decode([ids[1], *ids[:1], *ids[2:-1]])
    if tm.encode_source(swapped)[0] == ids or len(tm.encode_source(swapped)[0]) != len(ids):
        pytest.skip("this tokenizer re-splits the swapped text")
    return swapped


def test_patching_reports_its_progress_per_batch_and_hides_it_when_done(session):
    view = WhyView(session=session)
    seen = []
    view._progress_text.param.watch(lambda e: seen.append(e.new), "object")
    view.show()
    seen.clear()
    view.corrupted = _swapped(session)
    assert "log p of the output" in _note(view)
    enc = [t for t in seen if "encoder stream" in t]
    heads = [t for t in seen if "heads" in t]
    assert enc and heads and seen == enc + heads  # the stream sweep first, then the heads
    for lines in (enc, heads):
        done_total = [tuple(int(w) for w in t.split("patched ")[1].split(" sites")[0].split(" of ")) for t in lines]
        assert done_total[-1][0] == done_total[-1][1] and [d for d, _ in done_total] == sorted(d for d, _ in done_total)
    assert not view._bar.visible and not view._progress_text.visible


def test_served_progress_arrives_on_the_event_loop_while_the_sweep_runs(session):
    """Background: each report is applied on the loop's thread, and the bar shows before the answer lands."""
    loop_thread, applied = [], []

    async def main():
        loop_thread.append(threading.current_thread())
        s = Session(session.entries, checkpoint=session.checkpoint, sentence=SENTENCE, background=True)
        while s.busy or s.result is None:
            await asyncio.sleep(0.01)
        view = WhyView(session=s)
        view._progress_text.param.watch(
            lambda e: applied.append((threading.current_thread(), e.new, view._box.loading)), "object")
        view.show()
        while view._box.loading:
            await asyncio.sleep(0.01)
        view.corrupted = _swapped(s)
        while view._box.loading:
            await asyncio.sleep(0.01)
        return view

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        view = pool.submit(asyncio.run, main()).result(timeout=120)
    reports = [(t, text, loading) for t, text, loading in applied if text]
    assert reports and all(t is loop_thread[0] and loading for t, text, loading in reports)
    assert "log p of the output" in _note(view) and not view._progress_text.visible

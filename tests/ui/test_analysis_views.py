"""The Model analysis tab without a browser: every analysis draws on a real (tiny) checkpoint, from the
session's own result, and agrees with calling the analysis directly; the tab joins through the constructor."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from bokeh.models import Model

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint  # noqa: E402

from workbench.ui import Workbench, loader  # noqa: E402
from workbench.ui.analysis_views import ANALYSES, TAB, ModelAnalysisView, beam_replay  # noqa: E402
from workbench.ui.session import Session  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    build_checkpoint(root / "alpha", seed=0, steps=0)
    return root


@pytest.fixture(scope="module")
def session(root):
    entries, problems = loader.discover([root], default=None)
    assert problems == []
    return Session(entries, checkpoint="alpha", sentence="Ein Hund läuft.")


def _shown(view) -> list:
    return [type(o).__name__ for o in view.content]


@pytest.mark.parametrize("analysis", ANALYSES[1:])
def test_every_analysis_draws(session, analysis):
    view = ModelAnalysisView(session=session, analysis=analysis)
    assert isinstance(view.build(session.result, session.translation_model()), Model)
    view.show()
    assert _shown(view) == ["Bokeh"]


def test_beam_replay_in_the_tab_ends_on_the_search_output(session):
    from workbench.analysis import replay_beam
    from workbench.decoding.search import beam_search

    view = ModelAnalysisView(session=session, analysis="beam search replay", beam=3)
    view.show()
    tm = session.translation_model()
    src = session.result.trace.src
    gen = beam_search(tm.model, src, beam=3, max_len=max(4, len(session.result.out_ids) + 8), record_steps=True)
    replay = replay_beam(gen, 0)
    assert view.param.step.bounds == (0, len(replay.steps) - 1)  # the step picker spans the replayed search
    view.step = len(replay.steps) - 1
    assert _shown(view) == ["Bokeh"]


def test_nothing_runs_until_shown_and_an_analysis_is_picked(session):
    view = ModelAnalysisView(session=session, analysis="attribution vs attention")
    assert view.content == []  # hidden: no work
    view.analysis = "(pick one)"
    view.show()
    assert "Pick an analysis" in view.content[0].object
    view.analysis = "attribution vs attention"
    assert _shown(view) == ["Bokeh"]


def test_a_failing_analysis_is_a_message(session):
    view = ModelAnalysisView(session=Session(session.entries, checkpoint="alpha", sentence="Hund " * 40),
                             analysis="attention flow")
    view.show()
    assert "could not be drawn" in view.content[0].object and "limited to 24 source tokens" in view.content[0].object


def test_the_tab_joins_through_the_constructor_only(root):
    with_tab = Workbench(root / "alpha", default_dir=None, extra_tabs=[TAB])
    plain = Workbench(root / "alpha", default_dir=None)
    assert [t for t, _ in with_tab.tabs][-1] == "Model analysis"
    assert "Model analysis" not in [t for t, _ in plain.tabs]  # no registry shared between apps


def test_a_beam_replay_is_computed_once_for_every_page_that_asks(root):
    # one cache keyed by checkpoint (issue 37 pt 6): a second page on the same sentence and beam reuses the replay
    # (the tab had kept its own, keyed by the id of the page's result object)
    entries, _ = loader.discover([root], default=None)
    pages = [Session(entries, checkpoint="alpha", sentence="Zwei Hunde laufen.") for _ in range(2)]
    before = loader.CACHE.loads
    views = [ModelAnalysisView(session=s, analysis="beam search replay", beam=2) for s in pages]
    for view in views:
        view.show()
        assert _shown(view) == ["Bokeh"]
    replays = [beam_replay(s.result.model, s.result.trace.src[:1], len(s.result.out_ids), 2) for s in pages]
    assert replays[0] is replays[1]
    assert sum(k[0] == "replay" for k in loader.CACHE.keys()) >= 1
    assert loader.CACHE.loads - before == 1  # the model was cached already: only the replay was computed
    assert views[1].param.step.bounds == (0, len(replays[0].steps) - 1)
    r = pages[0].result
    other_beam = beam_replay(r.model, r.trace.src[:1], len(r.out_ids), 3)
    assert other_beam is not replays[0]

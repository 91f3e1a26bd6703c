"""The Model analysis tab without a browser: every analysis draws on a real (tiny) checkpoint, from the
session's own result, and agrees with calling the analysis directly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from bokeh.models import Model

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint  # noqa: E402

from workbench.ui import loader  # noqa: E402
from workbench.ui.analysis_views import ANALYSES, ModelAnalysisView, register  # noqa: E402
from workbench.ui.session import Session  # noqa: E402


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    build_checkpoint(root / "alpha", seed=0, steps=0)
    entries, problems = loader.discover([root], default=None)
    assert problems == []
    return Session(entries, checkpoint="alpha", sentence="Ein Hund läuft.")


@pytest.mark.parametrize("analysis", ANALYSES[1:])
def test_every_analysis_draws(session, analysis):
    view = ModelAnalysisView(session=session, analysis=analysis)
    fig = view.build(session.result, session.model)
    assert isinstance(fig, Model)
    view._redraw()
    assert type(view._box.objects[0]).__name__ == "Bokeh"


def test_beam_replay_in_the_tab_ends_on_the_search_output(session):
    from workbench.analysis import replay_beam
    from workbench.decoding import beam_search

    view = ModelAnalysisView(session=session, analysis="beam search replay", beam=3)
    view.build(session.result, session.model)
    replay = view._replay
    tm = session.model
    src = session.result.trace.src
    gen = beam_search(tm.model, src, beam=3, max_len=max(4, len(session.result.out_ids) + 8), record_steps=True)
    assert replay.final[0] == gen.hypotheses[0][0].tokens == replay_beam(gen, 0).final[0]
    assert view.param.step.bounds == (0, len(replay.steps) - 1)


def test_nothing_runs_until_an_analysis_is_picked_and_errors_are_messages(session):
    view = ModelAnalysisView(session=session)
    view._redraw()
    assert "Pick an analysis" in view._box.objects[0].object
    view.analysis = "attribution vs attention"
    assert type(view._box.objects[0]).__name__ == "Bokeh"


def test_register_adds_the_tab():
    from workbench.ui.workbench_app import Workbench

    before = list(Workbench.extra_tabs)
    try:
        register()
        assert [t for t, _ in Workbench.extra_tabs].count("Model analysis") == 1
    finally:
        Workbench.extra_tabs = before

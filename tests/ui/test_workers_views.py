"""The Graph, Evidence and Features tabs' heavy work in worker processes (issue 37 point 4): each tab's job computed in
a worker equals the same job computed in the server's process (on the shipped de->en checkpoint, with its
dictionaries), a graph job that only re-prunes the page's graph does not build it again, and served, each tab's work
goes to the worker pool (never the view's own code) and a closed page's jobs are cancelled in their workers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint  # noqa: E402
from test_requests import on_loop, until  # noqa: E402

from workbench.charts.compare import compare_attention  # noqa: E402
from workbench.charts.features import feature_dashboard  # noqa: E402
from workbench.charts.graph import graph_data  # noqa: E402
from workbench.ui import loader, workers  # noqa: E402
from workbench.ui.analysis_views import ModelAnalysisView, analysis_figure, model_analysis  # noqa: E402
from workbench.ui.evidence_view import EvidenceView, draw_evidence, evidence  # noqa: E402
from workbench.ui.features_view import FeaturesView, explore  # noqa: E402
from workbench.ui.graph_view import GraphView, graph_answer  # noqa: E402
from workbench.ui.session import Session  # noqa: E402
from workbench.ui.views import CompareView  # noqa: E402
from workbench.ui.work import Offloaded, Snapshot, compare_reading  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[2] / "checkpoints" / "multi30k-de-en"
SENTENCE = "Ein Hund läuft durch den Park."
WAIT = 180


@pytest.fixture(scope="module")
def shipped_result():
    entries = loader.discover([SHIPPED], default=None)[0]
    s = Session(entries, checkpoint=next(e.label for e in entries if Path(e.path) == SHIPPED), sentence=SENTENCE)
    return s.result


@pytest.fixture(scope="module")
def shipped(shipped_result):
    return Snapshot.of(shipped_result)


def _in_worker(pool, fn, *args):
    reports = []
    answer = pool.submit(fn, args, report=lambda *a: reports.append(a)).future.result(timeout=WAIT)
    return answer, reports


def _close(a, b) -> bool:
    a, b = (np.asarray(x.detach() if isinstance(x, torch.Tensor) else x, dtype=float) for x in (a, b))
    return a.shape == b.shape and np.allclose(a, b, atol=1e-6, equal_nan=True)


def test_a_snapshot_pickles_without_its_model(shipped):
    import pickle

    copy = pickle.loads(pickle.dumps(shipped))
    assert copy == shipped and copy.tm is None and shipped.tm is not None
    assert len(pickle.dumps(shipped)) < 10_000  # the ids and pieces, never the weights


def test_a_graph_built_in_a_worker_equals_one_built_here_and_a_reprune_builds_nothing(pool, shipped):
    key = (shipped.request.translate_key, 2, False)
    args = (shipped, key, 2, 0.8, 100, True, False)
    here = graph_answer(*args)
    there, reports = _in_worker(pool, graph_answer, *args)
    assert _close(here["graph"].adjacency, there["graph"].adjacency)
    assert here["keep"].tolist() == there["keep"].tolist()
    assert _close(here["trust"].real, there["trust"].real) and _close(here["trust"].predicted, there["trust"].predicted)
    assert abs(here["token_prob"] - there["token_prob"]) < 1e-6 and here["contexts"] == there["contexts"]
    assert here["corpus"] == there["corpus"] and here["piece"] == there["piece"]
    built = [r for r in reports if not r[2]]  # sub-layer counts, not the stage lines
    assert built and built[-1][0] == built[-1][1]  # its progress per sub-layer reached the server, to the last
    # the drawing's columns come with the answer (computed off the server's loop), as the chart computes them
    assert here["drawn"] == graph_data(here["graph"], here["keep"], src_tokens=here["src_tokens"],
                                       tgt_tokens=here["tgt_tokens"], contexts=here["contexts"])
    assert there["drawn"][0]["label"] == here["drawn"][0]["label"]
    assert there["drawn"][1]["width"] and len(there["drawn"][1]["width"]) == len(here["drawn"][1]["width"])
    # the page's graph travels with a job that only changes the threshold: pruned again, not rebuilt
    pruned, reports = _in_worker(pool, graph_answer, shipped, key, 2, 0.5, 100, False, False,
                                 (there["graph"], there["trust"]))
    assert pruned["seconds"] == 0.0 and not [r for r in reports if not r[2]]
    assert pruned["keep"].tolist() == there["graph"].prune(0.5, 100).tolist()


def test_evidence_computed_in_a_worker_equals_evidence_computed_here(pool, shipped):
    here = evidence(shipped, "alti", True)
    there, reports = _in_worker(pool, evidence, shipped, "alti", True)
    (ev_h, roles_h, where_h), (ev_t, roles_t, where_t) = here, there
    assert ev_h.spec == ev_t.spec and ev_h.pieces == ev_t.pieces and ev_h.links == ev_t.links
    assert _close(ev_h.weights, ev_t.weights) and _close(ev_h.shares, ev_t.shares)
    assert where_h == where_t and str(roles_h) == str(roles_t)
    assert reports and "roles" in reports[0][2]
    fig = draw_evidence(*there)  # the page draws the worker's answer
    assert len(fig.children) == 6


def test_the_checkpoints_own_aligner_in_a_worker_loads_its_alignment_layer_there(pool):
    """general-en-de's aligner is a trained alignment layer stored beside the model: a worker process, which gets
    the path and not the model, finds it too and draws the links `workbench align` writes."""
    general = SHIPPED.parent / "general-en-de"
    entries = loader.discover([general], default=None)[0]
    s = Session(entries, checkpoint=entries[0].label, sentence="The committee approved the report yesterday.")
    snap = Snapshot.of(s.result)
    here = evidence(snap, None, False)
    there, _ = _in_worker(pool, evidence, snap, None, False)
    assert here[0].links == there[0].links and here[0].spec == there[0].spec and there[1] is None
    assert "3 trained alignment layers read as one" in there[0].spec


def test_a_feature_answer_computed_in_a_worker_equals_one_computed_here(pool, shipped):
    args = (shipped, "dec.1.ffn", 1, "Hund", 1, "?site={site}&feature={feature}", "+5")
    here = explore(*args)
    there, _ = _in_worker(pool, explore, *args)
    for k in ("sites", "site", "n", "site_labels", "sentence", "href", "feature", "hits"):
        assert here[k] == there[k], k
    assert here["why"]["rows"] == there["why"]["rows"] and abs(here["why"]["total"] - there["why"]["total"]) < 1e-6
    assert here["steer"]["steered"] == there["steer"]["steered"] and here["steer"]["plain"] == there["steer"]["plain"]
    dh, dt = here["dashboard"], there["dashboard"]
    assert dh.summary_ == dt.summary_ and dh.histogram_ == dt.histogram_ and dh.contexts_ == dt.contexts_
    assert [e["token"] for e in dh.effects["tokens"]] == [e["token"] for e in dt.effects["tokens"]]
    layout = feature_dashboard(dt, there["feature"])  # the page draws the worker's answer
    assert layout.name == "feature_dashboard"
    with pytest.raises(ValueError):
        feature_dashboard(dt, there["feature"] + 1)  # a dashboard answers for its own feature only


@pytest.mark.parametrize("analysis", ["logit lens", "beam search replay", "value norms (cross, last layer)"])
def test_a_model_analysis_computed_in_a_worker_equals_one_computed_here(pool, shipped, shipped_result, analysis):
    args = (shipped, shipped_result.trace, analysis, "saliency", 3, 1)
    here = model_analysis(*args)
    there, _ = _in_worker(pool, model_analysis, *args)
    assert here.keys() == there.keys() and here["vocab" if "vocab" in here else "out_tokens"] == there[
        "vocab" if "vocab" in there else "out_tokens"]
    if analysis == "logit lens":
        assert _close(here["lens"].top_ids, there["lens"].top_ids)
        assert _close(here["lens"].top_log_probs, there["lens"].top_log_probs)
    elif analysis == "beam search replay":
        assert here["replay"].final[0] == there["replay"].final[0]
        assert [s.live for s in here["replay"].steps] == [s.live for s in there["replay"].steps]
    else:
        assert _close(here["relevance"], there["relevance"])
    assert analysis_figure(there) is not None  # the page draws the worker's answer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    build_checkpoint(root / "alpha", seed=0, steps=0)
    return loader.discover([root], default=None)[0]


def test_served_each_tab_sends_its_work_to_the_pool_and_a_closed_page_cancels_it(pool, tiny, monkeypatch):
    monkeypatch.setattr(workers, "_PLACEMENT", pool)
    if os.environ.get("WORKBENCH_APP_GRAPHS_IN_WORKERS", "1") != "0":
        assert isinstance(GraphView.compute, Offloaded) and GraphView.compute.fn is graph_answer  # the default
    monkeypatch.setattr(GraphView, "compute", Offloaded(graph_answer))  # also where the switch says threads
    sent = []
    real_submit = pool.submit

    def recording(fn, args, report=None, wanted=lambda: True, partial=None):
        job = real_submit(fn, args, report, wanted, partial)
        sent.append((fn.__name__, job))
        return job

    monkeypatch.setattr(pool, "submit", recording)

    async def main():
        s = Session(tiny, checkpoint="alpha", sentence=SENTENCE, background=True)
        await until(lambda: s.result is not None and not s.busy, "the translation")
        views = [GraphView(session=s), EvidenceView(session=s), FeaturesView(session=s),
                 ModelAnalysisView(session=s, analysis="logit lens")]
        for view in views:
            view.show()
            await until(lambda v=view: not v.lane.busy and v.content, f"the {view.title} tab's answer")
        graph = views[0]
        graph.position = 1
        job = sent[-1][1]
        s.close()  # the page is gone: its job is cancelled (and stops in its worker at its next check)
        await until(lambda: job.future.done(), "the closed page's job to settle")
        return views, job

    views, job = on_loop(main)
    assert [name for name, _ in sent] == ["graph_answer", "evidence", "explore", "model_analysis", "graph_answer"]
    assert job.cancelled
    assert any("graph-figure" in o.css_classes for o in views[0].content)
    assert views[1].content and "Cannot" not in str(views[1].content[0])
    assert views[0]._answer["position"] == 0  # the closed page's graph never landed


def test_a_cancelled_role_measurement_stops_within_a_batch_and_caches_nothing(shipped):
    """The head roles are measured on 60 test2016 sentences in 4 batches, after the gold AER: a page closed during it
    stops the measurement at the next batch, not at its end, and the next page measures afresh."""
    from workbench.ui.requests import Cancelled

    loader.CACHE.clear()
    sent = []
    ticket = workers.WorkerTicket(lambda: len(sent) >= 3, sent.append)  # closed after its third report
    with pytest.raises(Cancelled):
        evidence(shipped, "weights", True, ticket)
    assert len(sent) == 3 and sent[-1][1][:2] == (15, 60)  # stopped after the first batch
    assert not [k for k in loader.CACHE.keys() if "roles" in k]
    reports = []
    finished = workers.WorkerTicket(lambda: False, reports.append)
    ev, roles, where = evidence(shipped, "weights", True, finished)
    assert roles is not None and "test2016" in where and reports[-1][1][:2] == (60, 60)


@pytest.mark.parametrize("kind, layer, head, words", [("cross", 1, -1, False), ("enc_self", 2, 3, True)])
def test_a_comparison_read_in_a_worker_equals_one_read_here(pool, shipped, shipped_result, kind, layer, head, words):
    """The Compare tab's work: the shipped early snapshot (B) reads A's output; in a worker as in this process."""
    early = str(SHIPPED.parent / "multi30k-de-en-early")
    args = (shipped, shipped_result.trace, early, kind, layer, head, words)
    here = compare_reading(*args)
    there, _ = _in_worker(pool, compare_reading, *args)
    for side in ("a", "b"):
        h, t = here[side], there[side]
        assert (h.kind, h.layer, h.heads, h.queries, h.keys) == (t.kind, t.layer, t.heads, t.queries, t.keys), side
        assert _close(h.values, t.values) and np.array_equal(h.masked, t.masked), side
    assert here["a"].queries == here["b"].queries and here["a"].keys == here["b"].keys  # one grid: B − A exists
    assert abs(here["log_prob_b"] - there["log_prob_b"]) < 1e-5
    layout = compare_attention(there["a"], there["b"], names=("multi30k-de-en", "multi30k-de-en-early"), wrap=30)
    titles = [f.title.text for f in layout.children]  # the page draws the worker's answer, titles wrapped
    assert titles[2].startswith("B − A") and max(len(line) for t in titles for line in t.split("\n")) <= 30


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    build_checkpoint(root / "alpha", seed=0, steps=0)
    build_checkpoint(root / "beta", seed=1, steps=0)
    return loader.discover([root], default=None)[0]


def test_served_the_compare_tab_loads_and_runs_b_in_a_worker_never_here(pool, pair, monkeypatch):
    monkeypatch.setattr(workers, "_PLACEMENT", pool)
    sent, loaded = [], []
    real_submit, real_load = pool.submit, loader.load_model

    def recording(fn, args, *rest, **kw):
        sent.append(fn.__name__)
        return real_submit(fn, args, *rest, **kw)

    def load_here(path):
        loaded.append(Path(path).name)
        return real_load(path)

    monkeypatch.setattr(pool, "submit", recording)
    monkeypatch.setattr(loader, "load_model", load_here)

    async def main():
        s = Session(pair, checkpoint="alpha", sentence=SENTENCE, background=True)
        await until(lambda: s.result is not None and not s.busy, "the translation")
        view = CompareView(session=s)
        assert view.other == "beta"  # the default partner
        view.show()
        await until(lambda: not view.lane.busy and len(view.content) > 1, "the Compare tab's answer")
        return view

    view = on_loop(main)
    assert sent == ["compare_reading"] and "beta" not in loaded  # B: loaded and run in the worker process only
    assert "B = beta" in view.content[0].object
    figures = [o for o in view.content[-1] for o in o.objects]
    assert [f.object.title.text.split("\n")[0] for f in figures] == ["A = alpha", "B = beta", "B − A"]

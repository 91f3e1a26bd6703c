"""Influence and pruning of attribution graphs, as circuit-tracer defines them: the influence computed three ways on
small random DAGs (the power series, the closed form e_logit ((I - B)^-1 - I), and every path enumerated), `prune`
keeping what it says (the fewest nodes reaching the share; under a node budget the subset of that size holding the
most influence, checked against every subset), the influence a pruned graph holds by its own paths, circuit-tracer's
replacement and completeness scores by hand, and the pruned graph tested in the real model on a tiny one."""

from __future__ import annotations

import itertools

import pytest
import torch
from dictionary_helpers import tiny_dictionaries
from model_helpers import graph_model, one_sentence

from workbench.analysis.attribution import graph as graph_module
from workbench.analysis.attribution.feature_graph import (
    feature_graph,
    feature_nodes,
    graph_scores,
    paths_within,
    pruned_check,
    remove_features,
)
from workbench.analysis.attribution.graph import AttributionGraph, node_influence


def random_dag(n: int, seed: int, density: float = 0.6) -> torch.Tensor:
    """A[target, source] with edges only from lower to higher indices (node n-1 the logit), signed weights."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    a *= (torch.rand(n, n, generator=g, dtype=torch.float64) < density)
    return a.tril(-1)


def normalised(a: torch.Tensor) -> torch.Tensor:
    b = a.abs()
    return b / b.sum(1, keepdim=True).clamp(min=1e-30)


def by_paths(a: torch.Tensor) -> torch.Tensor:
    """Influence of each node on the last one: the sum over every path logit -> ... -> node of the product of the
    normalised |A| entries along it, each path enumerated."""
    b = normalised(a)
    n = len(a)
    out = torch.zeros(n, dtype=torch.float64)

    def walk(node: int, weight: float) -> None:
        for src in range(node):
            if b[node, src] != 0:
                out[src] += weight * b[node, src]
                walk(src, weight * float(b[node, src]))

    walk(n - 1, 1.0)
    return out


def graph_of(a: torch.Tensor, kinds: list[str] | None = None) -> AttributionGraph:
    kinds = kinds or ["x"] * len(a)
    return AttributionGraph([{"kind": k} for k in kinds], a, torch.zeros(len(a), dtype=torch.float64), 0.0, 0, 0)


@pytest.mark.parametrize("seed", range(4))
def test_influence_three_ways(seed, monkeypatch):
    a = random_dag(9, seed)
    b = normalised(a)
    e = torch.zeros(9, dtype=torch.float64)
    e[-1] = 1.0
    closed = e @ (torch.linalg.inv(torch.eye(9, dtype=torch.float64) - b) - torch.eye(9, dtype=torch.float64))
    series = node_influence(a)
    torch.testing.assert_close(series, closed, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(series, by_paths(a), rtol=1e-12, atol=1e-14)
    monkeypatch.setattr(graph_module, "ORDERED_INFLUENCE", 0)  # the node-order solve of large graphs
    torch.testing.assert_close(node_influence(a), closed, rtol=1e-12, atol=1e-14)
    assert float(series[-1]) == 0.0  # the logit's own weight is not counted (circuit-tracer's logit_weights @ B...)


def share(inf: torch.Tensor, nodes) -> float:
    return float(inf[list(nodes)].sum() / inf[:-1].sum())


@pytest.mark.parametrize("seed", range(4))
def test_prune_keeps_the_fewest_nodes_reaching_the_share(seed):
    a = random_dag(10, seed)
    g = graph_of(a)
    inf = g.influence
    for threshold in (0.3, 0.5, 0.8, 0.95, 1.0):
        keep = g.prune(threshold).tolist()
        assert keep[-1] == 9 and keep == sorted(keep)
        kept = keep[:-1]
        assert share(inf, kept) >= threshold - 1e-12
        # no smaller set reaches it: every set of one node fewer falls short
        for smaller in itertools.combinations(range(9), len(kept) - 1):
            assert share(inf, smaller) < threshold - 1e-12


@pytest.mark.parametrize("seed", range(3))
def test_a_node_budget_keeps_the_most_influence_any_subset_of_that_size_holds(seed):
    a = random_dag(10, seed)
    g = graph_of(a)
    inf = g.influence
    for budget in (1, 3, 5):
        kept = g.prune(1.0, max_nodes=budget)[:-1].tolist()
        assert len(kept) == budget
        best = max(share(inf, s) for s in itertools.combinations(range(9), budget))
        assert share(inf, kept) == pytest.approx(best, abs=1e-12)


def test_paths_within_a_pruned_graph():
    # 0 -> 1 -> 3 (logit), 0 -> 2 -> 3; normalised rows: 3: (1: 1/4, 2: 3/4), 1: (0: 1), 2: (0: 1)
    a = torch.zeros(4, 4, dtype=torch.float64)
    a[3, 1], a[3, 2], a[1, 0], a[2, 0] = 1.0, -3.0, 2.0, 5.0
    g = graph_of(a)
    torch.testing.assert_close(paths_within(g, [0, 1, 2]), g.influence)
    # without node 1: node 0 keeps only the path through 2 (3/4 x 1)
    assert paths_within(g, [0, 2]).tolist() == pytest.approx([0.75, 0.0, 0.75, 0.0])
    for seed in range(3):
        r = graph_of(random_dag(9, seed))
        keep = r.prune(0.6)[:-1]
        within = paths_within(r, keep)
        assert bool((within <= r.influence + 1e-15).all())
        assert float(within[[i for i in range(8) if i not in keep.tolist()]].abs().sum()) == 0.0


def test_graph_scores_by_hand():
    # nodes: 0 embed, 1 error, 2 bias, 3 feature, 4 logit
    a = torch.zeros(5, 5, dtype=torch.float64)
    a[3, 0], a[3, 1], a[3, 2] = 2.0, 1.0, 1.0  # feature row: embed 1/2, error 1/4, bias 1/4
    a[4, 3], a[4, 1] = 3.0, -1.0  # logit row: feature 3/4, error 1/4
    g = graph_of(a, ["embed", "error", "bias", "feature", "logit"])
    # influence: feature 3/4; embed 3/8; error 1/4 + 3/16 = 7/16; bias 3/16
    assert g.influence.tolist() == pytest.approx([3 / 8, 7 / 16, 3 / 16, 3 / 4, 0.0])
    s = graph_scores(g)
    assert s["replacement"] == pytest.approx((3 / 8) / (3 / 8 + 7 / 16))
    # completeness: (feature: 3/4 x (1 - 1/4) + logit: 1 x (1 - 1/4) + sources x 1) / (sum of influence + 1)
    num = 3 / 8 + 7 / 16 + 3 / 16 + 3 / 4 * 3 / 4 + 1 * 3 / 4
    assert s["completeness"] == pytest.approx(num / (3 / 8 + 7 / 16 + 3 / 16 + 3 / 4 + 1))
    clean = graph_of(a.clone().index_fill_(1, torch.tensor([1]), 0.0), ["embed", "error", "bias", "feature", "logit"])
    assert graph_scores(clean) == pytest.approx({"replacement": 1.0, "completeness": 1.0})


def test_the_pruned_graph_is_tested_in_the_real_model():
    model = graph_model(norm_first=True)
    src, tgt = one_sentence(model.cfg)
    dicts = tiny_dictionaries(model)
    g = feature_graph(model, dicts, src, tgt, position=4)
    keep = g.prune(0.8, max_nodes=20)[:-1]
    out = pruned_check(model, dicts, src, tgt, g, keep)
    feats = feature_nodes(g)
    kept = sorted(set(feats) & set(keep.tolist()))
    rest = sorted(set(feats) - set(kept))
    assert out["kept_features"] == len(kept) > 0 and out["rest_features"] == len(rest) > 0
    assert out["kept_predicted"] + out["rest_predicted"] == pytest.approx(float(g.attribution[feats].sum()))
    real = remove_features(model, dicts, src, tgt, g, [[], kept, rest])
    assert out["kept_drop"] == pytest.approx(float(real[0] - real[1]), abs=1e-9)
    assert out["rest_drop"] == pytest.approx(float(real[0] - real[2]), abs=1e-9)
    assert abs(out["logit"] - g.logit) < 1e-4

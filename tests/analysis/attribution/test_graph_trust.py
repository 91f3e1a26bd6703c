"""Graph targets and trust (issue 38 point 4): the runner-up and demeaned targets are complete like the plain
logit; gradient × activation is checked by finite differences; graph_trust and the baselines report real removals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_helpers import graph_model, one_sentence

from workbench.analysis.attribution.graph import attribution_graph, remove_nodes
from workbench.analysis.attribution.graph_trust import gradient_x_activation, graph_trust, top_sets_vs_baselines


def _model(norm_first: bool = False):
    return graph_model(norm_first)


def _sentence(cfg, s=8, t=6, seed=1):
    return one_sentence(cfg, s, t, seed)


@pytest.mark.parametrize("target", ["runner-up", "demeaned"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_other_targets_are_complete(norm_first, target):
    m = _model(norm_first)
    src, tgt = _sentence(m.cfg)
    g = attribution_graph(m, src, tgt, position=3, target=target)
    with torch.no_grad():
        row = m(src, tgt)[0, 3].double()
    if target == "runner-up":
        assert g.baseline_token == int(row.topk(2).indices[1]) and g.token == int(row.argmax())
        expected = float(row[g.token] - row[g.baseline_token])
    else:
        assert g.baseline_token is None
        expected = float(row[g.token] - row.mean())
    assert g.logit == pytest.approx(expected, rel=1e-5, abs=1e-5)
    assert float(g.adjacency[-1].sum()) == pytest.approx(g.logit, rel=1e-4, abs=1e-6)
    assert float(remove_nodes(m, src, tgt, g, [[]])[0]) == pytest.approx(g.logit, rel=1e-4, abs=1e-5)
    with pytest.raises(ValueError, match="target must be one of"):
        attribution_graph(m, src, tgt, position=3, target="logits")
    with pytest.raises(ValueError, match="chooses its own baseline"):
        attribution_graph(m, src, tgt, position=3, target="runner-up", baseline_token=5)


def test_gradient_x_activation_matches_finite_differences():
    m = _model().double()
    src, tgt = _sentence(m.cfg)
    g = attribution_graph(m, src, tgt, position=4, target="demeaned")
    nodes = [g.index(kind="head", block="cross_attn")[3], g.index(kind="ffn", stack="enc")[2],
             g.index(kind="head", block="self_attn", stack="dec")[5]]
    gxa = gradient_x_activation(m, src, tgt, g, nodes)
    eps = 1e-6
    for value, j in zip(gxa, nodes):  # d logit / d(scale of the node's write) at scale 1 = grad . activation
        node = g.nodes[j]
        stream = m.stream(node["stack"])
        if node["kind"] == "head":
            name = stream.layers[node["layer"]].sublayer(node["block"]).block.hook_result.name
            idx = (0, node["head"], node["position"])
        else:
            name, idx = stream.layers[node["layer"]].ffn.hook_out.name, (0, node["position"])

        def scaled(factor, name=name, idx=idx):
            def hook(x, point):
                x = x.clone()
                x[idx] = x[idx] * factor
                return x
            with torch.no_grad(), m.hooks({name: hook}):
                row = m(src, tgt[:, :5])[0, 4]
            return float(row[g.token] - row.mean())

        assert value == pytest.approx((scaled(1 + eps) - scaled(1 - eps)) / (2 * eps), rel=1e-5, abs=1e-8)


def test_trust_puts_real_removals_beside_predictions():
    m = _model()
    src, tgt = _sentence(m.cfg)
    g = attribution_graph(m, src, tgt, position=4)
    t = graph_trust(m, src, tgt, g, top=10)
    computed = [k for k in t.kinds if k != "embed"]
    assert len(computed) == 10 and t.kinds[10:] == ["embed"] * (len(t.kinds) - 10)  # embeddings apart, after
    removed = remove_nodes(m, src, tgt, g, [[t.nodes[0]]])
    assert t.real[0] == pytest.approx(g.logit - float(removed[0]), abs=1e-6)
    assert np.allclose(t.predicted, g.attribution[t.nodes].numpy())
    assert -1 <= t.spearman <= 1
    assert list(t.frame().columns) == ["node", "label", "kind", "predicted", "real"]


def test_top_sets_vs_baselines_reports_each_set():
    m = _model()
    items = [(*(x[0].tolist() for x in _sentence(m.cfg, seed=s)), 3) for s in (1, 2, 3)]
    r = top_sets_vs_baselines(m, items, k=3, random_sets=4)
    assert r["items"] == 3 and set(r["mean_drop"]) == {"graph", "gxa", "random"}
    assert 0 <= r["graph_beats_gxa"] <= 1 and 0 <= r["mean_overlap_with_gxa"] <= 1
    assert len(r["per_item"]) == 3

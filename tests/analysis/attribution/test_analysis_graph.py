"""Attribution graphs (workbench.analysis.attribution.graph): exact on tiny models, checked against autograd and
the direct logit attribution; pruning and faithfulness on the shipped de->en model (slow)."""

from __future__ import annotations

import pytest
import torch
from model_helpers import ROOT, SHARED_DATA, graph_model, one_sentence

from workbench.analysis.attribution.decompose import direct_logit_attribution
from workbench.analysis.attribution.graph import AttributionGraph, attribution_graph, faithfulness_check, node_influence


def _model(norm_first: bool = False):
    return graph_model(norm_first)


def _sentence(cfg, s=8, t=6, seed=1):
    return one_sentence(cfg, s, t, seed)


@pytest.mark.parametrize("norm_first", [False, True])
def test_graph_is_complete_and_conserves_flow(norm_first):
    m = _model(norm_first)
    src, tgt = _sentence(m.cfg)
    g = attribution_graph(m, src, tgt, position=4, token=7, baseline_token=9)
    A, a = g.adjacency, g.attribution
    with torch.no_grad():
        row = m(src, tgt)[0, 4].double()
    assert g.logit == pytest.approx(float(row[7] - row[9]), rel=1e-5, abs=1e-5)  # fused vs explicit kernels
    # the logit's edges, and the source nodes' attributions, sum to the real logit difference
    assert float(A[-1].sum()) == pytest.approx(g.logit, rel=1e-4, abs=1e-6)
    sources = g.index(kind="embed") + g.index(kind="bias") + g.index(kind="error")
    assert float(a[sources].sum()) == pytest.approx(g.logit, rel=1e-4, abs=1e-6)
    # every intermediate node: edges in (with bias and error) = its attribution = edges out
    mid = g.index(kind="head") + g.index(kind="ffn")
    assert torch.allclose(A[mid].sum(1), a[mid], atol=1e-9)
    writers = mid + g.index(kind="embed")
    assert torch.allclose(A[:, writers].sum(0), a[writers], atol=1e-9)
    # the frozen model is exact at the clean point: the error nodes hold float rounding only
    assert a[g.index(kind="error")].abs().max() < 1e-4 * abs(g.logit)
    assert abs(float(a[g.index(kind="bias")])) > 1e-3  # the random biases do reach the logit
    # source embeddings reach cross-attention heads only through their values: edges exist and are non-zero
    cross = g.index(kind="head", block="cross_attn")
    src_emb = g.index(kind="embed", stack="enc")
    assert A[cross][:, src_emb].abs().sum() > 0
    assert A[g.index(kind="head", block="self_attn", stack="dec")][:, src_emb].abs().sum() == 0


@pytest.mark.parametrize("norm_first", [False, True])
def test_attributions_match_autograd_with_frozen_patterns_and_norms(norm_first):
    """a_t = g_t . w_t, with g_t from torch.autograd on the real model whose patterns and norm scales are detached
    (ReLU's derivative is its frozen gate): the analytic backward pass, checked by a second route."""
    m = _model(norm_first)
    src, tgt = _sentence(m.cfg, seed=3)
    g = attribution_graph(m, src, tgt, position=3, token=11)
    leaves = {}

    def leaf(x, hook):
        z = torch.zeros_like(x, requires_grad=True)
        leaves[hook.name] = (x.detach(), z)
        return x + z

    spec = {"*.hook_probs": lambda x, h: x.detach(), "*hook_scale": lambda x, h: x.detach(),
            "*.hook_result": leaf, "*.ffn.hook_out": leaf, "hook_src_embed": leaf, "hook_tgt_embed": leaf}
    with torch.enable_grad(), m.hooks(spec):
        logit = m(src, tgt[:, :4])[0, 3, 11]
        names = list(leaves)
        grads = dict(zip(names, torch.autograd.grad(logit, [leaves[n][1] for n in names])))
    for i, n in enumerate(g.nodes):
        if n["kind"] == "head":
            name = f"{n['stack']}.{n['layer']}.{n['block']}.hook_result"
            x, gr = leaves[name][0][0, n["head"], n["position"]], grads[name][0, n["head"], n["position"]]
        elif n["kind"] == "ffn":
            name = f"{n['stack']}.{n['layer']}.ffn.hook_out"
            x, gr = leaves[name][0][0, n["position"]], grads[name][0, n["position"]]
        elif n["kind"] == "embed":
            name = "hook_src_embed" if n["stack"] == "enc" else "hook_tgt_embed"
            x, gr = leaves[name][0][0, n["position"]], grads[name][0, n["position"]]
        else:
            continue
        assert float(g.attribution[i]) == pytest.approx(float((x * gr).sum()), rel=1e-4, abs=1e-5), n["label"]


def test_logit_edges_are_the_direct_logit_attribution():
    """The logit node's edge from each last-layer head and FFN equals decompose.direct_logit_attribution."""
    m = _model(False)
    src, tgt = _sentence(m.cfg, seed=4)
    g = attribution_graph(m, src, tgt, position=5, token=13)
    dla = direct_logit_attribution(m, src, tgt, position=5, token=13)
    last = len(m.dec) - 1
    for h in range(m.dec[last].cross_attn.n_heads):
        i = g.index(kind="head", stack="dec", layer=last, block="cross_attn", head=h, position=5)[0]
        want = float(dla.values[dla.labels.index(f"cross:{last}:{h}")])  # the one head spelling (core.heads)
        assert float(g.adjacency[-1, i]) == pytest.approx(want, rel=1e-5, abs=1e-7)
    i = g.index(kind="ffn", stack="dec", layer=last, position=5)[0]
    assert float(g.adjacency[-1, i]) == pytest.approx(float(dla.values[dla.labels.index(f"dec.{last}.ffn")]),
                                                      rel=1e-5, abs=1e-7)


def test_influence_and_pruning_by_hand():
    # 0 -> 1 -> 3 (logit), 2 -> 3; |A| rows normalised: logit row (2: 3/4, 1: 1/4), node 1 row (0: 1)
    A = torch.zeros(4, 4, dtype=torch.float64)
    A[3, 1], A[3, 2], A[1, 0] = 1.0, -3.0, 2.0
    inf = node_influence(A)
    assert inf.tolist() == pytest.approx([0.25, 0.25, 0.75, 0.0])
    g = AttributionGraph([{"kind": "x"}] * 4, A, torch.zeros(4), 0.0, 0, 0)
    assert g.prune(0.5).tolist() == [2, 3]
    assert g.prune(0.9).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="node_threshold"):
        g.prune(0)


def test_bad_input_is_refused():
    m = _model(False)
    src, tgt = _sentence(m.cfg)
    with pytest.raises(ValueError, match="out of range"):
        attribution_graph(m, src, tgt, position=9)
    with pytest.raises(ValueError, match="padding"):
        attribution_graph(m, torch.cat([src, torch.zeros(1, 2, dtype=torch.long)], 1), tgt, position=1)


@pytest.mark.slow
def test_shipped_graphs_are_small_complete_and_faithful():
    """On test2016 sentences of the shipped de->en model: completeness to 1e-4, at most 100 nodes hold 80 % of the
    influence, and removing the top-5 nodes lowers the logit at least 3x more than 5 random nodes (means)."""
    from workbench import load

    tm = load(ROOT / "checkpoints" / "multi30k-de-en")
    texts = (SHARED_DATA / "multi30k" / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:4]
    top, rand = [], []
    for n, (text, out) in enumerate(zip(texts, tm.translate(texts, return_tokens=True, beam=1))):
        src = torch.tensor([tm.encode_source(text)[0]])
        tgt = torch.tensor([[tm.model.cfg.start_id, *out.tokens[:-1]]])
        for pos in (1, len(out.tokens) // 2):
            g = attribution_graph(tm.model, src, tgt, pos, out.tokens[pos])
            assert float(g.adjacency[-1].sum()) == pytest.approx(g.logit, rel=1e-4)
            assert len(g.prune(0.8)) <= 100
            f = faithfulness_check(tm.model, src, tgt, g, 5, random_sets=5, seed=n)
            top.append(f["top_drop"])
            rand.append(f["random_drop"])
    assert sum(top) / len(top) >= 3 * max(sum(rand) / len(rand), 1e-6)

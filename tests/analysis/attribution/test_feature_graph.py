"""Feature-level attribution graphs on a tiny model with small random dictionaries (an SAE on hook_memory, an SAE on a
cross-attention block's output and a skip transcoder on a decoder FFN, at once; pre- and post-norm): completeness,
each node's edges in and out sum to its attribution, a feature's attribution is what removing it changes in the
replacement model, the real-model interventions clamp the right feature, and the nodes carry what the exporter and
the app read. Attention blocks without a dictionary pass their input through (heads as edges): their edges are the
head-node graph's with the head nodes eliminated (path sums), on a Marian-style pad-start decoder too."""

from __future__ import annotations

import copy

import pytest
import torch
from dictionary_helpers import random_dictionary, tiny_dictionaries
from model_helpers import graph_model, make_model, one_sentence, randomize_norms_and_biases

from workbench.analysis.attribution import graph as graph_module
from workbench.analysis.attribution.feature_graph import (
    feature_check,
    feature_gradient_x_activation,
    feature_graph,
    feature_graph_size,
    feature_nodes,
    remove_features,
)
from workbench.analysis.attribution.graph import attribution_graph
from workbench.core import presets
from workbench.core.hooks import HookPoint
from workbench.core.replacement import FEATURES, FREEZABLE, ReplacementModel
from workbench.core.splice import site_module
from workbench.features.dictionary import DictionaryConfig
from workbench.features.sites import ffn_input_hook, splice


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def model(request):
    return graph_model(norm_first=request.param)


def assert_complete(g, tol: float = 1e-10) -> None:
    """The target is the sum of the logit's edges; each inner node's edges in, and each node's edges out, sum to its
    attribution; the sources' attributions sum to the target."""
    A, a = g.adjacency, g.attribution
    assert abs(float(A[-1].sum()) - g.logit) <= tol * max(1.0, abs(g.logit))
    kinds = [n["kind"] for n in g.nodes]
    inner = [i for i, k in enumerate(kinds) if k in ("head", "ffn", "feature")]
    torch.testing.assert_close(A[inner].sum(1), a[inner], rtol=0, atol=tol)
    reads = [i for i, k in enumerate(kinds) if k != "logit"]
    torch.testing.assert_close(A[:, reads].sum(0), a[reads], rtol=0, atol=tol)
    sources = [i for i, k in enumerate(kinds) if k in ("embed", "bias", "error")]
    assert abs(float(a[sources].sum()) - g.logit) <= tol * max(1.0, abs(g.logit))


@pytest.mark.parametrize("head_nodes", [False, True], ids=["heads-as-edges", "head-nodes"])
@pytest.mark.parametrize("architecture", ["topk", "jumprelu", "batchtopk", "relu"])
def test_completeness_and_every_nodes_edges_sum_to_its_attribution(model, architecture, head_nodes):
    src, tgt = one_sentence(model.cfg)
    dicts = tiny_dictionaries(model, architecture=architecture)
    g = feature_graph(model, dicts, src, tgt, position=4, head_nodes=head_nodes)
    assert bool(g.index(kind="head")) == head_nodes
    A, a = g.adjacency, g.attribution
    assert abs(float(A[-1].sum()) - g.logit) <= 1e-10 * abs(g.logit)  # contributions sum to the target
    kinds = [n["kind"] for n in g.nodes]
    inner = [i for i, k in enumerate(kinds) if k in ("head", "ffn", "feature")]
    torch.testing.assert_close(A[inner].sum(1), a[inner], rtol=0, atol=1e-10)  # edges in, bias and errors
    reads = [i for i, k in enumerate(kinds) if k != "logit"]
    torch.testing.assert_close(A[:, reads].sum(0), a[reads], rtol=0, atol=1e-10)  # edges out (one set of gradients)
    sources = [i for i, k in enumerate(kinds) if k in ("embed", "bias", "error")]
    assert abs(float(a[sources].sum()) - g.logit) <= 1e-10 * abs(g.logit)
    assert len(feature_nodes(g)) > 0


def test_feature_nodes_replace_the_blocks_nodes(model):
    src, tgt = one_sentence(model.cfg)
    dicts = tiny_dictionaries(model)
    g = feature_graph(model, dicts, src, tgt, position=4)
    cross = model.dec[1].cross_attn.hook_out.name
    assert not g.index(kind="head")  # no dictionary: the heads are edges
    assert not g.index(kind="ffn", stack="dec", layer=0)
    old = feature_graph(model, dicts, src, tgt, position=4, head_nodes=True)
    assert not old.index(kind="head", stack="dec", layer=1, block="cross_attn")
    assert old.index(kind="head", stack="dec", layer=0, block="cross_attn")  # the older convention: heads stay
    for site, stack, length in ((cross, "dec", 5), ("dec.0.ffn", "dec", 5), (model.hook_memory.name, "enc", 8)):
        feats = g.index(kind="feature", site=site)
        per_pos = torch.bincount(torch.tensor([g.nodes[i]["position"] for i in feats]), minlength=length)
        assert int(per_pos.max()) <= 4 and len(feats) > 0
        errors = g.index(kind="error", site=site)
        assert sorted(g.nodes[i]["position"] for i in errors) == list(range(length))
        assert all(g.nodes[i]["stack"] == stack for i in feats + errors)
    node = g.nodes[g.index(kind="feature", site=cross)[0]]
    assert node["link"] == f"?tab=features&site={cross}&feature={node['feature']}"
    assert node["layer"] == 1 and node["block"] == "cross_attn" and node["activation"] > 0
    mem = g.nodes[g.index(kind="feature", site="hook_memory")[0]]
    assert mem["layer"] is None and mem["block"] is None


def test_a_features_attribution_is_what_removing_it_changes_in_the_replacement_model(model):
    src, tgt = one_sentence(model.cfg)
    dicts = tiny_dictionaries(model)
    g = feature_graph(model, dicts, src, tgt, position=4)
    rm = ReplacementModel(model, src, tgt[:, :5], freeze=(*FREEZABLE, FEATURES), dtype=torch.float64, splices=dicts)
    coef = torch.zeros(model.cfg.tgt_vocab, dtype=torch.float64)
    coef[g.token] = 1
    base = float(rm()[0, 4] @ coef)
    assert abs(base - g.logit) < 1e-10
    feats = feature_nodes(g)
    picks = [feats[j] for j in g.attribution[feats].abs().argsort(descending=True)[:3].tolist()] + feats[:2]
    for i in picks:
        node = g.nodes[i]
        sf = rm.features[node["site"]]
        sf.active[0, node["position"], node["feature"]] = False  # its write is gone; the error stays as it was
        rm._spec = None
        try:
            drop = base - float(rm()[0, 4] @ coef)
        finally:
            sf.active[0, node["position"], node["feature"]] = True
        assert abs(drop - float(g.attribution[i])) <= 1e-10 * max(1.0, abs(drop)), node["label"]


def test_without_dictionaries_and_with_head_nodes_it_is_the_head_graph(model):
    src, tgt = one_sentence(model.cfg)
    g = feature_graph(model, {}, src, tgt, position=3, head_nodes=True)
    h = attribution_graph(model, src, tgt, position=3)
    assert [n["label"] for n in g.nodes] == [n["label"] for n in h.nodes]
    torch.testing.assert_close(g.adjacency, h.adjacency, rtol=0, atol=1e-12)
    edges = feature_graph(model, {}, src, tgt, position=3)  # heads as edges: embeddings, FFNs, errors, bias
    assert {n["kind"] for n in edges.nodes} == {"embed", "ffn", "error", "bias", "logit"}
    assert_complete(edges)


def one_dim_heads(norm_first: bool, **changes):
    """A tiny model with one dimension per head (d_model = n_heads = 4) and every norm and bias random: a head's
    write is a scalar times a fixed direction, so eliminating its node from a graph is exact with scalar edges."""
    return randomize_norms_and_biases(make_model(presets.tiny(vocab=50, d_model=4, n_heads=4, d_ff=8,
                                                              norm_first=norm_first, enc_final_norm=True,
                                                              dec_final_norm=True, **changes), seed=2))


def eliminate_heads(g):
    """(the other nodes, their adjacency with the head nodes eliminated): every path through heads summed. With one
    dimension per head, head h's write is s_h o_h, so an edge out of it per unit of s_h is A[t, h] / a_h and a path
    t <- h1 <- ... <- hk <- s carries A[t, h1] / a_h1 ... A[hk, s]: A_RR + A_RH N (I - A_HH N)^-1 A_HR with
    N = diag(1 / a_h). A head the target does not depend on (a_h = 0) has no edges out and carries nothing."""
    heads = torch.tensor(g.index(kind="head"))
    rest = torch.tensor([i for i, n in enumerate(g.nodes) if n["kind"] != "head"])
    A, a = g.adjacency, g.attribution[heads]
    dead = a == 0
    assert not bool(A[:, heads[dead]].any())
    n = torch.diag(torch.where(dead, 0.0, 1 / a.where(~dead, 1.0)))
    eye = torch.eye(len(heads), dtype=A.dtype)
    through = A[rest][:, heads] @ n @ torch.linalg.solve(eye - A[heads][:, heads] @ n, A[heads][:, rest])
    return rest, A[rest][:, rest] + through


@pytest.mark.parametrize("marian", [False, True], ids=["bos-start", "pad-start"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_heads_as_edges_are_the_head_graphs_paths_through_its_heads(norm_first, marian):
    model = one_dim_heads(norm_first, **({"decoder_start_id": 0} if marian else {}))
    src, tgt = one_sentence(model.cfg)
    if marian:
        assert model.cfg.start_id == model.cfg.pad_id
    for dicts in (tiny_dictionaries(model), {}):
        with_heads = feature_graph(model, dicts, src, tgt, position=4, head_nodes=True)
        g = feature_graph(model, dicts, src, tgt, position=4)
        rest, eliminated = eliminate_heads(with_heads)
        assert [with_heads.nodes[i]["label"] for i in rest.tolist()] == [n["label"] for n in g.nodes]
        assert len(with_heads.index(kind="head")) > 0 and not g.index(kind="head")
        torch.testing.assert_close(g.adjacency, eliminated, rtol=0, atol=1e-12)
        torch.testing.assert_close(g.attribution, with_heads.attribution[rest], rtol=0, atol=1e-12)
        assert_complete(g)


def test_a_pad_start_decoder_with_dictionaries_and_heads_as_edges():
    """Marian's convention: the decoder starts with the padding id, position 0 a position like any other."""
    model = make_model(presets.tiny(vocab=40, decoder_start_id=0), seed=3)
    src, tgt = torch.tensor([[5, 6, 7, 8, 2]]), torch.tensor([[0, 9, 10, 11, 12]])
    dicts = tiny_dictionaries(model)
    for position in range(5):
        g = feature_graph(model, dicts, src, tgt, position=position)
        assert_complete(g)
        assert g.index(kind="embed", stack="dec", position=0)
        assert feature_graph_size(model, dicts, src, tgt, position) == len(g.nodes)


def test_removing_a_feature_in_the_real_model_subtracts_its_decoded_write(model):
    src, tgt = one_sentence(model.cfg)
    dicts = tiny_dictionaries(model)
    g = feature_graph(model, dicts, src, tgt, position=4)
    site = model.hook_memory.name
    i = g.index(kind="feature", site=site)[0]
    node = g.nodes[i]
    d = dicts[site]
    with torch.no_grad():
        acts = d.encode(model.encode(src).memory)  # what the splice computes

    def minus(y, hook):
        y = y.clone()
        y[0, node["position"]] -= acts[0, node["position"], node["feature"]] * d.W_dec[node["feature"]]
        return y

    with torch.no_grad(), model.hooks({site: minus}):
        by_hand = model(src, tgt[:, :5])[0, 4, g.token].double()
    got = remove_features(model, dicts, src, tgt, g, [[], [i]])
    with torch.no_grad():
        plain = model(src, tgt[:, :5])[0, 4, g.token].double()
    assert abs(float(got[0]) - float(plain)) < 1e-5  # nothing clamped: the model itself
    assert abs(float(got[1]) - float(by_hand)) < 1e-5
    assert abs(float(got[1]) - float(got[0])) > 1e-6


def test_the_feature_check_reports_predicted_and_real_drops(model):
    src, tgt = one_sentence(model.cfg)
    dicts = tiny_dictionaries(model)
    g = feature_graph(model, dicts, src, tgt, position=4)
    out = feature_check(model, dicts, src, tgt, g, k=3, random_sets=4)
    assert set(out) == {"logit", "top_drop", "top_predicted", "gxa_drop", "random_drop", "random_predicted"}
    assert abs(out["logit"] - g.logit) < 1e-4
    top = sorted(g.attribution[feature_nodes(g)].tolist(), reverse=True)[:3]
    assert abs(out["top_predicted"] - sum(top)) < 1e-12


def test_influence_solved_in_node_order_equals_the_power_series(model, monkeypatch):
    src, tgt = one_sentence(model.cfg)
    g = feature_graph(model, tiny_dictionaries(model), src, tgt, position=4)
    monkeypatch.setattr(graph_module, "ORDERED_INFLUENCE", 10**9)
    series = graph_module.node_influence(g.adjacency)
    monkeypatch.setattr(graph_module, "ORDERED_INFLUENCE", 0)
    ordered = graph_module.node_influence(g.adjacency)
    torch.testing.assert_close(ordered, series, rtol=1e-12, atol=1e-15)
    n = len(g.nodes)
    perm = torch.cat([torch.arange(n - 2, -1, -1), torch.tensor([n - 1])])  # not a topological order: edges run up
    moved = graph_module.node_influence(g.adjacency[perm][:, perm])  # the logit still last
    torch.testing.assert_close(moved, series[perm], rtol=1e-12, atol=1e-15)


def test_interventions_share_a_splice_the_caller_holds(model):
    src, tgt = one_sentence(model.cfg)
    dicts = tiny_dictionaries(model)
    g = feature_graph(model, dicts, src, tgt, position=4)
    i = g.index(kind="feature", site=model.hook_memory.name)[0]
    alone = remove_features(model, dicts, src, tgt, g, [[i]])
    held = splice(model, dicts[model.hook_memory.name])  # as the app keeps a picked dictionary
    try:
        shared = remove_features(model, dicts, src, tgt, g, [[i]])
        assert model.hook_memory.sae.users == 1
    finally:
        held.remove()
    torch.testing.assert_close(shared, alone, rtol=0, atol=0)


def test_progress_counts_every_step_once(model):
    src, tgt = one_sentence(model.cfg)
    seen = []
    feature_graph(model, tiny_dictionaries(model), src, tgt, position=2, progress=lambda done, total: seen.append(
        (done, total)))
    assert seen[-1][0] == seen[-1][1] and [d for d, _ in seen] == list(range(1, seen[-1][1] + 1))


@pytest.mark.parametrize("target", ["runner-up", "demeaned"])
def test_other_targets_are_complete(model, target):
    src, tgt = one_sentence(model.cfg)
    g = feature_graph(model, tiny_dictionaries(model), src, tgt, position=3, target=target)
    assert abs(float(g.adjacency[-1].sum()) - g.logit) <= 1e-10 * max(1.0, abs(g.logit))
    inner = [i for i, n in enumerate(g.nodes) if n["kind"] in ("head", "ffn", "feature")]
    torch.testing.assert_close(g.adjacency[inner].sum(1), g.attribution[inner], rtol=0, atol=1e-10)


def test_encoder_and_self_attention_sites_too(model):
    """SAEs on an encoder self-attention and a decoder self-attention output, a transcoder on an encoder FFN: the
    same reading rules (the pattern over the stack's own keys; the FFN's own position)."""
    d = model.cfg.d_model
    enc_attn, dec_attn = model.enc[0].self_attn.hook_out.name, model.dec[1].self_attn.hook_out.name
    dicts = {enc_attn: random_dictionary(DictionaryConfig(enc_attn, d, 24, "topk", 4), 21),
             dec_attn: random_dictionary(DictionaryConfig(dec_attn, d, 24, "topk", 4), 22),
             "enc.1.ffn": random_dictionary(DictionaryConfig(ffn_input_hook(model, "enc", 1), d, 24, "topk", 4,
                                                             d_out=d, hook_name_out=model.enc[1].ffn.hook_out.name),
                                            23)}
    src, tgt = one_sentence(model.cfg)
    g = feature_graph(model, dicts, src, tgt, position=4)
    A, a = g.adjacency, g.attribution
    assert abs(float(A[-1].sum()) - g.logit) <= 1e-10 * abs(g.logit)
    reads = [i for i, n in enumerate(g.nodes) if n["kind"] != "logit"]
    torch.testing.assert_close(A[:, reads].sum(0), a[reads], rtol=0, atol=1e-10)
    inner = [i for i, n in enumerate(g.nodes) if n["kind"] in ("head", "ffn", "feature")]
    torch.testing.assert_close(A[inner].sum(1), a[inner], rtol=0, atol=1e-10)
    assert not g.index(kind="head", stack="enc", layer=0) and not g.index(kind="ffn", stack="enc", layer=1)
    assert {g.nodes[i]["site"] for i in feature_nodes(g)} == set(dicts)


def test_gradient_x_activation_matches_a_finite_difference_in_the_real_model(model):
    src, tgt = one_sentence(model.cfg)
    dicts = tiny_dictionaries(model)
    g = feature_graph(model, dicts, src, tgt, position=4, target="demeaned")
    gxa = feature_gradient_x_activation(model, dicts, src, tgt, g)
    feats = feature_nodes(g)
    assert bool(gxa[feats].any()) and not bool(gxa[[i for i in range(len(g.nodes)) if i not in feats]].any())
    model64 = copy.deepcopy(model).double()
    for i in [feats[int(gxa[feats].abs().argmax())], feats[0]]:
        node = g.nodes[i]
        d = dicts[node["site"]]
        site = site_module(model64, node["site"])
        name = site.name if isinstance(site, HookPoint) else site.hook_out.name  # an SAE's point; an FFN's output
        values = []
        for sign in (1, -1):
            def nudge(y, hook, sign=sign, node=node, d=d):
                y = y.clone()
                y[0, node["position"]] += sign * 1e-6 * node["activation"] * d.W_dec[node["feature"]].double()
                return y
            with torch.no_grad(), model64.hooks({name: nudge}):
                logits = model64(src, tgt[:, :5])[0, 4]
            values.append(float(logits[g.token] - logits.mean()))
        assert abs((values[0] - values[1]) / 2e-6 - float(gxa[i])) <= 1e-4 * max(1.0, abs(float(gxa[i])))


def test_the_size_is_known_before_the_graph_is_built(model):
    src, tgt = one_sentence(model.cfg)
    dicts = tiny_dictionaries(model)
    for position in (0, 4):
        for head_nodes in (False, True):
            assert feature_graph_size(model, dicts, src, tgt, position, head_nodes=head_nodes) == len(
                feature_graph(model, dicts, src, tgt, position, head_nodes=head_nodes).nodes)
    assert feature_graph_size(model, {}, src, tgt, 3, head_nodes=True) == len(attribution_graph(model, src, tgt,
                                                                                                3).nodes)
    assert feature_graph_size(model, {}, src, tgt, 3) == len(feature_graph(model, {}, src, tgt, 3).nodes)

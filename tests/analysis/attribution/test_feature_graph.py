"""Feature-level attribution graphs on a tiny model with small random dictionaries (an SAE on hook_memory, an SAE on a
cross-attention block's output and a skip transcoder on a decoder FFN, at once; pre- and post-norm): completeness,
each node's edges in and out sum to its attribution, a feature's attribution is what removing it changes in the
replacement model, the real-model interventions clamp the right feature, and the nodes carry what the exporter and
the app read."""

from __future__ import annotations

import copy

import pytest
import torch
from dictionary_helpers import random_dictionary, tiny_dictionaries
from model_helpers import graph_model, one_sentence

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
from workbench.core.hooks import HookPoint
from workbench.core.replacement import FEATURES, FREEZABLE, ReplacementModel
from workbench.core.splice import site_module
from workbench.features.dictionary import DictionaryConfig
from workbench.features.sites import ffn_input_hook, splice


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def model(request):
    return graph_model(norm_first=request.param)


@pytest.mark.parametrize("architecture", ["topk", "jumprelu", "batchtopk", "relu"])
def test_completeness_and_every_nodes_edges_sum_to_its_attribution(model, architecture):
    src, tgt = one_sentence(model.cfg)
    dicts = tiny_dictionaries(model, architecture=architecture)
    g = feature_graph(model, dicts, src, tgt, position=4)
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
    assert not g.index(kind="head", stack="dec", layer=1, block="cross_attn")
    assert not g.index(kind="ffn", stack="dec", layer=0)
    assert g.index(kind="head", stack="dec", layer=0, block="cross_attn")  # no dictionary: heads stay
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


def test_without_dictionaries_nothing_changes(model):
    src, tgt = one_sentence(model.cfg)
    g = feature_graph(model, {}, src, tgt, position=3)
    h = attribution_graph(model, src, tgt, position=3)
    assert [n["label"] for n in g.nodes] == [n["label"] for n in h.nodes]
    torch.testing.assert_close(g.adjacency, h.adjacency, rtol=0, atol=1e-12)


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
        assert feature_graph_size(model, dicts, src, tgt, position) == len(
            feature_graph(model, dicts, src, tgt, position).nodes)
    assert feature_graph_size(model, {}, src, tgt, 3) == len(attribution_graph(model, src, tgt, 3).nodes)

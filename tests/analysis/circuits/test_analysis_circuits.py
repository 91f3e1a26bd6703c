"""Circuit discovery (workbench.analysis.circuits.circuits): the frozen-norm graph model reproduces the clean and
corrupted runs, EAP is exact where the model is linear and agrees with exact edge patching elsewhere, circuits are
scored."""

from __future__ import annotations

import pytest
import torch
from model_helpers import ROOT, SHARED_DATA, make_model

from workbench import presets
from workbench.analysis.attribution.attribution import spearman
from workbench.analysis.circuits.circuits import (
    EdgeGraph,
    Pair,
    _Frozen,
    _removal_estimates,
    circuit_faithfulness,
    circuit_metric,
    edge_patching,
    edge_scores,
    flips,
    iterative_circuits,
    node_circuit,
    node_scores,
)


def _pairs(cfg, n=2, seed=3):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        src = torch.randint(4, cfg.src_vocab, (1, 7), generator=g)
        src[0, -1] = cfg.eos_id
        bad = src.clone()
        bad[0, 2] = (src[0, 2] + 7) % (cfg.src_vocab - 4) + 4
        tgt = torch.randint(4, cfg.tgt_vocab, (1, 5), generator=g)
        tgt[0, 0] = cfg.start_id
        out.append(Pair(src, bad, tgt, 3, 10, 11))
    return out


@pytest.fixture(scope="module", params=[False, True], ids=["post-norm", "pre-norm"])
def model(request):
    return make_model(presets.tiny(vocab=40, norm_first=request.param), seed=1)


def test_graph_splits_cross_attention_into_query_and_key_value(model):
    g = EdgeGraph(model)
    enc = [i for i, s in enumerate(g.senders) if s == "src_embed" or s.startswith(("enc", "enc_self"))]
    dec = [i for i in range(len(g.senders)) if i not in enc]
    for r, name in enumerate(g.receivers):
        if name.startswith("cross:") and name[-1] in "kv":
            assert g.valid[enc, r].all() and not g.valid[dec, r].any(), name
        elif name.startswith(("cross:", "dec", "logits")):
            assert not g.valid[enc, r].any(), name
    # each cross head has three receivers; edges into the first decoder layer's self-attention: the embedding only
    assert sum(n.startswith("cross:0:0.") for n in g.receivers) == 3
    assert g.valid[:, g.r_index["dec_self:0:0.q"]].nonzero()[:, 0].tolist() == [g.s_index["tgt_embed"]]


def test_frozen_model_reproduces_clean_and_corrupted(model):
    g = EdgeGraph(model)
    net = _Frozen(model, g, _pairs(model.cfg)[0])
    net.prepare()
    with torch.no_grad():
        assert float(net.run()[0][0]) == pytest.approx(net.real_clean, abs=1e-5)
        everything = torch.zeros(1, len(g.senders), len(g.receivers))
        assert float(net.run(everything)[0][0]) == pytest.approx(net.corrupted_metric, abs=1e-5)
        res = circuit_metric(model, [_pairs(model.cfg)[0]], [g.edges(), []], flipping_only=False)
    # against the frozen-norm corrupted run, every edge is 1 and none is 0 by construction; against the real
    # corrupted run, no edge is where the frozen-norm model lands, which the real corrupted run is not
    assert res["normalized_frozen"].tolist() == pytest.approx([1.0, 0.0], abs=1e-4)
    real = (res["corrupted"] - res["real_corrupted"]) / (res["clean"] - res["real_corrupted"])
    assert res["normalized"].tolist() == pytest.approx([1.0, real], abs=1e-4)
    assert res["corrupted"] != pytest.approx(res["real_corrupted"], abs=1e-4)


def test_eap_is_exact_on_edges_into_the_logits_and_agrees_with_patching(model):
    pairs = _pairs(model.cfg)
    g = EdgeGraph(model)
    eap = edge_scores(model, pairs, method="eap")
    edges = g.edges()
    exact = edge_patching(model, pairs, edges)
    est = eap.scores[tuple(torch.tensor(edges).T)]
    # the logits are linear in their input once the final norm is frozen: first order is exact there
    into_logits = [k for k, (_, r) in enumerate(edges) if g.receivers[r] == "logits"]
    assert torch.allclose(est[into_logits], exact[into_logits], atol=1e-5)
    assert float(spearman(est.numpy(), exact.numpy())) > 0.8
    ig = edge_scores(model, pairs, method="eap-ig", steps=8)
    assert float(spearman(ig.scores[tuple(torch.tensor(edges).T)].numpy(), exact.numpy())) > 0.6
    assert (eap.scores[~g.valid] == 0).all()


def test_circuit_faithfulness_and_greedy_search(model):
    pairs = _pairs(model.cfg)
    scores = edge_scores(model, pairs, method="eap")
    g = scores.graph
    chosen = g.greedy_edges(scores.scores, 30)
    assert 0 < len(chosen) <= 30
    fed = {g.receiver_node(r) for _, r in chosen}
    assert all(g.senders[u].endswith("_embed") or g.senders[u] in fed for u, _ in chosen)
    assert any(g.receivers[r] == "logits" for _, r in chosen)
    f = circuit_faithfulness(model, pairs, scores, 30, random_circuits=3)
    assert f["n_edges"] == len(chosen) and len(f["random_faithfulness"]) == 3
    with pytest.raises(ValueError, match="method"):
        edge_scores(model, pairs, method="acdc")


def test_connected_drops_edges_that_reach_no_logit(model):
    g = EdgeGraph(model)
    s, r = g.s_index, g.r_index
    path = [(s["src_embed"], r["cross:0:0.v"]), (s["cross:0:0"], r["logits"])]
    dangling = (s["src_embed"], r["enc.0.ffn"])  # enc.0.ffn sends nothing on: its input edge carries nothing
    unfed = (s["dec.0.ffn"], r["logits"])  # nothing feeds dec.0.ffn: it outputs its corrupted value
    assert g.connected([*path, dangling, unfed]) == path
    # the greedy search's circuits are connected both ways
    scores = edge_scores(model, _pairs(model.cfg), method="eap")
    for n in (5, 30):
        chosen = g.greedy_edges(scores.scores, n)
        assert g.connected(chosen) == chosen


def test_removal_estimates_are_eap_at_the_whole_graph_and_exact_into_the_logits(model):
    pairs = _pairs(model.cfg)
    g = EdgeGraph(model)
    nets = [_Frozen(model, g, p) for p in pairs]
    for net in nets:
        net.prepare()
    # at the whole graph the estimate is EAP's score
    eap = edge_scores(model, pairs, method="eap").scores
    assert torch.allclose(_removal_estimates(nets, g.edges()), eap, atol=1e-5)
    # at a partial circuit, removing an edge into the logits is linear: the estimate equals the exact change
    circuit = iterative_circuits(model, pairs, [60])[60]
    est = _removal_estimates(nets, circuit)
    into = [e for e in circuit if g.receivers[e[1]] == "logits"]
    assert into
    res = circuit_metric(model, pairs, [circuit] + [[c for c in circuit if c != e] for e in into])
    exact = res["circuit"][1:] - res["circuit"][0]
    want = [float(est[e]) for e in into]
    assert torch.allclose(torch.tensor(want, dtype=torch.float64), exact, atol=1e-4)
    # edges outside the circuit: adding one back into the logits changes the metric by minus the estimate
    drop = into[::2]
    base = [c for c in circuit if c not in drop]
    est = _removal_estimates(nets, base)
    res = circuit_metric(model, pairs, [base] + [base + [e] for e in drop])
    exact = res["circuit"][1:] - res["circuit"][0]
    want = [-float(est[e]) for e in drop]
    assert torch.allclose(torch.tensor(want, dtype=torch.float64), exact, atol=1e-4)


def test_iterative_circuits_are_connected_and_faithful(model):
    pairs = _pairs(model.cfg)
    g = EdgeGraph(model)
    out = iterative_circuits(model, pairs, [g.n_edges, 120, 30])
    assert sorted(out) == [30, 120, g.n_edges] and out[g.n_edges] == g.edges()
    assert 0 < len(out[30]) <= 30 and len(out[120]) <= 120
    assert all(g.connected(c) == c for c in out.values())
    # the steps stop at each requested size: a circuit asked for alone comes from its own trajectory
    alone = iterative_circuits(model, pairs, [30])[30]
    res = circuit_metric(model, pairs, [alone])
    f = circuit_faithfulness(model, pairs, edge_scores(model, pairs, method="eap"), 30, random_circuits=5,
                             search="iterative")
    assert f["n_edges"] == len(alone) and f["faithfulness"] == pytest.approx(float(res["normalized"][0]), abs=1e-4)
    # this random model's corrupted source barely moves the real run (clean - real corrupted ~ 0), so the real
    # normalisation divides by noise here; the frozen-norm one is the measure that means something on it
    assert f["faithfulness_frozen"] > max(f["random_faithfulness_frozen"])
    with pytest.raises(ValueError, match="step"):
        iterative_circuits(model, pairs, [30], step=1.0)
    with pytest.raises(ValueError, match="sizes"):
        iterative_circuits(model, pairs, [0])


@pytest.mark.slow
def test_shipped_number_pairs_eap_matches_exact_patching():
    """Real Multi30k pairs (test2016, "Der Mann" -> "Die Männer") on the shipped de->en model: EAP against exact
    edge patching on 120 sampled edges."""
    from workbench import load
    from workbench.analysis.circuits.contrast import NUMBER_DE, word_swaps

    tm = load(ROOT / "checkpoints" / "multi30k-de-en")
    texts = (SHARED_DATA / "multi30k" / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    pairs = word_swaps(tm, texts[:300], NUMBER_DE, max_pairs=2)
    assert pairs and all(p.src.shape == p.corrupted_src.shape for p in pairs)
    g = EdgeGraph(tm.model)
    edges = g.edges()
    sample = [edges[i] for i in torch.randperm(len(edges), generator=torch.Generator().manual_seed(0))[:120]]
    exact = edge_patching(tm.model, pairs, sample)
    est = edge_scores(tm.model, pairs, method="eap").scores[tuple(torch.tensor(sample).T)]
    assert float(spearman(est.numpy(), exact.numpy())) > 0.8


def test_pairs_that_do_not_flip_are_flagged_and_left_out(model):
    pairs = _pairs(model.cfg, n=4)
    g = EdgeGraph(model)
    every = circuit_metric(model, pairs, [g.edges()[:40]], flipping_only=False)
    assert not every["flipping_only"] and every["n_pairs"] == 4 and every["per_pair"].shape == (4, 1)
    clean = torch.tensor([float(_Frozen(model, g, p).real_clean) for p in pairs], dtype=torch.float64)
    real = torch.tensor([float(_Frozen(model, g, p).real_corrupted) for p in pairs], dtype=torch.float64)
    assert every["flipping"].tolist() == ((clean > 0) & (real < 0)).tolist() == flips(clean, real).tolist()
    # one pair made to flip: only it is used
    flipped = [Pair(p.src, p.corrupted_src, p.tgt, p.position, p.bad, p.good) if c < 0 else p
               for p, c in zip(pairs, clean.tolist())]
    # swapping good and bad negates both runs' metric: pick the pair whose two runs now disagree in sign the right way
    res = circuit_metric(model, flipped, [g.edges()[:40]])
    if res["flipping_only"]:
        assert res["n_pairs"] == int(res["flipping"].sum()) < 4 or res["flipping"].all()
        used = res["per_pair"][:, 0]
        q = res["quartiles"][0]
        assert q["q1"] <= q["median"] <= q["q3"] and used.min() <= q["median"] <= used.max()


def test_node_circuits_keep_every_edge_among_their_nodes(model):
    pairs = _pairs(model.cfg)
    scores = edge_scores(model, pairs, method="eap")
    g = scores.graph
    totals = node_scores(scores)
    assert set(totals) == {n for n in g.senders if not n.endswith("_embed")}
    name = min(totals, key=totals.get)
    assert totals[name] == pytest.approx(float((scores.scores * g.valid)[g.s_index[name]].sum()), abs=1e-9)
    edges = node_circuit(g, ["cross:0:0", "dec.1.ffn"])
    kept = {g.senders[u] for u, _ in edges} | {g.receiver_node(r) for _, r in edges}
    assert kept <= {"src_embed", "tgt_embed", "cross:0:0", "dec.1.ffn", "logits"}
    assert (g.s_index["cross:0:0"], g.r_index["logits"]) in edges
    assert node_circuit(g, [n for n in g.senders if not n.endswith("_embed")]) == g.connected(g.edges())
    f = circuit_faithfulness(model, pairs, scores, 60, random_circuits=2, search="nodes", flipping_only=False)
    assert 0 < f["n_edges"] <= 60 and "faithfulness_frozen" in f
    with pytest.raises(ValueError, match="unknown nodes"):
        node_circuit(g, ["cross:9:9"])


def test_eap_ig_over_activations_agrees_with_patching(model):
    pairs = _pairs(model.cfg)
    g = EdgeGraph(model)
    edges = g.edges()
    exact = edge_patching(model, pairs, edges)
    act = edge_scores(model, pairs, method="eap-ig-activations", steps=8)
    est = act.scores[tuple(torch.tensor(edges).T)]
    assert float(spearman(est.numpy(), exact.numpy())) > 0.6
    # edges into the logits: the metric is linear in the logits' input, so every method is exact there
    into_logits = [k for k, (_, r) in enumerate(edges) if g.receivers[r] == "logits"]
    assert torch.allclose(est[into_logits], exact[into_logits], atol=1e-5)

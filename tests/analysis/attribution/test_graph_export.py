"""Attribution graphs as circuit-tracer's graph files: the export validates against the schema generated from
circuit-tracer's pydantic models, reads back to the adjacency's entries on the kept edges, is pruned exactly as
circuit-tracer's own `prune_graph` (a copy below, run on the same matrix in its node order) prunes, places every
node where the viewer can draw it, and plugs in feature nodes; on a tiny model and on the shipped de->en model."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

import jsonschema
import pytest
import torch
from model_helpers import ROOT, graph_model, one_sentence

from workbench.analysis.attribution.graph import AttributionGraph, attribution_graph
from workbench.analysis.attribution.graph_export import (
    MEMORY_ROW,
    SCHEMA,
    circuit_tracer_graph,
    export_sentence,
    graph_rows,
    prune_graph,
    token_probability,
    validate_circuit_tracer,
    write_circuit_tracer,
)
from workbench.core.batching import decoder_input

# --------------------------------------------------------------------------- circuit-tracer's pruning, verbatim
# From circuit_tracer/graph.py (github.com/safety-research/circuit-tracer, d797c824, MIT licence): its node order
# is features, errors, tokens, logits; `graph` needs adjacency_matrix, input_tokens, logit_tokens,
# selected_features and logit_probabilities.


def _normalize_matrix(matrix):
    normalized = matrix.abs()
    return normalized / normalized.sum(dim=1, keepdim=True).clamp(min=1e-10)


def _compute_influence(A, logit_weights, max_iter=1000):
    current_influence = logit_weights @ A
    influence = current_influence
    iterations = 0
    while current_influence.any():
        if iterations >= max_iter:
            raise RuntimeError("no convergence")
        current_influence = current_influence @ A
        influence += current_influence
        iterations += 1
    return influence


def _compute_edge_influence(pruned_matrix, logit_weights):
    normalized_pruned = _normalize_matrix(pruned_matrix)
    pruned_influence = _compute_influence(normalized_pruned, logit_weights)
    pruned_influence += logit_weights
    return normalized_pruned * pruned_influence[:, None]


def _find_threshold(scores, threshold):
    sorted_scores = torch.sort(scores, descending=True).values
    cumulative_score = torch.cumsum(sorted_scores, dim=0) / torch.sum(sorted_scores)
    threshold_index = torch.searchsorted(cumulative_score, threshold)
    threshold_index = min(threshold_index, len(cumulative_score) - 1)
    return sorted_scores[threshold_index]


def circuit_tracer_prune_graph(graph, node_threshold=0.8, edge_threshold=0.98):
    n_tokens = len(graph.input_tokens)
    n_logits = len(graph.logit_tokens)
    n_features = len(graph.selected_features)
    logit_weights = torch.zeros(graph.adjacency_matrix.shape[0], dtype=graph.adjacency_matrix.dtype)
    logit_weights[-n_logits:] = graph.logit_probabilities
    node_influence = _compute_influence(_normalize_matrix(graph.adjacency_matrix), logit_weights)
    node_mask = node_influence >= _find_threshold(node_influence, node_threshold)
    node_mask[-n_logits - n_tokens:] = True
    pruned_matrix = graph.adjacency_matrix.clone()
    pruned_matrix[~node_mask] = 0
    pruned_matrix[:, ~node_mask] = 0
    edge_scores = _compute_edge_influence(pruned_matrix, logit_weights)
    edge_mask = edge_scores >= _find_threshold(edge_scores.flatten(), edge_threshold)
    old_node_mask = node_mask.clone()
    node_mask[: -n_logits - n_tokens] &= edge_mask[:, : -n_logits - n_tokens].any(0)
    node_mask[:n_features] &= edge_mask[:n_features].any(1)
    while not torch.all(node_mask == old_node_mask):
        old_node_mask[:] = node_mask
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
        node_mask[: -n_logits - n_tokens] &= edge_mask[:, : -n_logits - n_tokens].any(0)
        node_mask[:n_features] &= edge_mask[:n_features].any(1)
    sorted_scores, sorted_indices = torch.sort(node_influence, descending=True)
    cumulative_scores = torch.cumsum(sorted_scores, dim=0) / torch.sum(sorted_scores)
    final_scores = torch.zeros_like(node_influence)
    final_scores[sorted_indices] = cumulative_scores
    return node_mask, edge_mask, final_scores


class _CTGraph(NamedTuple):
    adjacency_matrix: torch.Tensor
    input_tokens: list
    logit_tokens: list
    selected_features: list
    logit_probabilities: torch.Tensor


def in_circuit_tracer_order(g: AttributionGraph) -> tuple[_CTGraph, torch.Tensor]:
    """Our graph permuted into circuit-tracer's node order (heads and FFNs as its features; the bias with the
    errors: nodes without inputs) and the permutation (new index -> ours)."""
    kinds = [n["kind"] for n in g.nodes]
    groups = [[i for i, k in enumerate(kinds) if k in ks] for ks in (("head", "ffn"), ("error", "bias"), ("embed",),
                                                                      ("logit",))]
    perm = torch.tensor([i for grp in groups for i in grp])
    adj = g.adjacency[perm][:, perm]
    return _CTGraph(adj, groups[2], groups[3], groups[0], torch.tensor([0.37], dtype=adj.dtype)), perm


# --------------------------------------------------------------------------------------------------- the tests


def round_trip(data: dict) -> dict:
    return json.loads(json.dumps(data))


def assert_reads_back(g: AttributionGraph, data: dict, *, src_len: int, enc_layers: int,
                      node_threshold: float = 0.8, edge_threshold: float = 0.98) -> None:
    """Map the file's nodes back to the graph through the documented layout (rows: encoder layer i's self-attention
    2i, its FFN 2i + 1; decoder layer j's self-attention, cross-attention, FFN 2E + 3j + 0, 1, 2), then: every link
    is the adjacency entry of a kept edge, every kept edge between exported nodes is a link, and every exported node
    but the embeddings and the logit has one."""
    kept = prune_graph(g, node_threshold, edge_threshold)
    n_rows = 2 * enc_layers + 3 * len({n["layer"] for n in g.nodes if n["stack"] == "dec" and n["kind"] == "ffn"})
    back = {}
    for i, node in enumerate(g.nodes):
        k = node["kind"]
        ctx = 0 if node["position"] is None else node["position"] + (src_len if node["stack"] == "dec" else 0)
        if k in ("head", "ffn", "error"):
            block = "ffn" if k == "error" else node["block"]
            row = (2 * node["layer"] + ("self_attn", "ffn").index(block) if node["stack"] == "enc" else
                   2 * enc_layers + 3 * node["layer"] + ("self_attn", "cross_attn", "ffn").index(block))
        layer = {"embed": "E", "bias": "E", "logit": str(n_rows)}.get(k) or str(row)
        feature = {"embed": ctx, "bias": -1, "error": -1, "ffn": 0, "logit": g.token}.get(k, node["head"])
        back[f"{layer}_{feature}_{ctx}"] = i
    exported = {n["node_id"]: n for n in data["nodes"]}
    assert set(exported) <= set(back) and all(kept.node_mask[back[x]] for x in exported)
    links = {(back[x["source"]], back[x["target"]]): x["weight"] for x in data["links"]}
    assert len(links) == len(data["links"]) > 0
    known = {back[x] for x in exported}
    assert set(links) == {(s, t) for t, s in kept.edge_mask.nonzero().tolist() if s in known and t in known}
    for (s, t), w in links.items():
        assert w == float(g.adjacency[t, s]) and w != 0
    linked = {x for pair in links for x in pair}
    for node_id, n in exported.items():
        assert back[node_id] in linked or n["feature_type"] in ("embedding", "logit")


@pytest.mark.parametrize("norm_first", [False, True])
def test_tiny_graph_exports_validates_and_reads_back(norm_first):
    m = graph_model(norm_first)
    src, tgt = one_sentence(m.cfg)
    g = attribution_graph(m, src, tgt, position=4, src_tokens=[f"s{i}" for i in range(8)],
                          tgt_tokens=["<s>", "a", "b", "c", "d"])
    p = token_probability(m, src, tgt, g)
    with torch.no_grad():
        assert p == pytest.approx(float(m(src, tgt[:, :5])[0, 4].softmax(-1)[g.token]), rel=1e-5)
    data = round_trip(circuit_tracer_graph(g, slug="tiny", token_prob=p, token_str="tok"))
    validate_circuit_tracer(data)
    assert data["metadata"]["prompt_tokens"] == [f"s{i}" for i in range(8)] + ["<s>", "a", "b", "c", "d"]
    assert data["qParams"]["linkType"] == "both" and data["metadata"]["node_threshold"] == 0.8

    assert_reads_back(g, data, src_len=8, enc_layers=m.cfg.enc_layers)
    # the logit node as the viewer parses it (util-cg.js: the token between quotes, the probability after "(p=")
    logit = [n for n in data["nodes"] if n["feature_type"] == "logit"]
    assert len(logit) == 1 and logit[0]["is_target_logit"] and logit[0]["token_prob"] == p
    assert logit[0]["clerp"].split('"')[1] == "tok"
    assert float(logit[0]["clerp"].split("(p=")[1].split(")")[0]) == pytest.approx(p, abs=5e-4)
    assert logit[0]["ctx_idx"] == 8 + 4 and int(logit[0]["layer"]) == 1 + max(
        int(n["layer"]) for n in data["nodes"] if n["layer"] != "E" and n["feature_type"] != "logit")


@pytest.mark.parametrize("thresholds", [(0.8, 0.98), (0.5, 0.9), (0.95, 0.995)])
def test_pruning_is_circuit_tracers(thresholds):
    m = graph_model(False)
    src, tgt = one_sentence(m.cfg, s=7, t=6, seed=3)
    g = attribution_graph(m, src, tgt, position=5, target="runner-up")
    ours = prune_graph(g, *thresholds)
    ct, perm = in_circuit_tracer_order(g)
    node_mask, edge_mask, scores = circuit_tracer_prune_graph(ct, *thresholds)
    assert torch.equal(ours.node_mask[perm], node_mask)
    assert torch.equal(ours.edge_mask[perm][:, perm], edge_mask)
    assert torch.allclose(ours.cumulative_scores[perm], scores, rtol=1e-9, atol=1e-12)
    assert 0 < int(node_mask.sum()) < len(g.nodes) and 0 < int(edge_mask.sum())
    with pytest.raises(ValueError, match="edge_threshold"):
        prune_graph(g, 0.8, 1.5)
    # the logit node says what the target is: here the difference to the runner-up (named by id without a label)
    logit = next(n for n in circuit_tracer_graph(g, slug="r", token_prob=0.5)["nodes"] if n["feature_type"] == "logit")
    assert logit["clerp"] == f'Output "{g.token}" (p=0.500) minus "{g.baseline_token}"'
    demeaned = attribution_graph(m, src, tgt, position=5, target="demeaned")
    logit = next(n for n in circuit_tracer_graph(demeaned, slug="d", token_prob=0.5, token_str="x")["nodes"]
                 if n["feature_type"] == "logit")
    assert logit["clerp"] == 'Output "x" (p=0.500) minus the mean logit'


def test_feature_nodes_plug_in_and_clashes_are_refused():
    """A feature-level graph's nodes: on the row of their sub-layer (hook_memory's: a row of its own between the
    encoder's and the decoder's), typed as circuit-tracer types its transcoder features, with their activation."""
    nodes = [
        {"kind": "embed", "stack": "enc", "layer": None, "head": None, "block": None, "position": 0, "token": "Hund",
         "label": "src 0 Hund"},
        {"kind": "embed", "stack": "dec", "layer": None, "head": None, "block": None, "position": 0, "token": "<s>",
         "label": "tgt 0 <s>"},
        {"kind": "ffn", "stack": "enc", "layer": 0, "head": None, "block": "ffn", "position": 0, "token": "Hund",
         "label": "enc.0.ffn @0"},
        {"kind": "feature", "stack": "enc", "layer": None, "block": None, "position": 0, "feature": 17,
         "activation": 2.5, "token": "Hund", "label": "hook_memory #17 @0", "site": "hook_memory"},
        {"kind": "feature", "stack": "dec", "layer": 1, "block": "ffn", "position": 0, "feature": 905,
         "activation": 0.75, "token": "<s>", "label": "dec.1.ffn #905 @0", "site": "dec.1.ffn"},
        {"kind": "head", "stack": "dec", "layer": 1, "head": 2, "block": "cross_attn", "position": 0, "token": "<s>",
         "label": "cross:1:2 @0"},
        {"kind": "logit", "stack": "dec", "layer": None, "head": None, "block": None, "position": 0, "token": 5,
         "label": "logit @0"},
    ]
    a = torch.zeros(7, 7, dtype=torch.float64)
    a[2, 0], a[3, 2], a[5, 3], a[4, 5], a[4, 1], a[6, 4] = 1.0, 0.8, 0.6, 0.5, 0.2, 0.9
    g = AttributionGraph(nodes, a, a.sum(1), 0.9, 0, 5, meta={"target": "logit"})
    data = round_trip(circuit_tracer_graph(g, slug="features", token_prob=0.4, token_str="dog",
                                           node_threshold=1.0, edge_threshold=1.0))
    validate_circuit_tracer(data)
    by_label = {n["clerp"].split(" “")[0]: n for n in data["nodes"]}
    rows = graph_rows(g)
    assert list(rows) == [("enc", 0, "ffn"), MEMORY_ROW, ("dec", 1, "cross_attn"), ("dec", 1, "ffn")]
    memory, transcoder = by_label["hook_memory #17 @0"], by_label["dec.1.ffn #905 @0"]
    assert (memory["layer"], memory["feature"], memory["ctx_idx"], memory["activation"]) == ("1", 17, 0, 2.5)
    assert (transcoder["layer"], transcoder["feature"], transcoder["ctx_idx"]) == ("3", 905, 1)
    assert memory["feature_type"] == transcoder["feature_type"] == "cross layer transcoder"
    assert by_label["cross:1:2 @0"]["layer"] == "2" and by_label["cross:1:2 @0"]["activation"] is None
    assert len(data["links"]) == 6 and data["nodes"][-1]["layer"] == "4"
    assert (data["metadata"]["scan"], data["metadata"]["transcoder_list"]) == ("attention-workbench", [])

    # where the viewer finds the features' files (features.circuit_tracer): circuit-tracer's custom scan, one
    # folder per row, looked up as transcoder_list[the node's layer]
    scans = {"hook_memory": "./data/features/hook_memory", "dec.1.ffn": "./data/features/dec.1.ffn"}
    data = round_trip(circuit_tracer_graph(g, slug="features", token_prob=0.4, node_threshold=1.0, edge_threshold=1.0,
                                           feature_scans=scans))
    validate_circuit_tracer(data)
    listed = data["metadata"]["transcoder_list"]
    assert data["metadata"]["scan"].startswith("custom-") and len(listed) == 5
    assert listed[int(memory["layer"])] == scans["hook_memory"] and listed[int(transcoder["layer"])] == scans[
        "dec.1.ffn"] and listed[0] == listed[2] == listed[4] == ""
    with pytest.raises(ValueError, match="lacks"):
        circuit_tracer_graph(g, slug="f", token_prob=0.4, node_threshold=1.0, edge_threshold=1.0,
                             feature_scans={"hook_memory": "./x"})
    same_row = [dict(n) for n in nodes]
    same_row[3].update(stack="dec", layer=1, block="ffn", feature=3)  # two dictionaries' features on one row
    with pytest.raises(ValueError, match="two dictionaries"):
        circuit_tracer_graph(AttributionGraph(same_row, a, a.sum(1), 0.9, 0, 5), slug="f", token_prob=0.4,
                             node_threshold=1.0, edge_threshold=1.0, feature_scans=scans)

    # without a block, a feature's row comes from its site (as analysis.qk_attribution labels its features), else
    # the end of its layer (here dec.1's rows: cross-attention, and the FFN a dec.1.ffn site implies) or, entering
    # a layer, the end of the one before (dec.0 has no row here: the stack's first)
    # (rows here: enc.0.ffn 0, hook_memory's own 1, dec.1's cross-attention 2 and FFN 3)
    for site, block, want in (("dec.1.cross_attn.hook_out", None, "2"), ("dec.1.ffn", None, "3"),
                              ("dec.1.hook_resid_in", None, "2"), ("dec.1.hook_resid_cross_attn", None, "2"),
                              ("hook_memory", None, "1")):
        placed = [dict(n) for n in nodes]
        placed[4].update(site=site, block=block, layer=None if site == "hook_memory" else 1,
                         stack="enc" if site == "hook_memory" else "dec")
        got = circuit_tracer_graph(AttributionGraph(placed, a, a.sum(1), 0.9, 0, 5), slug="p", token_prob=0.4,
                                   node_threshold=1.0, edge_threshold=1.0)
        assert next(n["layer"] for n in got["nodes"] if n["feature"] == 905) == want, site

    clash = [dict(n) for n in nodes]
    clash[3].update(feature=0, layer=0, block="ffn")  # feature 0 on enc.0.ffn's row at position 0: the FFN's own id
    with pytest.raises(ValueError, match="share a"):
        circuit_tracer_graph(AttributionGraph(clash, a, a.sum(1), 0.9, 0, 5), slug="x", token_prob=0.4,
                             node_threshold=1.0, edge_threshold=1.0)
    odd = [dict(n) for n in nodes]
    odd[5]["kind"] = "mystery"
    with pytest.raises(ValueError, match="cannot place"):
        circuit_tracer_graph(AttributionGraph(odd, a, a.sum(1), 0.9, 0, 5), slug="x", token_prob=0.4,
                             node_threshold=1.0, edge_threshold=1.0)
    with pytest.raises(ValueError, match="slug"):
        circuit_tracer_graph(g, slug="a/b", token_prob=0.4)
    with pytest.raises(ValueError, match="token_prob"):
        circuit_tracer_graph(g, slug="a", token_prob=1.5)


def test_the_schema_is_circuit_tracers_and_catches_a_broken_file():
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert "d797c824c0ffe3a0274071e32d92962a36656212" in schema["$comment"]
    assert set(schema["$defs"]["Node"]["required"]) == {"node_id", "feature", "layer", "ctx_idx", "feature_type",
                                                         "jsNodeId"}
    m = graph_model(True)
    src, tgt = one_sentence(m.cfg)
    g = attribution_graph(m, src, tgt, position=2)
    data = round_trip(circuit_tracer_graph(g, slug="s", token_prob=0.2))
    for breaking in (lambda d: d["nodes"][0].update(layer=3), lambda d: d["metadata"].pop("prompt"),
                     lambda d: d["links"][0].update(weight="big"), lambda d: d.pop("qParams")):
        bad = round_trip(data)
        breaking(bad)
        with pytest.raises(jsonschema.ValidationError):
            validate_circuit_tracer(bad)
    bad = round_trip(data)
    bad["links"][0]["source"] = "nowhere"
    with pytest.raises(ValueError, match="nowhere"):
        validate_circuit_tracer(bad)


def test_shipped_model_graph_file_and_its_index(tmp_path):
    """On the shipped de->en model: the file on disk validates, lists the source and decoder pieces as its prompt,
    draws the encoder below the decoder, and graph-metadata.json indexes it as circuit-tracer's server expects."""
    from workbench.decoding.translator import load

    tm = load(ROOT / "checkpoints" / "multi30k-de-en")
    text = "Ein Hund läuft über eine grüne Wiese."
    src_ids, _ = tm.encode_source(text)
    out = tm.translate([text], return_tokens=True, beam=1)[0].tokens
    position = 2
    cfg = tm.model.cfg
    src = torch.tensor([src_ids])
    tgt = torch.tensor([decoder_input(list(out)[: position + 1], cfg.start_id)])
    src_pieces = tm.src_tokenizer.pieces(src_ids)
    tgt_pieces = ["<s>", *tm.tgt_tokenizer.pieces(list(out)[:position])]
    g = attribution_graph(tm.model, src, tgt, position=position, token=int(out[position]), src_tokens=src_pieces,
                          tgt_tokens=tgt_pieces)
    p = token_probability(tm.model, src, tgt, g)
    piece = tm.tgt_tokenizer.pieces([int(out[position])])[0]
    path = write_circuit_tracer(circuit_tracer_graph(g, slug="hund", token_prob=p, token_str=piece), tmp_path)
    data = json.loads(path.read_text(encoding="utf-8"))
    validate_circuit_tracer(data)
    assert data["metadata"]["prompt_tokens"] == src_pieces + tgt_pieces
    S = len(src_pieces)
    heads = [n for n in data["nodes"] if n["feature_type"] == "attention head"]
    assert heads and all(0 <= n["feature"] < 4 for n in heads)
    enc_rows = {int(n["layer"]) for n in data["nodes"] if n["layer"] != "E" and n["ctx_idx"] < S}
    dec_rows = {int(n["layer"]) for n in data["nodes"] if n["layer"] != "E" and n["ctx_idx"] >= S
                and n["feature_type"] != "logit"}
    assert enc_rows and dec_rows and max(enc_rows) < min(dec_rows) and max(dec_rows) < 4 * 2 + 4 * 3
    assert all(0 <= n["ctx_idx"] < S + position + 1 for n in data["nodes"])
    assert_reads_back(g, data, src_len=S, enc_layers=tm.model.cfg.enc_layers)
    assert len(data["links"]) == int(prune_graph(g).edge_mask.sum()) and 0 < p <= 1

    index = json.loads((tmp_path / "graph-metadata.json").read_text(encoding="utf-8"))
    assert [x["slug"] for x in index["graphs"]] == ["hund"] and index["graphs"][0] == data["metadata"]
    other = circuit_tracer_graph(g, slug="hund-2", token_prob=p, token_str=piece, node_threshold=0.5)
    write_circuit_tracer(other, tmp_path)
    write_circuit_tracer(circuit_tracer_graph(g, slug="hund", token_prob=p, token_str=piece), tmp_path)
    index = json.loads((tmp_path / "graph-metadata.json").read_text(encoding="utf-8"))
    assert [x["slug"] for x in index["graphs"]] == ["hund-2", "hund"]
    assert len(other["nodes"]) < len(data["nodes"])
    assert Path(tmp_path / "hund-2.json").is_file()


def test_the_graph_command_writes_a_file_per_output_token(tmp_path, capsys):
    from workbench.cli import main

    ckpt = str(ROOT / "checkpoints" / "multi30k-de-en")
    assert main(["graph", ckpt, "Ein Hund läuft.", "--reference", "A dog runs.", "--position", "1", "--position",
                 "3", "--target", "runner-up", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Ein-Hund-lauft-1.json", "Ein-Hund-lauft-3.json",
                                                          "graph-metadata.json"]
    data = json.loads((tmp_path / "Ein-Hund-lauft-1.json").read_text(encoding="utf-8"))
    validate_circuit_tracer(data)
    logit = next(n for n in data["nodes"] if n["feature_type"] == "logit")
    assert logit["clerp"].startswith('Output "▁dog" (p=') and ' minus "' in logit["clerp"]
    assert data["metadata"]["prompt_tokens"][-2:] == ["<s>", "▁A"]
    assert "Ein-Hund-lauft-3.json" in capsys.readouterr().out
    assert main(["graph", ckpt, "Ein Hund läuft.", "--reference", "A dog runs.", "--position", "9", "--out",
                 str(tmp_path)]) == 2
    assert "position 9 out of range" in capsys.readouterr().err


# circuit-tracer's formatData in Node: d3's few helpers it calls (max, min, sum, sort, jetpack's nestBy) and the page's
# `util` stood in for; it prints, per file, what the viewer would draw.
VIEWER_HARNESS = r"""
const fs = require('fs');
global.window = global;
const acc = (f) => (typeof f === 'function' ? f : (d) => d);
const finite = (a, f) => a.map(acc(f)).filter(x => x != null && !isNaN(x));
global.d3 = {
  max: (a, f) => { const v = finite(a, f); return v.length ? Math.max(...v) : undefined; },
  min: (a, f) => { const v = finite(a, f); return v.length ? Math.min(...v) : undefined; },
  sum: (a, f) => a.map(acc(f)).reduce((s, x) => s + (+x || 0), 0),
  sort: (a, f) => [...a].sort((x, y) => { const u = f(x), v = f(y); return u < v ? -1 : u > v ? 1 : 0; }),
  nestBy: (a, f) => {
    const m = new Map();
    a.forEach(d => { const k = f(d); if (!m.has(k)) m.set(k, []); m.get(k).push(d); });
    return [...m.entries()].map(([k, v]) => Object.assign(v, {key: k}));
  },
};
global.util = {params: {get: () => undefined, set: () => {}}, ppToken: (t) => t};
eval(fs.readFileSync(process.argv[2], 'utf8'));
(async () => {
  const out = [];
  for (const file of process.argv.slice(3)) {
    const data = JSON.parse(fs.readFileSync(file, 'utf8'));
    const g = await window.utilCg.formatData(data, {pinnedIds: [], isHideLayer: false});
    out.push({nodes: g.nodes.map(d => ({id: d.node_id, stream: d.streamIdx, ctx: d.ctx_idx, type: d.feature_type,
                                        layer: d.layer, pct: d.logitPct, token: d.logitToken, error: !!d.isError})),
              links: g.links.map(l => [l.sourceNode.node_id, l.targetNode.node_id, l.weight])});
  }
  console.log(JSON.stringify(out));
})();
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run circuit-tracer's viewer code")
def test_circuit_tracers_viewer_draws_every_node_and_link(tmp_path):
    """The shipped model's graphs of every output token of a sentence, through the viewer's own formatData
    (tests/data/circuit_tracer_util_cg.js): no node dropped or merged, every link attached, every node on a finite
    row, the encoder's rows below the decoder's, the logit on top with its token and probability."""
    from workbench.decoding.translator import load

    tm = load(ROOT / "checkpoints" / "multi30k-de-en")
    paths = export_sentence(tm, "Zwei Männer spielen Fußball im Park.", tmp_path)
    harness = tmp_path / "harness.js"
    harness.write_text(VIEWER_HARNESS, encoding="utf-8")
    viewer = Path(__file__).parents[2] / "data" / "circuit_tracer_util_cg.js"
    done = subprocess.run(["node", str(harness), str(viewer), *map(str, paths)], capture_output=True, text=True,
                          timeout=120, check=True)
    drawn = json.loads(done.stdout)
    assert len(drawn) == len(paths) > 3
    for path, g in zip(paths, drawn):
        data = json.loads(path.read_text(encoding="utf-8"))
        src_len = data["metadata"]["prompt_tokens"].index("<s>")
        assert sorted(n["id"] for n in g["nodes"]) == sorted(n["node_id"] for n in data["nodes"])
        assert sorted(map(tuple, g["links"])) == sorted((x["source"], x["target"], x["weight"])
                                                        for x in data["links"])
        assert all(isinstance(n["stream"], int) and n["stream"] >= 0 for n in g["nodes"])
        enc = [n["stream"] for n in g["nodes"] if n["type"] != "embedding" and n["ctx"] < src_len]
        dec = [n["stream"] for n in g["nodes"] if n["type"] not in ("embedding", "logit") and n["ctx"] >= src_len]
        assert not enc or not dec or max(enc) <= min(dec)
        logit = [n for n in g["nodes"] if n["type"] == "logit"]
        want = next(n for n in data["nodes"] if n["feature_type"] == "logit")
        assert len(logit) == 1 and logit[0]["stream"] == 1 + max(n["stream"] for n in g["nodes"] if n is not logit[0])
        assert logit[0]["pct"] == pytest.approx(want["token_prob"], abs=5e-4)
        assert logit[0]["token"] == want["clerp"].split('"')[1]
        assert all(n["error"] == (n["type"] == "mlp reconstruction error") for n in g["nodes"])


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_feature_graph_exports_with_its_site_errors(norm_first):
    """A real feature-level graph (an SAE on hook_memory and on a cross-attention output, a transcoder): each site's
    error nodes sit on their features' row apart from the layer's rounding error, the file validates, every node
    has its own place and every link is a kept edge's adjacency entry."""
    from dictionary_helpers import tiny_dictionaries

    from workbench.analysis.attribution.feature_graph import feature_graph

    m = graph_model(norm_first)
    src, tgt = one_sentence(m.cfg)
    g = feature_graph(m, tiny_dictionaries(m), src, tgt, position=4)
    site_errors = [n for n in g.nodes if n["kind"] == "error" and n.get("site")]
    assert {n["site"] for n in site_errors} >= {"hook_memory"} and len(site_errors) > 0
    data = round_trip(circuit_tracer_graph(g, slug="features", token_prob=0.5, node_threshold=1.0,
                                           edge_threshold=1.0))
    validate_circuit_tracer(data)
    ids = [n["node_id"] for n in data["nodes"]]
    assert len(ids) == len(set(ids))
    errors = [n for n in data["nodes"] if n["feature_type"] == "mlp reconstruction error"]
    assert any(n["feature"] == -2 for n in errors)  # the sites' errors; the layers' rounding errors (-1) hold ~0
    index = {n["node_id"]: n for n in data["nodes"]}
    kept = prune_graph(g, 1.0, 1.0)
    assert len(data["links"]) == int(kept.edge_mask[kept.node_mask][:, kept.node_mask].sum())
    assert all(x["source"] in index and x["target"] in index for x in data["links"])

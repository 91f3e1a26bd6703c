"""Feature-level graphs on the shipped multi30k-de-en with its shipped dictionaries (SAEs on hook_memory and the four
cross-attention outputs, the dec.1.ffn skip transcoder): complete in float64, every node's in-edges sum to its
attribution, the dictionaries' features replace those blocks' nodes, and a feature's attribution is what removing it
changes in the replacement model."""

from __future__ import annotations

import pytest
import torch
from model_helpers import ROOT

from workbench.analysis.attribution.feature_graph import (
    feature_details,
    feature_graph,
    feature_graph_size,
    feature_nodes,
    remove_features,
)
from workbench.core.batching import decoder_input
from workbench.core.replacement import FEATURES, FREEZABLE, ReplacementModel
from workbench.decoding.translator import load
from workbench.features.dictionary import SparseDictionary

CKPT = ROOT / "checkpoints" / "multi30k-de-en"
PAIR = ("Leute Reparieren das Dach eines Hauses.", "People are fixing the roof of a house.")  # test2016 line 5


@pytest.fixture(scope="module")
def shipped():
    tm = load(CKPT)
    cfg = tm.model.cfg
    dicts = {}
    for d in sorted((CKPT / "features").iterdir()):
        if d.is_dir():
            sd = SparseDictionary.load(d)
            dicts[sd.cfg.hook_name_out.rsplit(".hook_out", 1)[0] if sd.cfg.transcoder else sd.cfg.hook_name] = sd
    src = torch.tensor([tm.encode_source(PAIR[0])[0]])
    tgt = torch.tensor([decoder_input([*tm.tgt_tokenizer.encode(PAIR[1]), cfg.eos_id], cfg.start_id)])
    return tm.model, dicts, src, tgt


def test_complete_and_exact_on_the_shipped_model(shipped):
    model, dicts, src, tgt = shipped
    position = 4
    g = feature_graph(model, dicts, src, tgt, position)
    assert feature_graph_size(model, dicts, src, tgt, position) == len(g.nodes)
    A, a = g.adjacency, g.attribution
    assert abs(float(A[-1].sum()) - g.logit) <= 1e-10 * abs(g.logit)
    inner = [i for i, n in enumerate(g.nodes) if n["kind"] in ("head", "ffn", "feature")]
    assert float((A[inner].sum(1) - a[inner]).abs().max()) <= 1e-9
    for site in dicts:
        assert g.index(kind="feature", site=site), site
    assert not g.index(kind="head")  # cross-attention blocks carry SAEs; the self-attention blocks' heads are edges
    assert not g.index(kind="ffn", stack="dec", layer=1)
    assert g.index(kind="ffn", stack="dec", layer=2)
    for site, d in dicts.items():  # TopK: at most k per position (BatchTopK and JumpReLU have no fixed count)
        per_pos = torch.bincount(torch.tensor([g.nodes[i]["position"] for i in g.index(kind="feature", site=site)]))
        assert d.cfg.architecture != "topk" or int(per_pos.max()) <= d.cfg.k
    # the top feature's attribution is its removal in the replacement model, exactly
    rm = ReplacementModel(model, src, tgt[:, : position + 1], freeze=(*FREEZABLE, FEATURES), dtype=torch.float64,
                          splices=dicts)
    feats = feature_nodes(g)
    top = g.nodes[feats[int(g.attribution[feats].argmax())]]
    sf = rm.features[top["site"]]
    sf.active[0, top["position"], top["feature"]] = False
    removed = float(rm()[0, position, g.token])
    assert abs((g.logit - removed) - float(g.attribution[feats].max())) <= 1e-8 * abs(g.logit)
    # nothing clamped in the real spliced model is the model itself
    with torch.no_grad():
        plain = float(model(src, tgt[:, : position + 1])[0, position, g.token])
    assert abs(float(remove_features(model, dicts, src, tgt, g, [[]])[0]) - plain) < 1e-5


def test_a_feature_nodes_dashboard_is_looked_up_on_demand(shipped):
    model, dicts, src, tgt = shipped
    tm = load(CKPT)
    g = feature_graph(tm.model, dicts, src, tgt, 3)
    feats = feature_nodes(g)
    node = g.nodes[feats[int(g.attribution[feats].argmax())]]
    dirs = {site: CKPT / "features" / site for site in dicts}  # each directory is named for its site
    out = feature_details(tm, dirs, node, contexts=3, effects=5)
    assert out["link"] == node["link"] == f"?tab=features&site={node['site']}&feature={node['feature']}"
    assert 0 < len(out["contexts"]) <= 3 and all(c["value"] > 0 for c in out["contexts"])
    assert out["output_effects"]["feature"] == node["feature"] and len(out["output_effects"]["tokens"]) <= 5

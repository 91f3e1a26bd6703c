"""Pad-start models in the analyses (issue 36 point 1, issue 38 point 4): an imported Marian model's decoder starts
with the padding id. Its attribution graph is built (decoder position 0 is a node like any other), is complete, and
removing its nodes in the real model matches the frozen prediction where the model is linear; the replacement model
reproduces it; a dictionary site keeps decoder position 0."""

from __future__ import annotations

import pytest
import torch
from importer_helpers import write_marian_dir

from workbench.analysis.attribution.graph import attribution_graph, remove_nodes
from workbench.analysis.attribution.graph_trust import gradient_x_activation, graph_trust
from workbench.core.replacement import ReplacementModel
from workbench.corpus.data import Batch
from workbench.features.sites import resolve_site, site_mask
from workbench.importers.marian import import_marian

pytest.importorskip("transformers", reason="the model is a real MarianMTModel, imported")


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    directory = tmp_path_factory.mktemp("opus")
    write_marian_dir(directory)
    tm = import_marian(directory)
    assert tm.model.cfg.start_id == tm.model.cfg.pad_id, "the point of the test: Marian starts with pad"
    return tm


def _sentence(tm):
    src_ids = [*tm.src_tokenizer.encode("the cat sat on the mat ."), tm.model.cfg.eos_id]
    out = tm.tgt_tokenizer.encode("the cat sat")
    return torch.tensor([src_ids]), torch.tensor([[tm.model.cfg.start_id, *out]])


def test_a_pad_start_decoder_gets_a_complete_graph_with_position_zero(marian):
    src, tgt = _sentence(marian)
    for position in (0, tgt.size(1) - 1):
        g = attribution_graph(marian.model, src, tgt, position=position)
        assert g.index(kind="embed", stack="dec", position=0), "decoder position 0 is a node"
        assert abs(float(g.adjacency[-1].sum()) - g.logit) <= 1e-9 * max(1.0, abs(g.logit))
        # removing the start token's embedding changes the real logit: position 0 is read, not masked
        (start,) = g.index(kind="embed", stack="dec", position=0)
        removed = remove_nodes(marian.model, src, tgt, g, [[start]])
        assert abs(float(removed[0]) - g.logit) > 1e-6
    # the trust table: predicted beside real removals, the start embedding among the embeddings reported apart
    trust = graph_trust(marian.model, src, tgt, g, top=10)
    assert start in trust.nodes and trust.kinds[trust.nodes.index(start)] == "embed"
    assert len(trust.real) == len(trust.predicted) == len(trust.nodes)
    gxa = gradient_x_activation(marian.model, src, tgt, g, trust.nodes[:5])
    assert gxa.shape == (5,) and (abs(gxa) > 0).any()


def test_the_replacement_model_reproduces_a_pad_start_model(marian):
    src, tgt = _sentence(marian)
    rm = ReplacementModel(marian.model, src, tgt, freeze=())
    torch.testing.assert_close(rm(), marian.model(src, tgt), rtol=0, atol=1e-6)
    frozen = ReplacementModel(marian.model, src, tgt, dtype=torch.float64)
    torch.testing.assert_close(frozen(), frozen.logits, rtol=0, atol=1e-10)


def test_a_decoder_site_keeps_position_zero(marian):
    src, tgt = _sentence(marian)
    site = resolve_site(marian.model, "dec.0.cross_attn.hook_out")
    padded = torch.cat([tgt, torch.full((1, 2), marian.model.cfg.pad_id)], dim=1)
    batch = Batch(src, padded, padded, [0], int(src.numel()), int(tgt.numel()))
    mask = site_mask(batch, site, marian.model.cfg.pad_id)
    assert mask[0].tolist() == [True] * tgt.size(1) + [False, False]


def test_the_residual_decomposition_and_alti_walk_a_pad_start_model(marian):
    """Both walk the layers' own compose (issue 36 point 1): on the imported Marian model the parts sum to the
    decoder output at every position, position 0 (the pad start) included; the DLA sums to the logit; each head's
    per-key split sums to its DLA; ALTI+'s blocks rebuild their outputs and its rows are conserved, position 0 too."""
    from workbench.analysis.attribution.alti import alti, alti_hooks, block_terms
    from workbench.analysis.attribution.decompose import decompose_resid, direct_logit_attribution, source_attribution
    from workbench.core.heads import Head

    model = marian.model
    src, tgt = _sentence(marian)
    comps = decompose_resid(model, src, tgt)
    torch.testing.assert_close(comps.values.sum(0).float(), comps.target, rtol=1e-5, atol=2e-5)
    with torch.no_grad():
        logits = model(src, tgt)[0].double()
    for position in (0, tgt.size(1) - 1):
        token = int(logits[position].argmax())
        dla = direct_logit_attribution(model, src, tgt, position=position, token=token)
        assert abs(float(dla.values.sum()) - dla.logit) <= 1e-5 * max(1.0, abs(dla.logit))  # parts of an fp32 run
        assert abs(dla.logit - float(logits[position, token])) <= 1e-4
        per_key = source_attribution(model, src, tgt, position=position, token=token)
        for layer in range(len(model.dec)):
            for h in range(per_key.size(1)):
                want = float(dla.values[dla.labels.index(str(Head("cross", layer, h)))])
                assert abs(float(per_key[layer, h].sum()) - want) <= 1e-5
    _, trace = model.run_with_cache(src, tgt, names=alti_hooks(model))
    for kind, depth in (("enc_self", len(model.enc)), ("dec_self", len(model.dec)), ("cross", len(model.dec))):
        for layer in range(depth):
            t = block_terms(model, trace, kind, layer, dtype=torch.float64)
            torch.testing.assert_close(t.per_key().sum(2) + t.residual + t.bias, t.output, rtol=0, atol=1e-4)
    a = alti(model, src, tgt, dtype=torch.float64)
    rows = a.source.sum(-1) + a.target.sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows), rtol=0, atol=1e-12)
    assert float(a.target[0, 0, 0]) > 0  # the start position is a token like any other

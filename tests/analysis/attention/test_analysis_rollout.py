"""Rollout and flow against hand-computed values; decoder rollout conserves mass; value norms rebuild hook_out."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.analysis.attention.norms import NORM_HOOKS, layer_output_from_norm_terms, value_norms
from workbench.analysis.attention.rollout import attention_flow, attention_rollout, decoder_rollout, encoder_rollout


def test_two_layer_rollout_equals_the_formula_by_hand():
    a1 = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    a2 = torch.tensor([[0.0, 1.0], [0.25, 0.75]])
    # Â = ½I + ½A
    m1 = [[1.0, 0.0], [0.25, 0.75]]
    m2 = [[0.5, 0.5], [0.125, 0.875]]
    expected = [[m2[0][0] * m1[0][0] + m2[0][1] * m1[1][0], m2[0][0] * m1[0][1] + m2[0][1] * m1[1][1]],
                [m2[1][0] * m1[0][0] + m2[1][1] * m1[1][0], m2[1][0] * m1[0][1] + m2[1][1] * m1[1][1]]]
    # = [[0.625, 0.375], [0.34375, 0.65625]]
    got = attention_rollout(torch.stack([a1, a2]), heads_dim=False)
    assert got.tolist() == expected == [[0.625, 0.375], [0.34375, 0.65625]]
    # heads are averaged first: two heads whose mean is a1 / a2 give the same rollout
    h1 = torch.stack([torch.stack([a1 * 0 + torch.eye(2), 2 * a1 - torch.eye(2)]),
                      torch.stack([a2, a2])])  # (L, H, S, S)
    assert torch.allclose(attention_rollout(h1), got.double())
    # no residual: plain matrix product; full residual: identity
    assert torch.allclose(attention_rollout(torch.stack([a1, a2]), residual=0.0, heads_dim=False),
                          (a2 @ a1).double())
    assert torch.equal(attention_rollout(torch.stack([a1, a2]), residual=1.0, heads_dim=False), torch.eye(2).double())
    with pytest.raises(ValueError, match="residual"):
        attention_rollout(torch.stack([a1]), residual=1.5, heads_dim=False)


def test_flow_one_layer_is_the_mixed_attention_and_two_layers_sum_of_path_minima():
    g = torch.Generator().manual_seed(0)
    a = torch.softmax(torch.randn(2, 3, 3, generator=g, dtype=torch.float64), -1)
    m = 0.5 * torch.eye(3).double() + 0.5 * a
    np.testing.assert_allclose(attention_flow(a[:1]), m[0].numpy(), atol=1e-12)
    # two layers: paths j -> k -> i are edge-disjoint, so the max flow is Σ_k min(Â1[k, j], Â2[i, k])
    flow = attention_flow(a)
    expected = np.array([[sum(min(m[0][k, j], m[1][i, k]) for k in range(3)) for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(flow, expected, atol=1e-12)


def test_flow_three_layers_equals_the_minimum_cut_by_enumeration():
    """Max-flow = min-cut: enumerate every cut of the 2 x 3 inner nodes (64 cuts) for each pair."""
    import itertools

    g = torch.Generator().manual_seed(1)
    a = torch.softmax(torch.randn(3, 3, 3, generator=g, dtype=torch.float64), -1)
    m = (0.5 * torch.eye(3).double() + 0.5 * a).numpy()  # m[l][i, j]: edge (l, j) -> (l+1, i)
    flow = attention_flow(a)
    for i, j in itertools.product(range(3), range(3)):
        best = np.inf
        for bits in itertools.product([0, 1], repeat=6):  # 1 = on the source side
            # other inputs have no inflow (sink side), other outputs no outflow (source side): both idle
            side = {(0, k): k == j for k in range(3)} | {(3, q): q != i for q in range(3)}
            side |= {(1 + n // 3, n % 3): bool(b) for n, b in enumerate(bits)}
            cut = sum(m[lay][q, k] for lay in range(3) for q in range(3) for k in range(3)
                      if side[(lay, k)] and not side[(lay + 1, q)])
            best = min(best, cut)
        assert flow[i, j] == pytest.approx(best, abs=1e-9), (i, j)


def _model_trace(names="*.hook_probs"):
    cfg = presets.tiny(vocab=40)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=2, src_len=6, tgt_len=5)
    _, trace = model.run_with_cache(src, tgt, names=names)
    return model, src, tgt, trace


def test_encoder_and_decoder_rollout_on_a_model():
    model, src, tgt, trace = _model_trace()
    enc = encoder_rollout(trace)
    assert torch.allclose(enc.sum(-1), torch.ones_like(enc.sum(-1)))
    real = src != 0
    assert torch.all(enc[0][real[0]][:, ~real[0]] == 0)  # real positions take nothing from padding
    dec = decoder_rollout(trace)
    total = dec.target.sum(-1) + dec.source.sum(-1)
    assert torch.allclose(total, torch.ones_like(total))
    assert torch.all(dec.target.triu(1) == 0)  # causal: nothing from later target tokens
    assert torch.all((dec.source_share > 0) & (dec.source_share < 1))
    # with a fixed residual weight r the source share is 1 - r^L whatever the attention (documented caveat)
    assert torch.allclose(dec.source_share, torch.full_like(dec.source_share, 1 - 0.25))
    # without the encoder, source relevance is head-averaged cross-attention mixed by later layers
    plain = decoder_rollout(trace, through_encoder=False)
    assert torch.allclose(plain.source_share, dec.source_share)


def test_value_norms_rebuild_the_block_output():
    model, src, tgt, trace = _model_trace(NORM_HOOKS + ["*.hook_out"])
    for kind, layer, name in [("enc_self", 1, "enc.1.self_attn.hook_out"), ("cross", 0, "dec.0.cross_attn.hook_out"),
                              ("dec_self", 1, "dec.1.self_attn.hook_out")]:
        rebuilt = layer_output_from_norm_terms(model, trace, kind, layer)
        assert torch.allclose(rebuilt, trace[name].double(), atol=1e-5)
        n = value_norms(model, trace, kind, layer)
        b, h, i, j = 0, 2, 1, 0
        attn = (model.enc[layer].self_attn if kind == "enc_self" else
                model.dec[layer].cross_attn if kind == "cross" else model.dec[layer].self_attn)
        prefix = name.rsplit(".", 1)[0]
        v = trace[f"{prefix}.hook_v"][b, h, j].double()
        w = attn.out_proj.weight.detach().double()[:, h * attn.d_head:(h + 1) * attn.d_head]
        alpha = trace[f"{prefix}.hook_probs"][b, h, i, j].double()
        assert n.per_head[b, h, i, j] == pytest.approx(float(alpha * (w @ v).norm()), rel=1e-9)
        assert n.combined.shape == trace[f"{prefix}.hook_probs"][:, 0].shape

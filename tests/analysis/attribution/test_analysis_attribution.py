"""Attribution equals the closed form on a linear model; causal and padding zeros on a Transformer;
Spearman against hand values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_helpers import make_model

from workbench import presets
from workbench.analysis.attribution.attribution import (
    gradient_attribution,
    rank,
    spearman,
    step_agreement,
    token_attribution,
)


def test_linear_model_closed_form():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, generator=g, dtype=torch.float64)
    a = torch.tensor([2.0, -1.0, 0.5, 0.0], dtype=torch.float64)
    w = torch.randn(3, generator=g, dtype=torch.float64)
    sal, ixg = gradient_attribution(lambda e: (a * (e @ w)).sum(), x)
    torch.testing.assert_close(sal, a.abs() * w.norm())
    torch.testing.assert_close(ixg, a * (x @ w))
    # a linear f is its own first-order expansion: input×gradient sums to f(x) - f(0)
    assert float(ixg.sum()) == pytest.approx(float((a * (x @ w)).sum()))


def test_transformer_attribution_is_causal_and_ignores_padding():
    cfg = presets.tiny(vocab=30)
    model = make_model(cfg)
    src = torch.tensor([[5, 6, 7, 2, 0]])
    tgt = torch.tensor([[1, 8, 9, 10]])
    targets = torch.tensor([[8, 9, 10, 2]])
    attr = token_attribution(model, src, tgt, targets)
    assert attr.source_saliency.shape == (4, 5) and attr.target_saliency.shape == (4, 4)
    assert np.all(attr.source_saliency[:, 4] == 0)  # padding gets exactly nothing
    assert np.all(np.triu(attr.target_saliency, 1) == 0)  # no gradient from future target tokens
    assert np.all(attr.source_saliency[:, :4] > 0)
    with torch.no_grad():
        expected = model(src, tgt).log_softmax(-1)[0].gather(-1, targets[0, :, None])[:, 0]
    np.testing.assert_allclose(attr.log_probs, expected.numpy(), atol=1e-6)
    # saliency of one step equals the generic function applied to that step's log-probability
    e = model.src_embed(src) * model.embed_scale

    def f(emb):
        with model.hooks({"hook_src_tok": lambda x, h: emb}):
            return model(src, tgt).log_softmax(-1)[0, 2, 10]

    sal, ixg = gradient_attribution(f, e)
    np.testing.assert_allclose(attr.source_saliency[2], sal[0].numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(attr.source_input_x_gradient[2], ixg[0].numpy(), rtol=1e-5, atol=1e-7)


def test_spearman_hand_values():
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank(np.array([3.0, 1.0, 3.0, 2.0])).tolist() == [2.5, 0.0, 2.5, 1.0]
    # ties: ranks a=[0, 2, 2, 1] (shifted), b=[0,1,2,3]: rho = Pearson of those ranks
    ra, rb = np.array([0, 2.5, 2.5, 1]), np.arange(4.0)
    expected = np.corrcoef(ra, rb)[0, 1]
    assert spearman([1, 3, 3, 2], [1, 2, 3, 4]) == pytest.approx(expected)
    assert np.isnan(spearman([1, 1, 1], [1, 2, 3]))
    rows = step_agreement(np.array([[1, 2, 3], [3, 2, 1]]), np.array([[1, 2, 3], [1, 2, 3]]))
    assert rows.tolist() == [pytest.approx(1.0), pytest.approx(-1.0)]

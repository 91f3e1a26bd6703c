"""Gradient caches at hook points equal torch.autograd.grad taken directly."""

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.analysis.attribution.gradients import run_with_grads


@pytest.fixture
def model():
    return make_model(presets.tiny(vocab=50, norm_first=True), seed=2)


def metric(logits):
    return logits[0, 2, 7] - logits[1, 3, 9]


def test_gradient_cache_equals_autograd_at_every_point_of_one_path(model):
    src, tgt = make_batch(model.cfg)
    names = ["hook_src_tok", "enc.1.hook_resid_ffn", "dec.0.cross_attn.hook_result", "dec.1.hook_resid_cross_attn",
             "dec_norm.hook_scale"]
    value, acts, grads = run_with_grads(model, src, tgt, metric, names)
    for name in names:
        leaf = {}

        def make_leaf(x, hook, leaf=leaf):
            leaf["x"] = x.detach().requires_grad_(True)
            return leaf["x"]

        with torch.enable_grad(), model.hooks({name: make_leaf}):
            direct = metric(model(src, tgt))
            (want,) = torch.autograd.grad(direct, leaf["x"])
        torch.testing.assert_close(grads[name], want, msg=name)
        torch.testing.assert_close(acts[name], leaf["x"].detach())
        assert grads[name].shape == acts[name].shape
    assert value.item() == pytest.approx(direct.item(), abs=1e-5)


def test_parameters_that_need_no_grad_and_the_mode_are_left_alone(model):
    src, tgt = make_batch(model.cfg)
    for p in model.parameters():
        p.requires_grad_(False)
    model.train()
    _, _, grads = run_with_grads(model, src, tgt, metric, "hook_memory")
    assert grads["hook_memory"].abs().sum() > 0
    assert model.training


def test_refuses_a_non_scalar_metric(model):
    src, tgt = make_batch(model.cfg)
    with pytest.raises(ValueError, match="metric must return a scalar tensor, got \\(3, 6\\)"):
        run_with_grads(model, src, tgt, lambda logits: logits[..., 0], "hook_memory")
    with pytest.raises(KeyError, match="hook_memory"):
        run_with_grads(model, src, tgt, metric, "hook_memroy")

"""Integrated gradients (completeness), occlusion and memory patching (== one position at a time), agreement."""

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.analysis.attribute import (
    METHODS,
    attribution_agreement,
    integrated_gradients,
    mean_memory,
    memory_patching,
    occlusion,
)


@pytest.fixture
def model():
    return make_model(presets.tiny(vocab=50, norm_first=True), seed=7)


def sentence(cfg, seed=3):
    src, tgt = make_batch(cfg, batch=1, pad=False, seed=seed)
    targets = torch.cat([tgt[:, 1:], torch.full((1, 1), cfg.eos_id)], 1)
    return src, tgt, targets


def test_integrated_gradients_rows_sum_to_the_change_from_the_baseline(model):
    src, tgt, targets = sentence(model.cfg)
    ig = integrated_gradients(model, src, tgt, targets, steps=128)
    lp = model(src, tgt).float().log_softmax(-1)[0].gather(-1, targets[0, :, None])[:, 0]
    with model.hooks({"hook_src_tok": lambda x, h: torch.zeros_like(x)}):
        base = model(src, tgt).float().log_softmax(-1)[0].gather(-1, targets[0, :, None])[:, 0]
    torch.testing.assert_close(ig.sum(1), (lp - base).double(), atol=2e-3, rtol=2e-2)
    assert ig.shape == (tgt.size(1), src.size(1))


def test_occlusion_and_memory_patching_equal_one_position_at_a_time(model):
    src, tgt, targets = sentence(model.cfg)
    occ = occlusion(model, src, tgt, targets)
    mean = mean_memory(model, [src, sentence(model.cfg, seed=4)[0]])
    mem = memory_patching(model, src, tgt, targets, mean)

    def logp():
        return model(src, tgt).float().log_softmax(-1)[0].gather(-1, targets[0, :, None])[:, 0].double()

    clean = logp()
    for s in (0, 3):
        def zero(x, h, s=s):
            x = x.clone()
            x[:, s] = 0
            return x

        def put(x, h, s=s):
            x = x.clone()
            x[:, s] = mean
            return x

        with model.hooks({"hook_src_tok": zero}):
            torch.testing.assert_close(occ[:, s], clean - logp(), atol=1e-5, rtol=0)
        with model.hooks({"hook_memory": put}):
            torch.testing.assert_close(mem[:, s], clean - logp(), atol=1e-5, rtol=0)


def test_agreement_table_is_symmetric_with_ones_on_the_diagonal(model):
    table = attribution_agreement(model, [sentence(model.cfg, seed) for seed in (3, 4)], steps=8)
    assert list(table.index) == list(METHODS) == list(table.columns)
    vals = table.to_numpy()
    assert vals.diagonal() == pytest.approx(1.0)
    assert vals == pytest.approx(vals.T)
    assert table.attrs["sentences"] == 2


def test_refuses_bad_shapes(model):
    src, tgt, targets = sentence(model.cfg)
    with pytest.raises(ValueError, match="need src \\(1, S\\)"):
        occlusion(model, torch.cat([src, src]), tgt, targets)
    with pytest.raises(ValueError, match="steps must be at least 1"):
        integrated_gradients(model, src, tgt, targets, steps=0)
    with pytest.raises(ValueError, match="mean_memory must be"):
        memory_patching(model, src, tgt, targets, torch.zeros(3))

"""layers.Dropout: the CPU mask from 16-bit draws is still dropout (rate, scale, gradient, seeding)."""

import pytest
import torch
from torch import nn

from workbench.core.layers import Dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_dropout_keeps_the_right_share_and_scales_to_the_same_mean(p):
    torch.manual_seed(0)
    drop = Dropout(p).train()
    x = torch.ones(1000, 1001)  # odd size: the last 64-bit draw is only partly used
    y = drop(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.003
    scale = y[kept].unique()
    assert scale.numel() == 1 and abs(scale.item() - 1 / (1 - p)) < 1e-4
    assert abs(y.mean().item() - 1.0) < 0.005
    # masks are not correlated across the four 16-bit lanes of a draw or between neighbours
    lanes = kept.reshape(-1)[: 4 * 250000].reshape(-1, 4).float().mean(0)
    assert (lanes - (1 - p)).abs().max() < 0.006


def test_dropout_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(1)
    x = torch.randn(64, 33, requires_grad=True)
    y = Dropout(0.3).train()(x)
    y.sum().backward()
    mask = (y != 0).float()
    torch.testing.assert_close(x.grad, mask * (y.detach() / x.detach()).nan_to_num().max())


def test_dropout_follows_the_torch_seed_and_is_identity_in_eval_and_at_zero():
    drop = Dropout(0.2).train()
    x = torch.randn(8, 50)
    torch.manual_seed(5)
    a = drop(x)
    torch.manual_seed(5)
    b = drop(x)
    assert torch.equal(a, b)
    assert not torch.equal(a, drop(x))  # the generator moved on
    assert torch.equal(drop.eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)
    assert isinstance(drop, nn.Dropout)  # same module type for state dicts, model surgery and printing
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))

"""core.dropout: the cheap CPU mask applied through `where` gives the values and gradients of `x * keep * scale` bit
for bit, and the attention block's training path draws it too (the same output as the block written by hand with the
same draws); eval, p = 0 and in-place calls are F.dropout."""

import math

import pytest
import torch
import torch.nn.functional as F

from workbench.core.attention import MultiHeadAttention
from workbench.core.dropout import cheap_mask_usable, dropout


def _keep(shape, p):  # the draws `dropout` makes, in its order
    n = math.prod(shape)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
    return bits.view(torch.int16)[:n].view(shape) >= round(p * 65536) - 32768


@pytest.mark.parametrize("shape", [(64, 30, 256), (3, 5, 7)])
def test_values_and_gradients_are_those_of_the_mask_times_the_scale(shape):
    x = torch.randn(*shape, requires_grad=True)
    g = torch.randn(*shape)
    torch.manual_seed(3)
    y = dropout(x, 0.3)
    y.backward(g)
    torch.manual_seed(3)
    keep = _keep(shape, 0.3)
    scale = 65536 / (65536 - round(0.3 * 65536))
    ref_x = x.detach().clone().requires_grad_()
    ref = ref_x * keep * scale
    ref.backward(g)
    assert torch.equal(y, ref) and torch.equal(x.grad, ref_x.grad)


def test_elsewhere_it_is_torch_dropout():
    x = torch.randn(4, 6)
    assert torch.equal(dropout(x, 0.3, training=False), x)
    assert torch.equal(dropout(x, 0.0), x)
    assert not cheap_mask_usable(x, 0.3, inplace=True) and not cheap_mask_usable(x, 0.3, training=False)
    torch.manual_seed(0)
    a = dropout(x.clone(), 0.5, inplace=True)
    torch.manual_seed(0)
    assert torch.equal(a, F.dropout(x.clone(), 0.5, inplace=True))


def test_training_attention_draws_the_cheap_mask_on_its_probabilities():
    """A training block with attention dropout on CPU: the explicit block with `dropout`'s mask on the
    probabilities (SDPA's math path would draw bernoulli_), checked against the block by hand with the same draws;
    in eval the block is the same with or without dropout."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model=16, n_heads=4, dropout=0.2).train()
    x = torch.randn(2, 5, 16)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]
    torch.manual_seed(7)
    out, _ = attn(x, mask=mask, causal=True)
    torch.manual_seed(7)
    q, k, v = (p(x).view(2, 5, 4, 4).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    scores = (q * 0.5) @ k.transpose(-2, -1)
    allowed = mask & torch.ones(5, 5, dtype=torch.bool).tril()
    probs = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min).softmax(-1)
    keep = _keep(probs.shape, 0.2)
    context = torch.where(keep, probs, 0.0) * (65536 / (65536 - round(0.2 * 65536))) @ v
    by_hand = attn.out_proj(context.transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(out, by_hand, rtol=1e-6, atol=1e-6)
    attn.eval()
    plain = MultiHeadAttention(d_model=16, n_heads=4, dropout=0.0).eval()
    plain.load_state_dict(attn.state_dict())
    torch.testing.assert_close(attn(x, mask=mask, causal=True)[0], plain(x, mask=mask, causal=True)[0])

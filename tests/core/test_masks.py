"""masks.causal_mask is the mask attention applies (so the mask chart cannot drift from the model)."""

import torch

from workbench.core.attention import MultiHeadAttention
from workbench.core.masks import causal_mask


def test_causal_mask_with_offset():
    want = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)  # queries at positions 2 and 3
    assert torch.equal(causal_mask(2, offset=2), want)


def test_attention_applies_exactly_masks_causal_mask():
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model=16, n_heads=2).eval()
    x = torch.randn(1, 5, 16)
    _, cache = attn(x[:, :2], causal=True)
    seen = {}
    attn.hook_scores.name = "scores"
    from workbench.core.hooks import hooks

    def grab(t, hook):
        seen["scores"] = t

    with hooks({"scores": attn.hook_scores}, {"scores": grab}):
        attn(x[:, 2:], causal=True, cache=cache)  # 3 queries after 2 cached keys
    visible = seen["scores"][0, 0] > torch.finfo(torch.float32).min
    assert torch.equal(visible, causal_mask(3, offset=2))

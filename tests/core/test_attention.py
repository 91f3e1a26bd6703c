"""The fused (SDPA) and explicit paths must agree, and probabilities must be real distributions."""

import dataclasses

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.core.attention import _mask_in_place


def _explicit(model, src, tgt):
    """Force the explicit path everywhere by listening to every hook_probs."""
    with model.hooks({"*.hook_probs": lambda x, hook: None}):
        return model(src, tgt)


@pytest.mark.parametrize("norm_first", [False, True])
def test_fused_and_explicit_paths_agree_fp32(norm_first):
    cfg = presets.tiny(vocab=50, norm_first=norm_first)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    torch.testing.assert_close(model(src, tgt), _explicit(model, src, tgt), rtol=1e-5, atol=1e-5)


def test_fused_and_explicit_paths_agree_bf16():
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg).to(torch.bfloat16)
    src, tgt = make_batch(cfg)
    fused, explicit = model(src, tgt).float(), _explicit(model, src, tgt).float()
    torch.testing.assert_close(fused, explicit, rtol=0.05, atol=0.05)


def test_paths_agree_in_training_mode_gradients():
    """With dropout off, gradients through both paths match."""
    cfg = presets.tiny(vocab=50, dropout=0.0)
    model = make_model(cfg).train()
    src, tgt = make_batch(cfg)
    model(src, tgt).square().mean().backward()
    fused = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    _explicit(model, src, tgt).square().mean().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, fused[name], rtol=1e-4, atol=1e-6, msg=name)


def test_probabilities_sum_to_one_and_are_zero_on_padded_and_future_keys():
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    _, trace = model.run_with_cache(src, tgt)
    src_pad = src == cfg.pad_id  # (B, S)
    tgt_real = tgt != cfg.pad_id
    for name in trace.names("*.hook_probs"):
        probs = trace[name]
        torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs[..., 0]))
        if ".self_attn" in name and name.startswith("dec"):
            future = torch.triu(torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool), 1)
            assert (probs[:, :, future] == 0).all(), name
            # right padding: for every real query, padded keys lie in the future and get exactly 0
            pad_keys = ~tgt_real[:, None, None, :] & tgt_real[:, None, :, None]
            assert (probs.masked_select(pad_keys.expand_as(probs)) == 0).all(), name
        else:
            assert (probs.masked_select(src_pad[:, None, None, :].expand_as(probs)) == 0).all(), name
            assert src_pad.any()


def test_padding_does_not_change_real_positions():
    """Extra pads on the source and target leave the logits at real positions unchanged."""
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=2, pad=False)
    padded_src = torch.cat([src, torch.full((2, 4), cfg.pad_id)], 1)
    padded_tgt = torch.cat([tgt, torch.full((2, 3), cfg.pad_id)], 1)
    for run in (lambda s, t: model(s, t), lambda s, t: _explicit(model, s, t)):
        torch.testing.assert_close(run(padded_src, padded_tgt)[:, : tgt.size(1)], run(src, tgt), rtol=1e-5, atol=1e-5)


def test_scores_hook_sees_scaled_logits():
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, pad=False)
    _, trace = model.run_with_cache(src, tgt, names="enc.0.self_attn.hook_*")
    q, k = trace["enc.0.self_attn.hook_q"], trace["enc.0.self_attn.hook_k"]
    expected = q @ k.transpose(-1, -2) / cfg.d_head**0.5
    torch.testing.assert_close(trace["enc.0.self_attn.hook_scores"], expected)
    torch.testing.assert_close(trace["enc.0.self_attn.hook_probs"], expected.softmax(-1))


def test_attention_dropout_applies_on_both_paths():
    cfg = dataclasses.replace(presets.tiny(vocab=50), attn_dropout=0.5, dropout=0.0)
    model = make_model(cfg).train()
    src, tgt = make_batch(cfg)
    torch.manual_seed(0)
    a = model(src, tgt)
    torch.manual_seed(1)
    b = model(src, tgt)
    assert not torch.allclose(a, b)


def _reference_probs(trace, name, src, tgt, cfg):
    """softmax(masked q·kᵀ/√Dh) in float64 from the q and k captured in the same run: a second path, not the code's."""
    block = name.rsplit(".", 1)[0]
    q, k = trace[f"{block}.hook_q"].double(), trace[f"{block}.hook_k"].double()
    scores = q @ k.transpose(-1, -2) / q.size(-1) ** 0.5
    if name.startswith("dec") and ".self_attn" in name:
        scores = scores.masked_fill(~torch.ones(q.size(2), k.size(2), dtype=torch.bool).tril(), float("-inf"))
    else:
        scores = scores.masked_fill((src == cfg.pad_id)[:, None, None, :], float("-inf"))
    return scores.softmax(-1)


@pytest.mark.parametrize("grad", [False, True])
def test_captured_probabilities_equal_the_textbook_formula(grad):
    """The one-buffer path (in-place mask and softmax, no autograd) and the autograd path both give the
    textbook probabilities to 1e-6."""
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    with torch.set_grad_enabled(grad):
        _, trace = model.run_with_cache(src, tgt, names=["*.hook_probs", "*.hook_q", "*.hook_k"])
    for name in trace.names("*.hook_probs"):
        torch.testing.assert_close(trace[name].double(), _reference_probs(trace, name, src, tgt, cfg),
                                   rtol=0, atol=1e-6, msg=name)


def test_capture_without_autograd_is_bit_identical_to_the_autograd_path():
    """In-place masking and softmax into one buffer change no bit of the probabilities or the logits."""
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    logits, trace = model.run_with_cache(src, tgt)  # parameters require grad: the out-of-place path
    with torch.inference_mode():
        fast_logits, fast = model.run_with_cache(src, tgt)
    assert torch.equal(fast_logits, logits.detach())
    for name in trace:
        assert torch.equal(fast[name], trace[name]), name


def test_large_cpu_probability_buffers_are_exact_and_outlive_their_block():
    """Above the huge-page threshold the probabilities live in their own mapping; they stay valid and exact."""
    from workbench.core import attention

    cfg = presets.tiny(vocab=50, max_positions=512)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=8, src_len=300, tgt_len=260)
    assert 8 * cfg.n_heads * 260 * 260 * 4 >= attention._HUGE_PAGE_BYTES  # every block takes that path
    logits, trace = model.run_with_cache(src, tgt)
    with torch.inference_mode():
        fast_logits, fast = model.run_with_cache(src, tgt)
        del fast_logits
    for name in trace:
        assert torch.equal(fast[name], trace[name]), name
        assert (fast[name].sum(-1) - 1).abs().max() < 1e-5


def test_scores_hook_keeps_its_scores_when_the_softmax_runs_in_place():
    """A hook holding hook_scores must not see them overwritten by the probabilities."""
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, pad=False)
    with torch.inference_mode():
        _, trace = model.run_with_cache(src, tgt, names="enc.0.self_attn.hook_*")
    torch.testing.assert_close(trace["enc.0.self_attn.hook_probs"], trace["enc.0.self_attn.hook_scores"].softmax(-1))


def test_an_edit_of_the_probabilities_reaches_the_output_without_autograd():
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)

    def uniform(x, hook):
        return torch.full_like(x, 1.0 / x.size(-1))

    with torch.inference_mode():
        clean = model(src, tgt)
        with model.hooks({"enc.0.self_attn.hook_probs": uniform}):
            edited = model(src, tgt)
    assert not torch.allclose(clean, edited)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_softmax_in_place_is_bit_identical_to_out_of_place(dtype):
    """The capture path relies on it (attention._probs); a torch upgrade that changes the kernel fails here."""
    torch.manual_seed(0)
    for shape in [(3, 4, 7, 7), (2, 4, 5, 13), (1, 8, 64, 600), (4, 4, 33, 1030)]:
        x = (torch.randn(shape) * 5).to(dtype)
        x[..., ::3] = torch.finfo(dtype).min  # masked keys, as the model writes them
        y = x.clone()
        torch.softmax(y, -1, out=y)
        assert torch.equal(y, torch.softmax(x, -1)), shape


def test_recycled_probability_buffers_never_alias_a_trace_still_held():
    """Freed large buffers are reused by the next capture of that size, and only freed ones."""
    from workbench.core import attention

    cfg = presets.tiny(vocab=50, max_positions=512)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=8, src_len=300, tgt_len=260)
    attention._release_buffers()
    with torch.inference_mode():
        _, first = model.run_with_cache(src, tgt)
        kept = {name: t.clone() for name, t in first.items()}
        _, second = model.run_with_cache(src, tgt)  # `first` still held: fresh buffers
        assert not {t.data_ptr() for t in first.values()} & {t.data_ptr() for t in second.values()}
        for name in first:
            assert torch.equal(first[name], kept[name]) and torch.equal(second[name], kept[name]), name
        pointers = {t.data_ptr() for t in first.values()}
        del first
        assert len(attention._pool) == 6  # every block's buffer came back
        _, third = model.run_with_cache(src, tgt)
        assert {t.data_ptr() for t in third.values()} == pointers
        for name in third:
            assert torch.equal(third[name], kept[name]), name
    attention._release_buffers()


def _masks(b, lq, lk, g):
    lengths = torch.randint(1, lk + 1, (b,), generator=g)
    keys = torch.arange(lk)
    right = (keys[None, :] < lengths[:, None])[:, None, None, :]  # padding at the end of the keys
    left = (keys[None, :] >= (lk - lengths)[:, None])[:, None, None, :]  # padding at the start
    scattered = torch.rand(b, 1, 1, lk, generator=g) > 0.3
    causal = torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq)
    return {"none masked": torch.ones(b, 1, 1, lk, dtype=torch.bool), "right": right, "left": left,
            "scattered": scattered, "causal": causal, "causal and padding": right & causal,
            "all masked in one row": right & torch.tensor([False] + [True] * (b - 1)).view(b, 1, 1, 1)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masking_only_the_masked_columns_equals_the_whole_tensor_fill(dtype):
    g = torch.Generator().manual_seed(0)
    for b, lq, lk in [(3, 5, 7), (4, 1, 9), (2, 6, 6)]:
        for name, mask in _masks(b, lq, lk, g).items():
            scores = torch.randn(b, 2, lq, lk, generator=g).to(dtype)
            expected = scores.masked_fill(~mask, torch.finfo(dtype).min)
            _mask_in_place(scores, mask)
            assert torch.equal(scores, expected), (name, b, lq, lk)

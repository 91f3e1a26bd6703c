"""The replacement model and the hook points it stands on: per-head query/key/value inputs equal the fused path and
edit one head only; with nothing frozen the replacement model is the model; frozen at the clean run it reproduces
the clean logits and is affine in the residual streams (so graphs and circuits may decompose it); the frozen norm's
linear part and its adjoint are one another's transpose."""

from __future__ import annotations

import pytest
import torch
from model_helpers import graph_model, one_sentence

from workbench.core.replacement import FREEZABLE, ReplacementModel


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def model(request):
    return graph_model(norm_first=request.param)


def _read(x, hook):
    return None


def test_per_head_inputs_equal_the_fused_projections(model):
    src, tgt = one_sentence(model.cfg)
    plain = model(src, tgt)
    names = model.hook_names("*.hook_[qkv]_input")
    assert len(names) == 3 * (len(model.enc) + 2 * len(model.dec))
    with model.hooks({n: _read for n in names}):
        split = model(src, tgt)
    torch.testing.assert_close(split, plain, rtol=0, atol=1e-5)
    seen = {}
    handle = model.dec[0].cross_attn.hook_k_input.register_forward_hook(lambda m, i, o: seen.setdefault("k", o))
    try:
        model(src, tgt)
    finally:
        handle.remove()
    assert seen["k"].shape == (1, src.size(1), model.cfg.n_heads, model.cfg.d_model)  # (B, S, H, D)


def test_an_edit_to_one_heads_value_input_reaches_that_head_only(model):
    src, tgt = one_sentence(model.cfg)
    attn = model.dec[1].cross_attn
    h = 1

    def zero_input(x, hook):
        x = x.clone()
        x[:, :, h] = 0
        return x

    def bias_only(v, hook):  # the same edit, written at the projected values: v_h = 0 @ W + b
        v = v.clone()
        v[:, h] = 0 if attn.v_proj.bias is None else attn.v_proj.bias.view(attn.n_heads, attn.d_head)[h]
        return v

    names = [attn.hook_v_input.name, attn.hook_result.name]
    with model.capture(names) as a, model.hooks({attn.hook_v_input.name: zero_input}):
        via_input = model(src, tgt)
    with model.capture(names) as b, model.hooks({attn.hook_v.name: bias_only}):
        via_values = model(src, tgt)
    torch.testing.assert_close(via_input, via_values, rtol=0, atol=1e-5)
    result_a, result_b = a[attn.hook_result.name][0], b[attn.hook_result.name][0]
    torch.testing.assert_close(result_a, result_b, rtol=0, atol=1e-5)
    clean = model.run_with_cache(src, tgt, names=[attn.hook_result.name])[1][attn.hook_result.name]
    others = [i for i in range(attn.n_heads) if i != h]
    torch.testing.assert_close(result_a[:, others], clean[:, others], rtol=0, atol=1e-5)
    assert not torch.allclose(result_a[:, h], clean[:, h], atol=1e-3)


def test_with_nothing_frozen_it_is_the_model(model):
    src, tgt = one_sentence(model.cfg)
    rm = ReplacementModel(model, src, tgt, freeze=())
    assert rm.model is model
    torch.testing.assert_close(rm(), model(src, tgt), rtol=0, atol=1e-6)
    rm64 = ReplacementModel(model, src, tgt, freeze=(), dtype=torch.float64)
    assert rm64.model is not model and model.output_proj.weight.dtype == torch.float32  # the caller's stays fp32
    torch.testing.assert_close(rm64().float(), model(src, tgt), rtol=0, atol=1e-5)


def test_frozen_at_the_clean_run_it_gives_the_clean_logits(model):
    src, tgt = one_sentence(model.cfg)
    rm = ReplacementModel(model, src, tgt, dtype=torch.float64)
    torch.testing.assert_close(rm(), rm.logits, rtol=0, atol=1e-10)


def test_frozen_it_is_affine_in_the_streams(model):
    """f(a + b) + f(0) = f(a) + f(b) for edits added to both embeddings: every non-linearity is held."""
    src, tgt = one_sentence(model.cfg)
    rm = ReplacementModel(model, src, tgt, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    shape = {"enc": (1, src.size(1), model.cfg.d_model), "dec": (1, tgt.size(1), model.cfg.d_model)}
    edits = [{stack: torch.randn(shape[stack], generator=g, dtype=torch.float64) for stack in ("enc", "dec")}
             for _ in range(2)]

    def run(*chosen):
        def add(stack):
            def fn(x, hook):
                return x + sum(e[stack] for e in chosen) if chosen else None
            return fn
        return rm(extra=[(rm.model.stream(s).hook_embed.name, add(s)) for s in ("enc", "dec")])

    a, b = edits
    torch.testing.assert_close(run(a, b) + run(), run(a) + run(b), rtol=0, atol=1e-9)
    unfrozen = ReplacementModel(model, src, tgt, freeze=(), dtype=torch.float64)
    big = {s: 3 * a[s] for s in a}

    def plain(*chosen):
        return unfrozen(extra=[(unfrozen.model.stream(s).hook_embed.name,
                                lambda x, h, s=s: x + sum(e[s] for e in chosen)) for s in ("enc", "dec")])
    assert (plain(big, b) + plain() - plain(big) - plain(b)).abs().max() > 1e-3  # the real model is not


def test_frozen_attention_passes_no_gradient_to_queries_and_keys(model):
    src, tgt = one_sentence(model.cfg)
    rm = ReplacementModel(model, src, tgt, freeze=("attention",), dtype=torch.float64)
    attn = rm.model.dec[0].cross_attn
    taps = {}

    def tap(name):
        def fn(x, hook):
            taps[name] = x.detach().requires_grad_(True)
            return taps[name]
        return fn

    with torch.enable_grad():
        logits = rm(extra=[(attn.hook_q.name, tap("q")), (attn.hook_v.name, tap("v"))])
        logits[0, -1].sum().backward()
    assert taps["q"].grad is None or not taps["q"].grad.any()
    assert taps["v"].grad is not None and taps["v"].grad.abs().sum() > 0


def test_unknown_parts_and_dtypes_are_refused(model):
    src, tgt = one_sentence(model.cfg)
    with pytest.raises(ValueError, match="cannot freeze softmax"):
        ReplacementModel(model, src, tgt, freeze=("softmax",))
    with pytest.raises(ValueError, match="dtype"):
        ReplacementModel(model, src, tgt, dtype=torch.float16)
    assert set(FREEZABLE) == {"attention", "norms", "gates"}


def test_the_frozen_norms_adjoint_is_its_transpose(model):
    norm = model.dec[0].ffn_norm.double()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, model.cfg.d_model, generator=g, dtype=torch.float64, requires_grad=True)
    cot = torch.randn(5, model.cfg.d_model, generator=g, dtype=torch.float64)
    scale = torch.rand(5, 1, generator=g, dtype=torch.float64) + 0.5
    (grad,) = torch.autograd.grad(norm.linear(x, scale), x, cot)
    torch.testing.assert_close(norm.linear_t(cot, scale), grad, rtol=0, atol=1e-12)
    with torch.no_grad():  # at x's own divisor, linear + bias is the norm itself
        own = ((x - x.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
        torch.testing.assert_close(norm.linear(x, own) + norm.bias, norm(x), rtol=0, atol=1e-12)

"""Residual decomposition and direct logit attribution: parts sum to the real values, and on the linear path
removing a part changes the logit by its attribution."""

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.analysis.attribution.decompose import decompose_resid, direct_logit_attribution, source_attribution
from workbench.core.heads import Head

CONFIGS = {
    "pre_norm": dict(norm_first=True),
    "post_norm": dict(norm_first=False),
    "post_norm_final_norms": dict(norm_first=False, enc_final_norm=True, dec_final_norm=True),
    "emb_norm_output_bias": dict(norm_first=True, emb_norm=True, output_bias=True),
}


def model_for(name, **extra):
    model = make_model(presets.tiny(vocab=50, **CONFIGS[name], **extra), seed=3)
    with torch.no_grad():  # non-trivial norm weights and biases, so folding them is actually tested
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.fixture(params=sorted(CONFIGS))
def model(request):
    return model_for(request.param)


def test_hook_result_sums_to_the_block_output_and_layer_norm_hooks_change_nothing(model):
    src, tgt = make_batch(model.cfg)
    clean = model(src, tgt)
    _, tr = model.run_with_cache(src, tgt, names=["dec.1.cross_attn.hook_result", "dec.1.cross_attn.hook_out",
                                                  "enc.0.self_attn.hook_result", "enc.0.self_attn.hook_out"])
    for block in ("dec.1.cross_attn", "enc.0.self_attn"):
        bias = model.get_submodule(block).out_proj.bias
        torch.testing.assert_close(tr[f"{block}.hook_result"].sum(1) + bias, tr[f"{block}.hook_out"])
    assert tr["dec.1.cross_attn.hook_result"].shape == (3, model.cfg.n_heads, tgt.size(1), model.cfg.d_model)
    listened, _ = model.run_with_cache(src, tgt, names=["*.hook_result", "*.hook_scale", "*.hook_in"])
    torch.testing.assert_close(listened, clean, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("stack", ["enc", "dec"])
@pytest.mark.parametrize("layer", [None, 0, -1])
def test_components_sum_to_the_stream(model, stack, layer):
    src, tgt = make_batch(model.cfg)
    comps = decompose_resid(model, src, tgt, stack=stack, layer=layer)
    torch.testing.assert_close(comps.values.sum(0).float(), comps.target, atol=2e-5, rtol=1e-5)
    heads = [i for i in comps.info if i["head_index"] is not None]
    blocks = 1 if stack == "enc" else 2
    depth = 2 if layer is None else (layer % 2) + 1
    assert len(heads) == model.cfg.n_heads * blocks * depth
    merged = decompose_resid(model, src, tgt, stack=stack, layer=layer, split_heads=False)
    torch.testing.assert_close(merged.values.sum(0), comps.values.sum(0))


def test_dla_sums_to_the_logit_and_the_logit_difference(model):
    src, tgt = make_batch(model.cfg, batch=1, pad=False)
    logits = model(src, tgt)[0, 2].detach().double()
    dla = direct_logit_attribution(model, src[0], tgt[0], position=2, token=17)
    assert dla.values.sum().item() == pytest.approx(dla.logit, abs=1e-4)
    assert dla.logit == pytest.approx(float(logits[17]), abs=1e-4)
    diff = direct_logit_attribution(model, src, tgt, position=-4, token=17, baseline_token=9)
    assert diff.values.sum().item() == pytest.approx(float(logits[17] - logits[9]), abs=1e-4)
    frame = dla.frame()
    assert list(frame.columns) == ["component", "stack", "kind", "layer", "head_index", "value"]
    heads = frame[frame["head_index"].notna()]
    assert [str(Head.parse(c)) for c in heads["component"]] == list(heads["component"])  # prints what parse reads
    assert frame["value"].sum() == pytest.approx(dla.logit, abs=1e-4)


@pytest.mark.parametrize("name", ["pre_norm", "post_norm_final_norms"])
def test_removing_a_component_changes_the_logit_by_its_attribution_on_the_linear_path(name):
    """Zero the last FFN's output with every norm after it held at its clean scale: the logit moves by exactly
    minus the FFN's DLA. Letting the scale move too is the approximation the docs state: pinned down here."""
    model = model_for(name)
    src, tgt = make_batch(model.cfg, batch=1, pad=False)
    pos, tok = 3, 11
    dla = direct_logit_attribution(model, src, tgt, position=pos, token=tok)
    part = dla.values[dla.labels.index("dec.1.ffn")].item()
    scales = [n for n in model.hook_names("*.hook_scale") if n.startswith(("dec.1.ffn_norm", "dec_norm"))]
    _, clean = model.run_with_cache(src, tgt, names=scales)
    zero = {"dec.1.ffn.hook_out": lambda x, h: torch.zeros_like(x)}
    with model.hooks({**zero, **{n: (lambda x, h, v=clean[n]: v) for n in scales}}):
        frozen = model(src, tgt)[0, pos, tok].item()
    assert frozen - dla.logit == pytest.approx(-part, abs=1e-4)
    if name != "pre_norm":
        return
    # pre-norm: the only norm on the path is the final one, and the approximation is exactly its rescaling:
    # real = bias terms + (frozen - bias terms) * s / s', with |s' - s| <= |centred FFN output| / sqrt(D)
    with model.capture(["dec_norm.hook_scale", "dec.1.ffn.hook_out"]) as free_run, model.hooks(zero):
        free = model(src, tgt)[0, pos, tok].item()
    s, s_new = clean["dec_norm.hook_scale"][0, pos, 0].item(), free_run["dec_norm.hook_scale"][0][0, pos, 0].item()
    bias = dla.values[dla.labels.index("dec_norm.bias")].item() + dla.values[dla.labels.index("output_bias")].item() \
        if "output_bias" in dla.labels else dla.values[dla.labels.index("dec_norm.bias")].item()
    assert free == pytest.approx(bias + (frozen - bias) * s / s_new, abs=1e-4)
    c = free_run["dec.1.ffn.hook_out"][0][0, pos]
    assert abs(s_new - s) <= (c - c.mean()).norm().item() / model.cfg.d_model ** 0.5 + 1e-6


def test_source_attribution_splits_each_heads_dla_over_the_keys(model):
    src, tgt = make_batch(model.cfg, batch=1, pad=False)
    dla = direct_logit_attribution(model, src, tgt, position=4, token=5)
    for kind in ("cross", "dec_self"):
        per_key = source_attribution(model, src, tgt, position=4, token=5, kind=kind)
        assert per_key.shape == (2, model.cfg.n_heads, src.size(1) if kind == "cross" else tgt.size(1))
        for layer in range(2):
            for h in range(model.cfg.n_heads):
                want = dla.values[dla.labels.index(str(Head(kind, layer, h)))].item()
                assert per_key[layer, h].sum().item() == pytest.approx(want, abs=1e-5)
    if kind == "dec_self":
        assert torch.all(per_key[..., 5:] == 0)  # causal: position 4 reads keys 0..4 only


def test_refuses_what_it_cannot_handle():
    model = model_for("pre_norm")
    src, tgt = make_batch(model.cfg)
    with pytest.raises(ValueError, match="stack must be one of"):
        decompose_resid(model, src, tgt, stack="cross")
    with pytest.raises(ValueError, match="layer 5 out of range"):
        decompose_resid(model, src, tgt, layer=5)
    with pytest.raises(ValueError, match="one sentence"):
        direct_logit_attribution(model, src, tgt, position=0, token=1)
    with pytest.raises(ValueError, match="position 9 out of range"):
        direct_logit_attribution(model, src[0], tgt[0], position=9, token=1)
    with pytest.raises(ValueError, match="token 50 out of range"):
        direct_logit_attribution(model, src[0], tgt[0], position=0, token=50)
    with pytest.raises(ValueError, match="kind must be 'cross' or 'dec_self'"):
        source_attribution(model, src[0], tgt[0], position=0, token=1, kind="enc_self")


def test_per_head_results_and_norm_scales_cost_nothing_unless_listened(monkeypatch):
    from workbench.core import layers
    from workbench.core.attention import MultiHeadAttention

    model = model_for("post_norm")
    src, tgt = make_batch(model.cfg)
    by_head, explicit, fused_norms = [], [], []
    orig_by_head, orig_explicit, orig_ln = MultiHeadAttention._by_head, MultiHeadAttention._explicit, \
        layers.F.layer_norm
    monkeypatch.setattr(MultiHeadAttention, "_by_head", lambda self, c: by_head.append(1) or orig_by_head(self, c))
    monkeypatch.setattr(MultiHeadAttention, "_explicit", lambda self, *a: explicit.append(1) or orig_explicit(self, *a))
    monkeypatch.setattr(layers.F, "layer_norm", lambda *a, **k: fused_norms.append(1) or orig_ln(*a, **k))
    with model.hooks({"dec.0.cross_attn.hook_context": lambda x, h: None, "dec.0.ffn_norm.hook_in": lambda x, h: None}):
        model(src, tgt)
    n_norms = len(fused_norms)
    assert by_head == [] and explicit == [] and n_norms == 2 * 2 + 2 * 3
    fused_norms.clear()
    listen = {"dec.0.cross_attn.hook_result": lambda x, h: None, "dec.0.ffn_norm.hook_scale": lambda x, h: None}
    with model.hooks(listen):
        model(src, tgt)
    assert by_head == [1] and explicit == []  # one block takes the per-head path, still on the fused kernel
    assert len(fused_norms) == n_norms - 1  # one norm takes the explicit path

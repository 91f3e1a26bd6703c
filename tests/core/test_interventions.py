"""Interventions change exactly what they name, and always go away."""

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench.core.interventions import ablate_heads, patch, scale_heads, zero_heads


def _per_head_outputs(model, context, layer):
    """Each head's contribution to the residual stream: context_h @ W_o[:, h-slice]ᵀ."""
    attn = model.enc[layer].self_attn
    dh = attn.d_head
    w = attn.out_proj.weight  # (D, D)
    return torch.stack([context[:, h] @ w[:, h * dh : (h + 1) * dh].T for h in range(attn.n_heads)], 1)


def test_ablating_a_head_zeroes_exactly_its_contribution(tiny_model, tiny_config):
    src, tgt = make_batch(tiny_config)
    name = "enc.1.self_attn.hook_context"
    _, clean = tiny_model.run_with_cache(src, tgt, names=[name, "enc.1.self_attn.hook_out"])
    # capture after the ablation hook: contexts registered later run later
    with tiny_model.intervene({name: zero_heads(2)}):
        _, ablated = tiny_model.run_with_cache(src, tgt, names=[name, "enc.1.self_attn.hook_out"])
    before = _per_head_outputs(tiny_model, clean[name], 1)
    after = _per_head_outputs(tiny_model, ablated[name], 1)
    assert (after[:, 2] == 0).all()
    others = [0, 1, 3]
    torch.testing.assert_close(after[:, others], before[:, others])
    bias = tiny_model.enc[1].self_attn.out_proj.bias
    torch.testing.assert_close(ablated["enc.1.self_attn.hook_out"], after.sum(1) + bias, rtol=1e-5, atol=1e-5)


def test_ablation_changes_logits_and_is_removed(tiny_model, tiny_config):
    src, tgt = make_batch(tiny_config)
    clean = tiny_model(src, tgt)
    with tiny_model.intervene(ablate_heads({("cross", 0): [0, 1, 2, 3]})):
        ablated = tiny_model(src, tgt)
    assert not torch.allclose(clean, ablated)
    torch.testing.assert_close(tiny_model(src, tgt), clean)


def test_scaling_by_one_changes_nothing_and_bad_heads_raise(tiny_model, tiny_config):
    src, tgt = make_batch(tiny_config)
    clean = tiny_model(src, tgt)
    with tiny_model.intervene({"dec.*.self_attn.hook_context": scale_heads([0, 3], 1.0)}):
        torch.testing.assert_close(tiny_model(src, tgt), clean)
    with pytest.raises(IndexError, match="4 heads"):
        with tiny_model.intervene({"dec.0.self_attn.hook_context": zero_heads(9)}):
            tiny_model(src, tgt)


def test_ablation_works_on_probabilities_too(tiny_model, tiny_config):
    """Zeroing a head's probabilities forces the explicit path and zeroes that head's context."""
    src, tgt = make_batch(tiny_config)
    with tiny_model.intervene({"dec.0.cross_attn.hook_probs": zero_heads(1)}):
        _, trace = tiny_model.run_with_cache(src, tgt, names="dec.0.cross_attn.hook_context")
    assert (trace["dec.0.cross_attn.hook_context"][:, 1] == 0).all()


def test_activation_patching_from_another_run(tiny_config):
    """Patching the whole encoder memory from run B makes run A's decoder behave as on B's source."""
    model = make_model(tiny_config)
    src_a, tgt = make_batch(tiny_config, pad=False, seed=1)
    src_b, _ = make_batch(tiny_config, pad=False, seed=2)
    _, trace_b = model.run_with_cache(src_b, tgt, names="hook_memory")
    with model.intervene({"hook_memory": patch(trace_b["hook_memory"])}):
        patched = model(src_a, tgt)
    torch.testing.assert_close(patched, model(src_b, tgt))


def test_patching_some_positions_and_heads(tiny_model, tiny_config):
    src, tgt = make_batch(tiny_config, pad=False)
    name = "enc.0.self_attn.hook_v"
    _, clean = tiny_model.run_with_cache(src, tgt, names=name)
    other = torch.randn_like(clean[name])
    with tiny_model.intervene({name: patch(other, positions=[1, 3], heads=[2])}):
        _, patched = tiny_model.run_with_cache(src, tgt, names=name)
    got, want = patched[name], clean[name].clone()
    want[:, 2, [1, 3]] = other[:, 2, [1, 3]]
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="capture it from an input of the same batch size and length"):
        with tiny_model.intervene({name: patch(other[:, :, :2])}):
            tiny_model(src, tgt)


def test_patching_heads_of_a_tensor_without_heads_is_refused(tiny_model, tiny_config):
    # (B, S, D) has positions on dim 1; heads=[5] used to overwrite position 5 without a word
    src, tgt = make_batch(tiny_config, pad=False)
    _, clean = tiny_model.run_with_cache(src, tgt, names="hook_memory")
    other = torch.randn_like(clean["hook_memory"])
    with pytest.raises(ValueError, match=r"patch\(heads=\[5\]\) needs a \(B, H, L, \*\) per-head activation; "
                                         r"hook_memory has shape"):
        with tiny_model.intervene({"hook_memory": patch(other, heads=[5])}):
            tiny_model(src, tgt)


def test_ablate_heads_reads_every_head_spelling(tiny_model, tiny_config):
    from workbench.core.heads import Head

    by_block = ablate_heads({("cross", 1): [0, 2], ("enc_self", 0): 3})
    by_head = ablate_heads(["cross:1:0", ("cross", 1, 2), Head("enc_self", 0, 3)])
    assert sorted(by_block) == sorted(by_head) == ["dec.1.cross_attn.hook_context", "enc.0.self_attn.hook_context"]
    src, tgt = make_batch(tiny_config)
    with tiny_model.intervene(by_block):
        want = tiny_model(src, tgt)
    with tiny_model.intervene(by_head):
        got = tiny_model(src, tgt)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="kind:layer:head"):
        ablate_heads(["crosss:1:0"])

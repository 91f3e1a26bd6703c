"""The residual stream described once (issue 29 point 8): what `layer.sublayers()`, `model.stream()` and
`path_of` publish is checked against what the forward pass really does, read with plain PyTorch hooks."""

from __future__ import annotations

import pytest
import torch

from workbench import Transformer, presets
from workbench.core.hooks import HookPoint, path_of
from workbench.core.layers import LayerNorm


@pytest.fixture(params=[True, False], ids=["pre-norm", "post-norm"])
def model(request):
    torch.manual_seed(0)
    return Transformer(presets.tiny(norm_first=request.param)).eval()


def _run(model):
    src = torch.tensor([[5, 6, 7, 8, 2]])
    tgt = torch.tensor([[1, 9, 10, 11]])
    reads, writes = {}, {}

    def pre(module, args, kwargs):
        reads[module] = args[0].detach().clone()

    def post(module, args, kwargs, out):
        writes[module] = (out[0] if isinstance(out, tuple) else out).detach().clone()

    handles = []
    for stack in ("enc", "dec"):
        for _, sub in model.stream(stack).sublayers():
            handles += [sub.block.register_forward_pre_hook(pre, with_kwargs=True),
                        sub.block.register_forward_hook(post, with_kwargs=True)]
    try:
        with torch.no_grad():
            _, trace = model.run_with_cache(src, tgt, names=None)
    finally:
        for h in handles:
            h.remove()
    return trace, reads, writes


def test_each_sublayer_names_what_its_block_reads_and_the_stream_around_it(model):
    trace, reads, writes = _run(model)
    for stack, names in (("enc", ["self_attn", "ffn"]), ("dec", ["self_attn", "cross_attn", "ffn"])):
        stream = model.stream(stack)
        subs = stream.sublayers()
        assert [(i, s.name) for i, s in subs] == [(i, n) for i in range(len(stream.layers)) for n in names]
        for i, sub in subs:
            layer = stream.layers[i]
            assert layer.sublayer(sub.name).block is sub.block is getattr(layer, sub.name)
            # the block reads exactly the tensor at hook_block_in (pre-norm: its norm's output; post-norm: the stream)
            torch.testing.assert_close(trace[sub.hook_block_in.name], reads[sub.block], rtol=0, atol=0)
            before, after = trace[sub.hook_resid_before.name], trace[sub.hook_resid.name]
            if model.cfg.norm_first:
                assert sub.hook_block_in is sub.hook_norm
                torch.testing.assert_close(after, before + writes[sub.block], rtol=1e-6, atol=1e-6)
            else:  # the norm comes after the add
                assert sub.hook_block_in is sub.hook_resid_before
                torch.testing.assert_close(after, sub.norm(before + writes[sub.block]), rtol=1e-6, atol=1e-6)
        # the stream is continuous: each sub-layer starts where the last one ended, each layer where the last did
        for (i, a), (j, b) in zip(subs, subs[1:]):
            assert b.hook_resid_before is (a.hook_resid if i == j else stream.layers[j].hook_resid_in)
        assert subs[0][1].hook_resid_before is stream.layers[0].hook_resid_in


def test_path_of_is_each_modules_place_in_the_tree(model):
    with_points = [(name, m) for name, m in model.named_modules()
                   if any(isinstance(x, HookPoint) for x in m.modules())]
    assert len(with_points) > 40
    for name, module in with_points:
        assert path_of(module) == name
    assert path_of(model.dec[1].cross_attn) == "dec.1.cross_attn"
    with pytest.raises(ValueError, match="no named hook point"):
        path_of(LayerNorm(8))  # not part of a model: its hook points have no names
    with pytest.raises(ValueError, match="no named hook point"):
        path_of(model.src_embed)
    with pytest.raises(ValueError, match="has no sub-layer 'cross_attn'"):
        model.enc[0].sublayer("cross_attn")

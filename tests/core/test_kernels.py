"""`core.kernels`: the plain path on a CPU, and the Triton kernel through Triton's interpreter.

The interpreter runs the kernel's code on the CPU with numpy (TRITON_INTERPRET=1), so the kernel's indexing (the
mask's broadcast strides, a hidden row, rows over one block) is checked wherever Triton is installed; the compiled
kernel on a GPU is checked by tests/test_cuda.py. The project does not install Triton on a CPU machine: there the
interpreter test skips.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from model_helpers import ROOT

from workbench.core import kernels


def test_on_a_cpu_the_plain_path_runs_in_place():
    scores = torch.randn(2, 3, 4, 5)
    mask = torch.rand(2, 1, 1, 5) > 0.4
    mask[0, 0, 0, :] = False
    expected = scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(-1)
    assert not kernels.fused_softmax_usable(scores)
    got = kernels.masked_softmax_(scores, mask)
    assert got is scores
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(got[0, :, :, :], torch.full((3, 4, 5), 0.2), rtol=0, atol=0)  # nothing visible


_INTERPRETED = textwrap.dedent("""
    import torch
    from workbench import presets
    from workbench.core import kernels
    from model_helpers import make_batch, make_model

    gen = torch.Generator().manual_seed(0)
    cases = [((2, 3, 5, 7), (2, 1, 1, 7)), ((2, 3, 5, 7), (5, 7)), ((1, 2, 4, 1030), (1, 1, 4, 1030)),
             ((2, 2, 3, 4), None), ((2, 2, 3, 4), (2, 2, 3, 4))]
    for shape, mask_shape in cases:
        scores = torch.randn(shape, generator=gen) * 4
        mask = None if mask_shape is None else torch.rand(mask_shape, generator=gen) > 0.3
        if mask is not None:
            mask.view(-1, mask.size(-1))[0] = False
        assert kernels.fused_softmax_usable(scores)
        got = kernels.masked_softmax_(scores.clone(), mask)
        torch.testing.assert_close(got, kernels.masked_softmax_reference(scores, mask), rtol=1e-6, atol=1e-6)

    # the attention kernels: q, k, v as the model makes them (transposed head views), every mask shape
    q, k, v = (torch.randn(2, n, 3, 16, generator=gen).transpose(1, 2) for n in (70, 75, 75))
    for mask in (None, torch.rand(2, 1, 1, 75, generator=gen) > 0.3, torch.rand(70, 75, generator=gen) > 0.3,
                 torch.rand(2, 1, 70, 75, generator=gen) > 0.2):
        if mask is not None:
            mask.view(-1, mask.size(-1))[0] = False
        assert kernels.fused_attention_usable(q, k, v)
        expected = kernels.masked_softmax_reference(torch.matmul(q * 0.25, k.transpose(-2, -1)), mask)
        probs = kernels.attention_probs(q, k, mask, 0.25)
        torch.testing.assert_close(probs, expected, rtol=1e-6, atol=1e-6)
        context = kernels.probs_times_values(probs, v)
        torch.testing.assert_close(context, torch.matmul(expected, v), rtol=1e-6, atol=1e-6)
        assert context.transpose(1, 2).is_contiguous()  # SDPA's layout: merging the heads is a view

    cfg = presets.tiny(vocab=40)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=2, src_len=6, tgt_len=5)
    src[0, -2:] = cfg.pad_id

    def zero_head(probs, hook):  # an in-place edit must reach the output
        probs[:, 1] = 0

    logits, fused = model.run_with_cache(src, tgt)
    with model.hooks({"dec.0.cross_attn.hook_probs": zero_head}):
        edited = model(src, tgt)
    kernels.fused_softmax_usable = lambda scores: False
    kernels.fused_attention_usable = lambda q, k, v: False
    plain_logits, plain = model.run_with_cache(src, tgt)
    with model.hooks({"dec.0.cross_attn.hook_probs": zero_head}):
        plain_edited = model(src, tgt)
    torch.testing.assert_close(logits, plain_logits, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(edited, plain_edited, rtol=1e-6, atol=1e-6)
    assert (edited - logits).abs().max() > 1e-3
    names = plain.names("*.hook_probs")
    assert names
    for name in names:
        torch.testing.assert_close(fused[name], plain[name], rtol=1e-6, atol=1e-6)
    print("ok", len(names))
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed (CUDA wheels carry it)")
def test_the_kernel_through_triton_s_interpreter_equals_the_plain_path():
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok")

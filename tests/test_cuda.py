"""The CUDA paths against the CPU's: fused attention, capture, interventions, decoding, bf16 training, checkpoints.

Every test is marked `gpu` (skipped where torch sees no CUDA device; `benchmarks/gpu_check.sh` runs them on an
accelerator). Tolerances: fp32 on the GPU differs from the CPU by summation order only (TF32 is off for these
tests), so logits and probabilities agree to 1e-4 / 1e-5; bf16 autocast training is compared by its loss curve.
"""

from __future__ import annotations

import math

import pytest
import torch
from model_helpers import ROOT, SHARED_DATA, make_batch, make_model

from workbench import presets
from workbench.core.interventions import ablate_heads

pytestmark = pytest.mark.gpu


@pytest.fixture
def exact_fp32(monkeypatch):
    """Full fp32 matmuls on the GPU (no TF32), so the CPU is a fair reference."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def test_fused_forward_on_cuda_equals_cpu(exact_fp32):
    cfg = presets.tiny(vocab=60)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=4, src_len=9, tgt_len=7)
    cpu = model(src, tgt)
    gpu = model.cuda()(src.cuda(), tgt.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-4)


def test_capture_on_cuda_equals_cpu_and_the_fused_path(exact_fp32):
    cfg = presets.tiny(vocab=60)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=3, src_len=8, tgt_len=6)
    cpu_logits, cpu_trace = model.run_with_cache(src, tgt)
    gpu_model = model.cuda()
    gpu_logits, gpu_trace = gpu_model.run_with_cache(src.cuda(), tgt.cuda())
    torch.testing.assert_close(gpu_logits, gpu_model(src.cuda(), tgt.cuda()), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gpu_logits.cpu(), cpu_logits, rtol=1e-4, atol=1e-4)
    for kind in ("enc_self", "dec_self", "cross"):
        for layer in range(cfg.enc_layers if kind == "enc_self" else cfg.dec_layers):
            for head in range(cfg.n_heads):
                torch.testing.assert_close(gpu_trace.attention(kind, layer=layer, head=head).cpu(),
                                           cpu_trace.attention(kind, layer=layer, head=head), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_masked_softmax_equals_the_plain_path(dtype):
    """The capture kernel against masked_fill + softmax: every mask shape the model makes, a fully hidden row,
    rows longer than one block of 1024 keys. fp32 to 1e-6 (summation order); bf16 to one rounding step."""
    from workbench.core import kernels

    if not kernels.fused_softmax_usable(torch.zeros(1, 1, 1, 8, device="cuda", dtype=dtype)):
        pytest.skip("Triton is not installed beside this torch")
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = [((4, 8, 64, 64), (4, 1, 1, 64)), ((4, 8, 64, 64), (64, 64)), ((2, 8, 33, 70), (2, 1, 33, 70)),
             ((2, 3, 5, 1500), (2, 1, 1, 1500)), ((3, 2, 7, 9), None), ((2, 2, 4, 6), (2, 2, 4, 6))]
    for shape, mask_shape in cases:
        scores = (torch.randn(shape, device="cuda", generator=gen) * 4).to(dtype)
        mask = None if mask_shape is None else torch.rand(mask_shape, device="cuda", generator=gen) > 0.3
        if mask is not None:
            mask.view(-1, mask.size(-1))[0] = False  # one row with nothing visible: uniform, as the plain path
        expected = kernels.masked_softmax_reference(scores, mask)
        got = kernels.masked_softmax_(scores.clone(), mask)
        tol = 1e-6 if dtype == torch.float32 else 2 ** -8
        torch.testing.assert_close(got.float(), expected.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_capture_through_the_fused_kernels_equals_the_plain_path(exact_fp32, monkeypatch, dtype):
    """Every captured probability and the logits through the Triton kernels (probabilities from q and k, probs @ v)
    against the plain path; an in-place edit of the probabilities by a hook reaches the output on both."""
    from workbench.core import kernels

    cfg = presets.tiny(vocab=60, d_model=64)
    model = make_model(cfg).cuda().to(dtype)
    src, tgt = make_batch(cfg, batch=3, src_len=70, tgt_len=66)
    src, tgt = src.cuda(), tgt.cuda()
    src[0, -9:] = cfg.pad_id  # a padding mask that hides keys

    def zero_head(probs, hook):
        probs[:, 1] = 0

    def run():
        logits, trace = model.run_with_cache(src, tgt)
        with model.hooks({"dec.1.cross_attn.hook_probs": zero_head}):
            edited = model(src, tgt)
        return logits, trace, edited

    q = torch.zeros(1, 1, 1, cfg.d_model // cfg.n_heads, device="cuda", dtype=dtype)
    if not kernels.fused_attention_usable(q, q, q):
        pytest.skip("Triton is not installed beside this torch, or the head size has no kernel")
    fused_logits, fused, fused_edited = run()
    monkeypatch.setattr(kernels, "fused_softmax_usable", lambda scores: False)
    monkeypatch.setattr(kernels, "fused_attention_usable", lambda q, k, v: False)
    plain_logits, plain, plain_edited = run()
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(fused_logits.float(), plain_logits.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(fused_edited.float(), plain_edited.float(), rtol=tol, atol=tol)
    assert (plain_edited - plain_logits).abs().max() > 10 * tol
    names = plain.names("*.hook_probs")
    assert len(names) == cfg.enc_layers + 2 * cfg.dec_layers
    for name in names:
        torch.testing.assert_close(fused[name].float(), plain[name].float(), rtol=1e-6 if dtype == torch.float32
                                   else 2 ** -8, atol=1e-6 if dtype == torch.float32 else 2 ** -8)


def test_head_ablation_on_cuda_equals_cpu(exact_fp32):
    cfg = presets.tiny(vocab=60)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=2)
    spec = {("cross", 1): [0, 2], ("enc_self", 0): [1]}
    with model.intervene(ablate_heads(spec)):
        cpu = model(src, tgt)
    gpu_model = model.cuda()
    with gpu_model.intervene(ablate_heads(spec)):
        gpu = gpu_model(src.cuda(), tgt.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(gpu.cpu(), model.cpu()(src, tgt), atol=1e-3)  # the ablation did something


def test_shipped_model_translates_the_same_on_cuda(exact_fp32):
    """Greedy and beam-5 translations of the shipped de->en model: the GPU writes what the CPU writes."""
    import workbench

    lines = (SHARED_DATA / "multi30k" / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:16]
    path = ROOT / "checkpoints" / "multi30k-de-en"
    cpu, gpu = workbench.load(path), workbench.load(path, device="cuda")
    for beam in (1, 5):
        assert gpu.translate(lines, beam=beam) == cpu.translate(lines, beam=beam), f"beam {beam}"


def _copy_run(tmp_path, amp: str, steps: int) -> list[float]:
    from workbench.training import Trainer
    from workbench.training.config import TrainConfig

    cfg = TrainConfig(dataset="copy", preset="tiny", copy_vocab=20, copy_len=10, copy_pairs=2000, max_tokens=1024,
                      schedule="inverse_sqrt", lr=2e-3, warmup=50, label_smoothing=0.1, max_steps=steps, log_every=10,
                      eval_every=0, save_every=steps, bleu=False, out_dir=str(tmp_path / amp), device="cuda",
                      amp=amp, seed=3)
    trainer = Trainer(cfg, progress="none")
    fused = [g.get("fused") for g in trainer.optimizer.param_groups]
    assert all(fused), f"the CUDA optimizer should be the fused kernel, got {fused}"
    trainer.fit()
    return [r["loss"] for r in trainer.log if r["kind"] == "train"]


def test_bf16_training_follows_the_fp32_loss_curve(tmp_path):
    """Same seed and data: bf16 autocast learns the copy task as fp32 does (the curves' last fifth agree to 10 %
    relative), every logged loss is finite, and the checkpoint written on the GPU loads on the CPU."""
    steps = 200
    fp32, bf16 = _copy_run(tmp_path, "off", steps), _copy_run(tmp_path, "bf16", steps)
    assert all(math.isfinite(x) for x in fp32 + bf16)
    tail = max(1, len(fp32) // 5)
    a, b = sum(fp32[-tail:]) / tail, sum(bf16[-tail:]) / tail
    assert abs(a - b) <= 0.1 * a, (fp32, bf16)
    assert b < bf16[0] - 1.0, "bf16 training did not learn (it lost less than 1 nat)"
    from workbench.checkpoint.format import load_checkpoint

    ckpt = load_checkpoint(tmp_path / "bf16")
    assert next(ckpt.model.parameters()).device.type == "cpu"
    assert all(bool(torch.isfinite(t).all()) for t in ckpt.model.state_dict().values())

"""Triton kernels for capturing attention on a GPU, each the twin of a plain-torch path it must equal.

Capturing every attention probability needs the explicit block, softmax(mask(QKᵀ/√d)) V, where the plain forward
runs fused SDPA. On an H100 at base size (B=32, H=8, 512 × 512, bf16) the explicit block in plain torch took
0.64 ms against SDPA's 0.09: a masked fill through a broadcast mask (0.38 ms), the softmax, two matmuls, and a copy
of each transposed head view (q·scale, kᵀ, v) that torch.matmul makes before cuBLAS can batch it. Here:

- `attention_probs(q, k, mask, scale)`: the probabilities from q and k read through their strides, written once
  (a first sweep over the keys finds each row's maximum and sum, a second writes exp(s − max) / sum): the scores
  are never stored and the head views never copied;
- `probs_times_values(probs, v)`: the context, through any strides, in SDPA's memory layout;
- `masked_softmax_(scores, mask)`: mask and softmax of stored scores in one pass, in place (the subset-of-heads
  path, which computes the scores of a few heads itself).

Together: one block 0.24 ms, capture at 32×512 ×1.47 its plain forward (×2.23 before), half the time of the
peers' captures (docs/gpu.md, fourth run). `fused_attention_usable` / `fused_softmax_usable` say when they run:
CUDA (or Triton's interpreter, TRITON_INTERPRET=1, for tests on a CPU) with Triton importable — PyTorch's CUDA
wheels carry it, its CPU wheels do not — and not under torch.compile; otherwise the plain path runs.

Equality with the plain path (`masked_softmax_reference`, and matmul): the same fill value (finfo.min), q·scale
and the scores rounded to the tensors' dtype as the plain path's matmul rounds them, the softmax accumulated in
fp32 with libdevice's `expf` (what PyTorch's CUDA softmax calls) and one rounding at the end, fp32 matmuls in IEEE
precision; only summation orders differ. fp32 probabilities agree to 1e-6, bf16 ones to one rounding step
(tests/test_cuda.py on a GPU; tests/core/test_kernels.py through the interpreter wherever Triton is installed).
"""

from __future__ import annotations

import os

import torch

from . import triton_attention

# Rows longer than this fall back to the plain path (a row lives in one program's registers).
MAX_FUSED_KEYS = 8192


def _triton():
    """(triton, the softmax kernel, whether it uses libdevice, the probabilities kernel, the context kernel), or
    None where Triton cannot be imported (`core.triton_attention`, where the kernels live)."""
    if triton_attention.triton is None:
        return None
    return (triton_attention.triton, triton_attention.masked_softmax_rows, triton_attention.USE_LIBDEVICE,
            triton_attention.attention_probs_tiles, triton_attention.probs_values_tiles)


def fused_softmax_usable(scores: torch.Tensor) -> bool:
    """Whether `masked_softmax_` takes the fused kernel for these scores (else it runs the plain path)."""
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    return (
        (scores.device.type == "cuda" or interpret)
        and scores.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and scores.dim() == 4
        and scores.is_contiguous()
        and 0 < scores.size(-1) <= MAX_FUSED_KEYS
        and scores.numel() > 0
        and not torch.compiler.is_compiling()
        and _triton() is not None
    )


def masked_softmax_reference(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The plain path: what `masked_softmax_` computes, out of place."""
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1)


def masked_softmax_(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(scores with `mask`'s False entries at finfo.min) over the last dim, in place; returns `scores`.

    `scores` (B, H, Lq, Lk) contiguous; `mask` bool, broadcastable to it (True = visible), or None. A row with no
    visible key becomes uniform, as with the plain path.
    """
    if not fused_softmax_usable(scores):
        return scores.copy_(masked_softmax_reference(scores, mask))
    triton, kernel, use_libdevice = _triton()[:3]
    b, h, q_len, k_len = scores.shape
    if mask is None:
        mask_arg, strides, has_mask = scores, (0, 0, 0, 0), False
    else:
        if mask.dtype != torch.bool:
            raise TypeError(f"attention masks are bool (True = visible), got {mask.dtype}")
        expanded = mask.to(scores.device).expand(b, h, q_len, k_len)
        mask_arg, strides, has_mask = expanded.view(torch.uint8), expanded.stride(), True
    block = triton.next_power_of_2(k_len)
    rows_per_program = max(1, min(16, 2048 // block))  # short rows share a program: a 64-key row alone idles most lanes
    warps = 4 if block <= 2048 else 8 if block <= 4096 else 16
    n_rows = b * h * q_len
    kernel[(triton.cdiv(n_rows, rows_per_program),)](
        scores, mask_arg, n_rows, k_len, q_len, h, *strides, torch.finfo(scores.dtype).min,
        HAS_MASK=has_mask, LIBDEVICE=use_libdevice, ROWS=rows_per_program, BLOCK=block, num_warps=warps,
    )
    return scores


# Query and key tiles of the attention kernels; a head size outside HEAD_DIMS takes the plain path.
BLOCK_M, BLOCK_N = 64, 64
HEAD_DIMS = (16, 32, 64, 128)


def fused_attention_usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `attention_probs` / `probs_times_values` take the Triton kernels (CUDA, or Triton's interpreter)."""
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    return (
        (q.device.type == "cuda" or interpret)
        and q.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and q.dtype == k.dtype == v.dtype
        and q.dim() == 4
        and q.size(-1) in HEAD_DIMS
        and q.numel() > 0
        and k.size(2) > 0
        and not torch.compiler.is_compiling()
        and _triton() is not None
    )


def _mask_strides(mask: torch.Tensor | None, shape: tuple[int, ...], device) -> tuple[torch.Tensor | None, tuple]:
    if mask is None:
        return None, (0, 0, 0, 0)
    if mask.dtype != torch.bool:
        raise TypeError(f"attention masks are bool (True = visible), got {mask.dtype}")
    expanded = mask.to(device).expand(shape)
    return expanded.view(torch.uint8), expanded.stride()


def attention_probs(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """softmax(mask((q · scale) kᵀ)), (B, H, Lq, Lk) contiguous: what the plain path's matmul, masked fill and
    softmax give (q · scale and the scores rounded to q's dtype as there), written once and never stored as
    scores. q, k (B, H, L, Dh) in any strides; `mask` bool broadcastable to the result (True = visible)."""
    b, h, q_len, head_dim = q.shape
    k_len = k.size(2)
    probs = torch.empty(b, h, q_len, k_len, dtype=q.dtype, device=q.device)
    triton, _, use_libdevice, kernel, _ = _triton()
    mask_arg, m_strides = _mask_strides(mask, probs.shape, q.device)
    kernel[(triton.cdiv(q_len, BLOCK_M), b * h)](
        q, k, probs, probs if mask_arg is None else mask_arg, h, q_len, k_len, scale,
        torch.finfo(q.dtype).min, *q.stride(), *k.stride(), *m_strides,
        HEAD_DIM=head_dim, HAS_MASK=mask_arg is not None, LIBDEVICE=use_libdevice,
        IEEE=q.dtype == torch.float32, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
    )
    return probs


def probs_times_values(probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """probs @ v, (B, H, Lq, Dh), laid out as SDPA's output is ((B, Lq, H, Dh) memory, so merging the heads is a
    view); either input in any strides. Other dtypes or shapes (a hook's edit may change them): torch.matmul."""
    if probs.dtype != v.dtype or probs.dim() != 4 or probs.shape[:2] != v.shape[:2] or probs.size(-1) != v.size(2):
        return torch.matmul(probs, v)
    b, h, q_len, k_len = probs.shape
    head_dim = v.size(-1)
    out = torch.empty(b, q_len, h, head_dim, dtype=v.dtype, device=v.device).transpose(1, 2)
    triton, *_, kernel = _triton()
    kernel[(triton.cdiv(q_len, BLOCK_M), b * h)](
        probs, v, out, h, q_len, k_len, *probs.stride(), *v.stride(), *out.stride(),
        HEAD_DIM=head_dim, IEEE=v.dtype == torch.float32, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
    )
    return out

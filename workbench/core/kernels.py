"""Fused kernels for accelerators, each the twin of a plain-torch path it must equal.

`masked_softmax_(scores, mask)`: softmax(scores.masked_fill(~mask, finfo.min)) over the last dimension, written in
place, in one read and one write of the (B, H, Lq, Lk) scores. It is what capturing attention costs on a GPU: the
plain path makes three passes over that tensor (a masked fill through a broadcast mask, which on an H100 costs 3.4x
the softmax after it, then the softmax's read and write; `benchmarks/results/gpu_capture_parts.json`). The kernel
is written in Triton, which PyTorch's CUDA wheels carry; without Triton, off CUDA, or under torch.compile the
plain path runs (`fused_softmax_usable`). On an H100 (base size, 32x8x512x512 bf16) mask + softmax went from
0.38 + 0.11 ms to 0.105 ms, one explicit attention block from 0.64 to 0.25-0.29 ms (docs/gpu.md, fourth run).

Equality with the plain path (`masked_softmax_reference`): the same fill value, the softmax accumulated in fp32
as PyTorch's CUDA kernels do (the row maximum subtracted, exp by libdevice's expf, the division by the row sum), and
one rounding to the tensor's dtype at the end; only the order in which a row's exponentials are summed differs,
so fp32 probabilities agree to about 1e-7 relative and bf16 ones to their rounding (tests/test_cuda.py; the
interpreter check in tests/core/test_kernels.py runs wherever Triton is installed).
"""

from __future__ import annotations

import functools
import os

import torch

# Rows longer than this fall back to the plain path (a row lives in one program's registers).
MAX_FUSED_KEYS = 8192


@functools.cache
def _triton():
    """(triton, the kernel), or None where Triton cannot be imported. Defined on first use: importing Triton takes
    a while, and a CPU machine has none. The kernel reads `tl` and `libdevice` as this module's globals (Triton
    resolves a kernel's names there; a closure is not visible to its compiler)."""
    try:  # optional: PyTorch's CUDA wheels carry Triton, its CPU wheels do not
        import triton
        import triton.language as tl
    except ImportError:
        return None
    try:  # libdevice's expf is the exp PyTorch's CUDA softmax calls
        from triton.language.extra import libdevice
    except ImportError:  # an older Triton: its tl.exp
        libdevice = None
    globals().update(tl=tl, libdevice=libdevice)
    # the interpreter (TRITON_INTERPRET=1: the kernel run by numpy on a CPU) has no libdevice
    use_libdevice = libdevice is not None and os.environ.get("TRITON_INTERPRET") != "1"

    @triton.jit
    def masked_softmax_rows(x_ptr, mask_ptr, n_rows, n_cols, q_len, heads, m_sb, m_sh, m_sq, m_sk, fill,
                            HAS_MASK: tl.constexpr, LIBDEVICE: tl.constexpr, ROWS: tl.constexpr,
                            BLOCK: tl.constexpr):
        """ROWS rows per program of (B, H, Lq, Lk) contiguous scores: fill the keys the mask hides, softmax in
        fp32, write back in the scores' dtype. The mask is read through its broadcast strides (0 where it
        broadcasts)."""
        rows = (tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS))[:, None]  # (ROWS, 1)
        cols = tl.arange(0, BLOCK)[None, :]  # (1, BLOCK)
        inside = (rows < n_rows) & (cols < n_cols)
        ptrs = x_ptr + rows * n_cols + cols
        x = tl.load(ptrs, mask=inside, other=0.0).to(tl.float32)
        if HAS_MASK:
            q = rows % q_len
            bh = rows // q_len
            h = bh % heads
            b = bh // heads
            visible = tl.load(mask_ptr + b * m_sb + h * m_sh + q * m_sq + cols * m_sk, mask=inside, other=0)
            x = tl.where(visible != 0, x, fill)
        x = tl.where(inside, x, float("-inf"))
        shifted = x - tl.max(x, axis=1)[:, None]
        if LIBDEVICE:
            e = libdevice.exp(shifted)
        else:
            e = tl.exp(shifted)
        tl.store(ptrs, (e / tl.sum(e, axis=1)[:, None]).to(x_ptr.dtype.element_ty), mask=inside)

    return triton, masked_softmax_rows, use_libdevice


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
    triton, kernel, use_libdevice = _triton()
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

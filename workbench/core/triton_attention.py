"""The Triton kernels behind `core.kernels`, at module level because Triton resolves a kernel's names among its
module's globals (a closure is not visible to its compiler). Read `core.kernels` for what each computes and how it
equals the plain path.

Triton is optional: PyTorch's CUDA wheels carry it, its CPU wheels do not. Without it `triton` is None and the
functions below are plain, never-called Python (`kernels._triton()` says None). With it, importing this module
imports Triton: 0.2–0.4 s after torch on this project's CPU machine (measured with Triton 3.9).
"""

from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

try:  # libdevice's expf is the exp PyTorch's CUDA softmax calls
    from triton.language.extra import libdevice
except ImportError:  # an older Triton (its tl.exp), or none
    libdevice = None

# the interpreter (TRITON_INTERPRET=1: the kernel run by numpy on a CPU) has no libdevice
USE_LIBDEVICE = libdevice is not None and os.environ.get("TRITON_INTERPRET") != "1"


def _plain(fn):
    return fn


jit = triton.jit if triton is not None else _plain


@jit
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

@jit
def _scores_tile(q, k_ptr, mask_ptr, b, h, rows, start, q_len, k_len, k_sb, k_sh, k_sl, k_sd,
                 m_sb, m_sh, m_sq, m_sk, fill, HEAD_DIM: tl.constexpr, HAS_MASK: tl.constexpr, IEEE: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """(BLOCK_M, BLOCK_N) masked scores in fp32, rounded to the tensors' dtype first, as the plain path's
    matmul output is; keys past the end at -inf."""
    cols = start + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    kt = tl.load(k_ptr + b * k_sb + h * k_sh + cols[None, :] * k_sl + dims[:, None] * k_sd,
                 mask=cols[None, :] < k_len, other=0.0)  # (HEAD_DIM, BLOCK_N)
    if IEEE:
        s = tl.dot(q, kt, input_precision="ieee")
    else:
        s = tl.dot(q, kt)
    s = s.to(k_ptr.dtype.element_ty).to(tl.float32)
    if HAS_MASK:
        visible = tl.load(mask_ptr + b * m_sb + h * m_sh + rows[:, None] * m_sq + cols[None, :] * m_sk,
                          mask=(rows[:, None] < q_len) & (cols[None, :] < k_len), other=0)
        s = tl.where(visible != 0, s, fill)
    return tl.where(cols[None, :] < k_len, s, float("-inf")), cols

@jit
def attention_probs_tiles(q_ptr, k_ptr, p_ptr, mask_ptr, heads, q_len, k_len, scale, fill,
                          q_sb, q_sh, q_sl, q_sd, k_sb, k_sh, k_sl, k_sd, m_sb, m_sh, m_sq, m_sk,
                          HEAD_DIM: tl.constexpr, HAS_MASK: tl.constexpr, LIBDEVICE: tl.constexpr,
                          IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """softmax(mask(round(q·scale) kᵀ)) for BLOCK_M queries of one (batch, head), written once: a first sweep
    over the keys finds each row's maximum and sum (rescaled as the maximum moves), a second writes
    exp(s − max) / sum. q and k are read through their strides (no copy of a transposed head view)."""
    bh = tl.program_id(1).to(tl.int64)  # int64 offsets: b x a full mask's batch stride can pass 2^31
    b = bh // heads
    h = bh % heads
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + b * q_sb + h * q_sh + rows[:, None] * q_sl + dims[None, :] * q_sd,
                mask=rows[:, None] < q_len, other=0.0)
    q = (q.to(tl.float32) * scale).to(q_ptr.dtype.element_ty)  # the plain path's q * scale, in q's dtype
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, k_len, BLOCK_N):
        s, cols = _scores_tile(q, k_ptr, mask_ptr, b, h, rows, start, q_len, k_len, k_sb, k_sh, k_sl, k_sd,
                               m_sb, m_sh, m_sq, m_sk, fill, HEAD_DIM, HAS_MASK, IEEE, BLOCK_N)
        new_max = tl.maximum(row_max, tl.max(s, axis=1))
        if LIBDEVICE:
            row_sum = row_sum * libdevice.exp(row_max - new_max) + tl.sum(
                libdevice.exp(s - new_max[:, None]), axis=1)
        else:
            row_sum = row_sum * tl.exp(row_max - new_max) + tl.sum(tl.exp(s - new_max[:, None]), axis=1)
        row_max = new_max
    out = p_ptr + (bh * q_len + rows[:, None]) * k_len
    for start in range(0, k_len, BLOCK_N):
        s, cols = _scores_tile(q, k_ptr, mask_ptr, b, h, rows, start, q_len, k_len, k_sb, k_sh, k_sl, k_sd,
                               m_sb, m_sh, m_sq, m_sk, fill, HEAD_DIM, HAS_MASK, IEEE, BLOCK_N)
        if LIBDEVICE:
            e = libdevice.exp(s - row_max[:, None])
        else:
            e = tl.exp(s - row_max[:, None])
        tl.store(out + cols[None, :], (e / row_sum[:, None]).to(p_ptr.dtype.element_ty),
                 mask=(rows[:, None] < q_len) & (cols[None, :] < k_len))

@jit
def probs_values_tiles(p_ptr, v_ptr, o_ptr, heads, q_len, k_len, p_sb, p_sh, p_sq, p_sk,
                       v_sb, v_sh, v_sl, v_sd, o_sb, o_sh, o_sl, o_sd, HEAD_DIM: tl.constexpr,
                       IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """probs @ v for BLOCK_M queries of one (batch, head), accumulated in fp32, through every stride."""
    bh = tl.program_id(1).to(tl.int64)  # int64 offsets: b x a full mask's batch stride can pass 2^31
    b = bh // heads
    h = bh % heads
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in range(0, k_len, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        p = tl.load(p_ptr + b * p_sb + h * p_sh + rows[:, None] * p_sq + cols[None, :] * p_sk,
                    mask=(rows[:, None] < q_len) & (cols[None, :] < k_len), other=0.0)
        v = tl.load(v_ptr + b * v_sb + h * v_sh + cols[:, None] * v_sl + dims[None, :] * v_sd,
                    mask=cols[:, None] < k_len, other=0.0)
        if IEEE:
            acc += tl.dot(p, v, input_precision="ieee")
        else:
            acc += tl.dot(p, v)
    tl.store(o_ptr + b * o_sb + h * o_sh + rows[:, None] * o_sl + dims[None, :] * o_sd,
             acc.to(o_ptr.dtype.element_ty), mask=rows[:, None] < q_len)

"""Multi-head attention with hook points and a per-call choice of kernel.

Fast path: `F.scaled_dot_product_attention` (fused; flash / memory-efficient on GPU).
Explicit path: softmax(Q Kᵀ / sqrt(d_k)) with masks, taken only when a hook in the current
context listens to `hook_scores` or `hook_probs`. `hook_context` (per-head output before the
output projection) is what SDPA returns, so head ablation stays on the fast path.
`hook_result` (each head's output as written into the residual stream: its context times its slice
of the output projection, bias excluded) is computed only when a hook listens to it.

Capture speed (issue 39). Profiling `run_with_cache` on CPU (tiny model, B=32, L=512) put ~90 % of the
capture's extra time in the three (B, H, Lq, Lk) tensors the textbook path writes per block (scores, the
masked copy, the probabilities) and above all in first touching their fresh pages: a 128 MiB tensor costs
~60-300 ms of page faults before any arithmetic. Without autograd the explicit path therefore writes one
tensor per block: QKᵀ lands in the buffer that becomes the probabilities, the mask and the softmax work in
place (bit-identical to the out-of-place ops: tested), and on CPU that buffer comes from 2 MiB pages,
recycled once freed (`_empty_probs`). On a GPU two Triton kernels take the block (`kernels.attention_probs`,
`kernels.probs_times_values`): the probabilities are written once from q and k, read through their strides (the
scores are never stored, and the head views are not copied: 4 copies of (B, H, L, Dh) per block went with them),
and probabilities of a subset of heads go through `kernels.masked_softmax_`. The context is `probs @ v`, not a
second fused SDPA call, so an edit made by a `hook_probs` hook reaches the output.

Heads. A hook function carrying `heads` (a tuple of head indices, see `hooks.reads_heads`) reads only
those heads of `hook_probs`: when every listener there says so, and nothing listens to `hook_scores`, the
block computes the probabilities of those heads only, passes them (B, len(heads), Lq, Lk) to the hooks
read-only, and takes its output from SDPA: capturing one head of one block costs one head's softmax.
"""

from __future__ import annotations

import math
import mmap
import threading
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .dropout import cheap_mask_usable
from .dropout import dropout as drop
from .hooks import HookPoint, observed
from .masks import causal_mask


class RowOrder:
    """A beam reorder owed to self-attention caches: current row i reads stored row `rows[i]`.

    Beam search reorders every layer's cache by the beams' parents each step, and each step's append then copied
    the whole cache again (`torch.cat`): two copies of every cache per step. Owing the reorder instead lets the
    next append gather the stored rows and write the new step in one pass (`KVCache.append`). One RowOrder is
    shared by a decoder's layers, so the flat index the gather reads is built once per step, not once per layer.
    """

    __slots__ = ("rows", "_flat")

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows  # (B,) indices into the stored rows
        self._flat: dict[int, torch.Tensor] = {}

    def then(self, index: torch.Tensor) -> RowOrder:
        """This reorder followed by `index` (rows of the reordered batch)."""
        return RowOrder(self.rows.index_select(0, index))

    def flat(self, heads: int) -> torch.Tensor:
        """(B·heads,) rows of the stored (B0·heads, L, Dh) view, in the current (B, heads) order."""
        index = self._flat.get(heads)
        if index is None:
            offsets = torch.arange(heads, device=self.rows.device)
            index = self._flat[heads] = (self.rows[:, None] * heads + offsets).view(-1)
        return index


class KVArena:
    """Two reused buffers (up to rows × H × capacity × Dh values) that one layer's self-attention keys (or values)
    alternate between during beam search: each step's gather-and-append (`KVCache.append`) writes into the buffer
    that the previous step's cache does not live in, so a step allocates nothing. On a CPU a fresh tensor of a few
    megabytes each step costs page faults (the gather took twice as long as into a reused buffer, tiny 320 beam
    rows). A cache written into an arena stays valid only until the step after next writes over it: arenas are
    for a search that keeps nothing but its newest cache (`DecoderCache.for_beams`)."""

    __slots__ = ("capacity", "_buffers")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # the most positions per row a cache will hold (buffers grow by doubling up to it)
        self._buffers: list[torch.Tensor] = []

    def out(self, stored: torch.Tensor, rows: int, length: int) -> torch.Tensor:
        """A contiguous (rows, H, length, Dh) tensor in a buffer that does not hold `stored` (being read)."""
        _, heads, _, d_head = stored.shape
        size = rows * heads * length * d_head
        home = stored.untyped_storage().data_ptr()
        for buf in self._buffers:
            if (buf.untyped_storage().data_ptr() != home and buf.numel() >= size and buf.dtype == stored.dtype
                    and buf.device == stored.device):
                return buf[:size].view(rows, heads, length, d_head)
        # room to grow by doubling, up to the search's longest cache: a few allocations per search, and never more
        # than twice what is used (an accelerator's allocator commits what it hands out)
        room = min(rows * heads * max(self.capacity, length) * d_head, 2 * size)
        buf = torch.empty(max(size, room), dtype=stored.dtype, device=stored.device)
        self._buffers = [b for b in self._buffers if b.untyped_storage().data_ptr() == home] + [buf]
        return buf[:size].view(rows, heads, length, d_head)


class KVCache:
    """Keys and values of one attention block, (B, H, L, Dh) each.

    A self-attention cache may owe a reorder (`reorder`, beam search following parents): `k` and `v` apply it
    when read, and `append` applies it while writing the next step, so a beam step copies its cache once.
    The stored tensors are never written after the cache is made: an older cache stays valid, and two
    continuations of one cache (decoding twice from it) do not disturb each other.
    """

    __slots__ = ("_k", "_v", "order", "group", "arenas", "_per_row")

    def __init__(self, k: torch.Tensor, v: torch.Tensor, order: RowOrder | None = None, group: int = 1,
                 arenas: tuple[KVArena, KVArena] | None = None) -> None:
        self._k, self._v, self.order = k, v, order
        self.group = group  # query rows per stored row: a sentence's beams sharing its cross-attention K/V
        self.arenas = arenas  # where owed reorders are written (beam search), for keys and values; None: fresh
        self._per_row: KVCache | None = None  # a shared cache's copy per query row, made once when a listener asks

    @property
    def k(self) -> torch.Tensor:
        return self._k if self.order is None else self._k.index_select(0, self.order.rows)

    @property
    def v(self) -> torch.Tensor:
        return self._v if self.order is None else self._v.index_select(0, self.order.rows)

    @property
    def length(self) -> int:
        """Positions held (L)."""
        return self._k.size(2)

    def __repr__(self) -> str:
        owed = "" if self.order is None else f", reordered to {self.order.rows.numel()} rows"
        return f"KVCache(k={tuple(self._k.shape)}, v={tuple(self._v.shape)}{owed})"

    def index_select(self, index: torch.Tensor) -> KVCache:
        """Rows `index` of the batch, copied now (cross-attention keys, read every step). A shared cache
        (`group` > 1) keeps its group: `index` then picks stored rows (sentences), each with all its beams."""
        return KVCache(self.k.index_select(0, index), self.v.index_select(0, index), group=self.group)

    def shared_by(self, group: int) -> KVCache:
        """These keys and values read by `group` consecutive query rows per stored row: beam search's K beams
        of a sentence attend to the same memory, so its cross-attention K/V are kept once per sentence (not K
        copies) and the beams' queries meet them in one (G·Lq)-row attention (`MultiHeadAttention.forward`).
        The mask passed with a shared cache is per stored row too."""
        if self.order is not None:
            raise ValueError("a cache that owes a reorder (self-attention) cannot be shared by query rows")
        return KVCache(self._k, self._v, group=group)

    def per_query_row(self) -> KVCache:
        """A shared cache copied out to one row per query row (what a listener to the probabilities reads), copied
        once and kept with it (a traced search asks every step)."""
        if self.group == 1:
            return self
        if self._per_row is None:
            self._per_row = KVCache(self._k.repeat_interleave(self.group, 0), self._v.repeat_interleave(self.group, 0))
        return self._per_row

    def reorder(self, index: torch.Tensor) -> KVCache:
        """Rows `index` of the current batch, owed: copied by the next `append` (or read)."""
        return self.read_through(RowOrder(index) if self.order is None else self.order.then(index))

    def read_through(self, order: RowOrder, arenas: tuple[KVArena, KVArena] | None = None) -> KVCache:
        """The stored K/V with `order` (rows of the stored batch) owed in place of this cache's own; `arenas`
        (keys, values): buffers the next append writes into (else this cache's own, else fresh tensors)."""
        return KVCache(self._k, self._v, order, arenas=arenas or self.arenas)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> KVCache:
        """The cache followed by new positions `k`, `v` (B, H, Lnew, Dh): owed reorder and new step in one copy."""
        if self.order is None or _needs_autograd(self._k, self._v, k, v) or k.dtype != self._k.dtype:
            return KVCache(torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2), arenas=self.arenas)
        arena_k, arena_v = self.arenas or (None, None)
        return KVCache(self._gather_append(self._k, k, arena_k), self._gather_append(self._v, v, arena_v),
                       arenas=self.arenas)

    def _gather_append(self, stored: torch.Tensor, new: torch.Tensor, arena: KVArena | None) -> torch.Tensor:
        """torch.cat([stored[rows], new], 2) written once: the rows' (L, Dh) blocks gathered straight into place
        (into `arena`'s free buffer when there is one)."""
        assert self.order is not None
        b0, heads, length, d_head = stored.shape
        b, total = self.order.rows.numel(), length + new.size(2)
        if arena is None:
            out = torch.empty((b, heads, total, d_head), dtype=stored.dtype, device=stored.device)
        else:
            out = arena.out(stored, b, total)
        # as (B·H, L, Dh), each gathered row is one contiguous block in both tensors: index_select's memcpy path
        torch.index_select(stored.reshape(b0 * heads, length, d_head), 0, self.order.flat(heads),
                           out=out.reshape(b * heads, total, d_head)[:, :length])
        out[:, :, length:] = new
        return out


def _needs_autograd(*tensors: torch.Tensor) -> bool:
    # out= copies are not differentiable: under autograd the append is the plain gather and cat
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class MultiHeadAttention(nn.Module):
    def __init__(self, *, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.hook_q_input = HookPoint()  # (B, Lq, H, D): what each head's query reads; only when listened to
        self.hook_k_input = HookPoint()  # (B, Lk, H, D): what each head's key reads
        self.hook_v_input = HookPoint()  # (B, Lk, H, D): what each head's value reads
        self.hook_q = HookPoint()  # (B, H, Lq, Dh)
        self.hook_k = HookPoint()  # (B, H, Lk, Dh)
        self.hook_v = HookPoint()  # (B, H, Lk, Dh)
        self.hook_scores = HookPoint()  # (B, H, Lq, Lk): scaled, masked, before softmax
        self.hook_probs = HookPoint()  # (B, H, Lq, Lk): rows sum to 1 over keys
        self.hook_context = HookPoint()  # (B, H, Lq, Dh): sum_k probs * v, per head
        self.hook_result = HookPoint()  # (B, H, Lq, D): per head, context @ W_O slice; only when listened to
        self.hook_out = HookPoint()  # (B, Lq, D): what the block adds to the residual stream

    # -- projections ------------------------------------------------------------------------
    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, L, Dh)

    def _split_inputs(self) -> bool:
        return self.hook_q_input.asked() or self.hook_k_input.asked() or self.hook_v_input.asked()

    def _per_head(self, lin: nn.Linear, point: HookPoint, x: torch.Tensor) -> torch.Tensor:
        """(B, H, L, Dh) projection of per-head inputs: `x` (B, L, D) copied once per head through `point`, so an
        edge into one head's query, key or value is read or edited there (TransformerLens's split qkv input)."""
        b, length, d = x.shape
        xh = point(x.unsqueeze(2).expand(b, length, self.n_heads, d))  # (B, L, H, D)
        out = torch.einsum("blhd,hed->bhle", xh, lin.weight.view(self.n_heads, self.d_head, d))
        return out if lin.bias is None else out + lin.bias.view(1, self.n_heads, 1, self.d_head)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention: one GEMM over the concatenated weights instead of three (each projection called as
        a module when a plain PyTorch hook watches one of them, so that hook sees and may edit its output; per
        head when a hook listens to the per-head inputs)."""
        if self._split_inputs():
            return (self._per_head(self.q_proj, self.hook_q_input, x),
                    self._per_head(self.k_proj, self.hook_k_input, x),
                    self._per_head(self.v_proj, self.hook_v_input, x))
        if observed(self.q_proj) or observed(self.k_proj) or observed(self.v_proj):
            return self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        b = None if self.q_proj.bias is None else torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
        q, k, v = F.linear(x, w, b).chunk(3, dim=-1)
        return self._heads(q), self._heads(k), self._heads(v)

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        """Cross-attention queries from the decoder stream, hooked."""
        if self._split_inputs():
            return self.hook_q(self._per_head(self.q_proj, self.hook_q_input, x))
        return self.hook_q(self._heads(self.q_proj(x)))

    def project_kv(self, x: torch.Tensor) -> KVCache:
        """Keys and values from `x`, hooked: used for cross-attention memory (once per sentence)."""
        if self._split_inputs():
            return KVCache(self.hook_k(self._per_head(self.k_proj, self.hook_k_input, x)),
                           self.hook_v(self._per_head(self.v_proj, self.hook_v_input, x)))
        if observed(self.k_proj) or observed(self.v_proj):
            return KVCache(self.hook_k(self._heads(self.k_proj(x))), self.hook_v(self._heads(self.v_proj(x))))
        w = torch.cat([self.k_proj.weight, self.v_proj.weight])
        b = None if self.k_proj.bias is None else torch.cat([self.k_proj.bias, self.v_proj.bias])
        k, v = F.linear(x, w, b).chunk(2, dim=-1)
        return KVCache(self.hook_k(self._heads(k)), self.hook_v(self._heads(v)))

    # -- forward ----------------------------------------------------------------------------
    def forward(
        self,
        x: torch.Tensor,
        *,
        memory: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        static_kv: KVCache | None = None,
    ) -> tuple[torch.Tensor, KVCache | None]:
        """Attend from `x` (B, Lq, D).

        Self-attention: keys/values from `x`, appended to `cache` when decoding incrementally.
        Cross-attention: keys/values from `memory`, or `static_kv` computed once beforehand.
        `mask` is bool, broadcastable to (B, H, Lq, Lk), True = may attend. With `causal`,
        query i sees keys up to its absolute position (cache length + i).
        Returns the block output and the (new) self-attention cache.
        """
        group = 1
        if static_kv is not None or memory is not None:
            q = self.project_q(x)
            kv = static_kv if static_kv is not None else self.project_kv(memory)  # type: ignore[arg-type]
            if kv.group > 1:
                if self._can_share(mask):
                    group = kv.group
                else:  # a listener reads per-row probabilities: copy the shared rows out (and their mask)
                    mask = None if mask is None else mask.repeat_interleave(kv.group, 0)
                    kv = kv.per_query_row()
            k, v, new_cache = kv.k, kv.v, None
        else:
            q, k, v = self.project_qkv(x)
            q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
            new_cache = KVCache(k, v) if cache is None else cache.append(k, v)
            k, v = new_cache.k, new_cache.v

        q_len, k_len = q.size(2), k.size(2)
        offset = k_len - q_len  # earlier positions held in the cache
        if causal and q_len == 1:
            causal = False  # a single newest query may see every cached key
        dropout = self.dropout if self.training else 0.0

        if group > 1:
            context = self._shared_attention(q, k, v, mask, group)
            return self.hook_out(self._project_out(self.hook_context(context))), new_cache
        # heads whose probabilities a listener reads: None = every head, and the output must follow them
        heads = None if self.hook_scores.is_active() else self.hook_probs.wanted_heads()
        if heads is None or (not heads and cheap_mask_usable(q, dropout)):
            # CPU training with attention dropout: SDPA would take its math path there anyway, drawing the mask
            # with bernoulli_; the explicit block draws the cheaper one (`core.dropout`; with the masks applied by
            # `where`, the tiny trainer step x1.09-1.24 faster on 2 cores, docs/training.md)
            context = self._explicit(q, k, v, mask, causal, offset, dropout)
        else:
            if heads:
                self._observe_heads(q, k, heads, mask, causal)
            if causal and (mask is not None or offset):
                mask = _merge_causal(mask, q_len, k_len, q.device)
                causal = False
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal)
        context = self.hook_context(context)  # (B, H, Lq, Dh)
        if self.hook_result.is_active():
            return self.hook_out(self._by_head(context)), new_cache
        return self.hook_out(self._project_out(context)), new_cache

    def _can_share(self, mask: torch.Tensor | None) -> bool:
        """Whether shared cross-attention K/V can be read as they are: no listener to the probabilities or
        scores (they are per query row), a per-row mask, eval mode (no dropout)."""
        return (not self.training and not self.hook_scores.is_active() and self.hook_probs.wanted_heads() == ()
                and (mask is None or mask.size(-2) == 1) and not self.hook_result.is_active())

    def _shared_attention(self, q, k, v, mask, group: int) -> torch.Tensor:
        """(B·G, H, Lq, Dh) context of queries whose G consecutive rows share one stored row of k, v, mask:
        each stored row's G·Lq queries attend in one call (the K/V are read once, not G times)."""
        rows, heads, q_len, d_head = q.shape
        b = rows // group
        grouped = q.view(b, group, heads, q_len, d_head).transpose(1, 2).reshape(b, heads, group * q_len, d_head)
        out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask)  # (B, H, G·Lq, Dh)
        return out.view(b, heads, group, q_len, d_head).transpose(1, 2).reshape(rows, heads, q_len, d_head)

    def _project_out(self, context: torch.Tensor) -> torch.Tensor:
        b, _, q_len, _ = context.shape
        return self.out_proj(context.transpose(1, 2).reshape(b, q_len, self.n_heads * self.d_head))

    def head_weights(self) -> torch.Tensor:
        """Each head's slice of the output projection, (H, Dh, D): result_h = context_h @ W[h]."""
        return self.out_proj.weight.t().reshape(self.n_heads, self.d_head, -1)

    def ov(self) -> torch.Tensor:
        """Each head's value-output circuit, (H, D, D): for a value input x (B, L, D), head h writes x @ ov[h] at
        each key position before its pattern mixes them (plus its value bias through W_O; the block's bias apart)."""
        return torch.einsum("hed,hef->hdf", self.v_proj.weight.view(self.n_heads, self.d_head, -1),
                            self.head_weights())

    def _by_head(self, context: torch.Tensor) -> torch.Tensor:
        # per-head terms summed: equals out_proj on the concatenated heads up to summation order
        raw = torch.einsum("bhld,hde->bhle", context, self.head_weights())
        result = self.hook_result(raw)
        if observed(self.out_proj):  # out_proj's own hooks see its call; edits to the heads are added on top
            return self._project_out(context) + (result.sum(1) - raw.sum(1) if result is not raw else 0)
        out = result.sum(1)
        return out if self.out_proj.bias is None else out + self.out_proj.bias

    def _explicit(self, q, k, v, mask, causal, offset, dropout) -> torch.Tensor:
        if causal:
            mask = _merge_causal(mask, q.size(2), k.size(2), q.device)
        autograd = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
        # a GPU: probabilities from q and k in one kernel (scores never stored), and probs @ v in another
        fused = (not autograd and not dropout and not self.hook_scores.is_active()
                 and kernels.fused_attention_usable(q, k, v))
        if autograd:
            # autograd needs every step out of place (softmax's backward reads its output, matmul's its inputs)
            scores = torch.matmul(q * (1.0 / math.sqrt(self.d_head)), k.transpose(-2, -1))  # (B, H, Lq, Lk)
            if mask is not None:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            probs = torch.softmax(self.hook_scores(scores), dim=-1)
        elif fused:
            probs = kernels.attention_probs(q, k, mask, 1.0 / math.sqrt(self.d_head))
        else:
            probs = self._probs(q, k, mask)
        probs = self.hook_probs(probs)  # a hook's edit reaches the output either way: the context reads `probs`
        if dropout:
            probs = drop(probs, dropout)
        return kernels.probs_times_values(probs, v) if fused else torch.matmul(probs, v)

    def _probs(self, q, k, mask) -> torch.Tensor:
        """softmax(masked QKᵀ/√Dh), (B, H, Lq, Lk), written once: scores, mask and softmax share one buffer
        unless a hook listens to the scores (it may keep them), and then the softmax gets its own."""
        b, h, q_len, _ = q.shape
        # scale q (L·Dh values) rather than the scores (L² values): one fewer pass over the big tensor
        scores = torch.matmul(q * (1.0 / math.sqrt(self.d_head)), k.transpose(-2, -1),
                              out=_empty_probs((b, h, q_len, k.size(2)), q))
        if not self.hook_scores.is_active() and kernels.fused_softmax_usable(scores):
            return kernels.masked_softmax_(scores, mask)  # a GPU: mask and softmax in one pass, in place
        if mask is not None:
            _mask_in_place(scores, mask)
        seen = self.hook_scores(scores)
        # softmax accumulates in fp32 internally for half types, so no upcast copy is needed. In place only on
        # CPU, where the row kernel reads a row before writing it (tested equal); elsewhere the allocator is
        # cheap and an aliased out= is not a documented contract of the kernels.
        in_place = seen is scores and not self.hook_scores.is_active() and q.device.type == "cpu"
        return torch.softmax(seen, dim=-1, out=seen if in_place else _empty_probs(seen.shape, seen))

    def _observe_heads(self, q, k, heads, mask, causal) -> None:
        """Run `hook_probs` on the listed heads' probabilities only (the block's output comes from SDPA)."""
        index = torch.tensor(heads, device=q.device)
        if mask is not None and mask.dim() == 4 and mask.size(1) > 1:
            mask = mask.index_select(1, index)
        if causal:
            mask = _merge_causal(mask, q.size(2), k.size(2), q.device)
        with torch.no_grad():  # read-only by contract: nothing downstream depends on these probabilities
            probs = self._probs(q.index_select(1, index), k.index_select(1, index), mask)
        if self.hook_probs(probs) is not probs:
            raise ValueError(f"a hook reading heads {list(heads)} of {self.hook_probs.name} returned a tensor: "
                             f"hooks that declare heads read them; edit probabilities with a hook on every head")


# One huge page: from this size up a probability buffer is mapped with MADV_HUGEPAGE and recycled. Below it, 4 KiB
# faults are few (a (32, 4, 64, 64) block's 2 MiB took 512 of them, ~3 ms per forward on this CPU; that is why
# the line is not higher) and torch's allocator serves the rest.
_HUGE_PAGE_BYTES = 2 << 20
_MADVISE = getattr(mmap, "MADV_HUGEPAGE", None)
# Freed buffers kept for reuse, oldest first, at most this many bytes in all (the CPU twin of CUDA's caching
# allocator, for these buffers only): `_release_buffers()` drops them.
_POOL_BYTES = 1 << 30
_pool: list[mmap.mmap] = []
_pool_lock = threading.RLock()  # re-entrant: a finalizer may run inside _take_region on the same thread


def _take_region(nbytes: int) -> mmap.mmap:
    with _pool_lock:
        for i, region in enumerate(_pool):
            if len(region) == nbytes:
                return _pool.pop(i)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(_MADVISE)
    except OSError:  # a kernel without transparent huge pages: plain pages, still recycled
        pass
    return region


def _give_back_region(region: mmap.mmap) -> None:
    with _pool_lock:
        _pool.append(region)
        while sum(len(r) for r in _pool) > _POOL_BYTES:
            _pool.pop(0)


def _release_buffers() -> None:
    """Return every pooled probability buffer to the operating system."""
    with _pool_lock:
        _pool.clear()


def _empty_probs(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor for attention probabilities, on `like`'s device and dtype.

    Large CPU buffers are anonymous mappings advised MADV_HUGEPAGE and recycled. Profiling put most of a
    capture's extra time in page faults: every fresh 128 MiB tensor took 60-300 ms of them before any
    arithmetic, since freed big tensors go back to the operating system. Huge pages fault 512x fewer times
    (a fresh 128 MiB write: 18 ms instead of 75, one thread), but on this project's VM a huge page the host has
    not backed yet costs more than small ones, so freed buffers are also kept (`_POOL_BYTES`) and reused by
    the next capture of the same size, which then faults not at all. A buffer returns to the pool when the last
    tensor viewing it dies (a finalizer on the memoryview that `torch.frombuffer` holds), so a trace a caller
    keeps is never reused under it. Elsewhere (CUDA, whose caching allocator has no faults; small sizes; no
    madvise; inside torch.compile, which cannot trace mmap): `torch.empty`.
    """
    nbytes = math.prod(shape) * like.element_size()
    if like.device.type != "cpu" or _MADVISE is None or nbytes < _HUGE_PAGE_BYTES or torch.compiler.is_compiling():
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    region = _take_region(nbytes)
    view = memoryview(region)
    weakref.finalize(view, _give_back_region, region)
    return torch.frombuffer(view, dtype=like.dtype).view(shape)


def _mask_in_place(scores: torch.Tensor, mask: torch.Tensor) -> None:
    """`scores.masked_fill_(~mask, finfo.min)`, writing only the key columns from the first one any row masks.

    finfo.min, not -inf: exp underflows to exactly 0 on masked keys, and a row with no visible key becomes uniform
    instead of NaN. A fill whose mask broadcasts over heads and queries costs more than the softmax after it (CPU,
    one thread, 32x4x512x512 fp32: 87 ms vs 52; H100, 32x8x512x512 bf16: 0.38 ms vs 0.11), though a padding mask hides
    a few trailing keys: so the fill starts at the first masked column when that is in the second half of the keys,
    and is skipped when no key is masked (one sentence, a batch of equal lengths). Bit-identical to the whole-tensor
    fill (tested). A causal mask masks from column 1 on and gains nothing; under torch.compile, which cannot trace
    the host read, the plain fill runs. So it does on an accelerator: the host read waits for the device once per
    layer, and the queue of launched kernels runs dry (H100, base size, B=1 L=512, 18 blocks: capture/plain
    x1.45 -> x3.21 with the window; `benchmarks/results/gpu_check.json`, 2026-11-27).
    """
    hidden = ~mask
    if torch.compiler.is_compiling() or scores.device.type != "cpu":
        scores.masked_fill_(hidden, torch.finfo(scores.dtype).min)
        return
    columns = hidden.reshape(-1, hidden.size(-1)).any(0).nonzero()
    if columns.numel() == 0:
        return
    first = int(columns[0])
    if first < hidden.size(-1) // 2:  # a wide window gains little, and a fill through a strided view can cost more
        first = 0
    scores[..., first:].masked_fill_(hidden[..., first:], torch.finfo(scores.dtype).min)


def _merge_causal(mask: torch.Tensor | None, q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    # masks.causal_mask is the one definition: the mask chart draws the same one the model applies
    causal = causal_mask(q_len, device, offset=k_len - q_len)  # (Lq, Lk)
    return causal if mask is None else mask & causal

"""Label-smoothed cross-entropy that ignores padding, summed so gradient accumulation stays exact.

Smoothing definition: PyTorch's (`F.cross_entropy(label_smoothing=eps)`, also fairseq's
`label_smoothed_cross_entropy` and the paper's reference tensor2tensor code): the target
distribution puts eps/V on every class *including* the gold one, plus 1 - eps on the gold class.
The Annotated Transformer instead spreads eps over V - 2 classes (excluding the gold token and
padding). We pick PyTorch's because it is what `F.cross_entropy(label_smoothing=)` computes (so the
result can be checked against it, and it needs no (N, V) one-hot tensor), what fairseq- and
Marian-trained checkpoints used, and it needs no special padding column; the
difference is eps/V vs eps/(V-2) per class, negligible for real vocabularies.

The sum is computed from one log-softmax (equal to F.cross_entropy's, tested) so the unsmoothed
nll for reporting comes free instead of costing a second pass over the (N, V) logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, *, smoothing: float = 0.1, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss_sum, nll_sum, n_tokens) over the non-ignored positions.

    `logits` is (..., V), `target` (...). Sums rather than means, so a trainer divides once by
    the token count of the whole (accumulated, all-reduced) batch. `nll_sum` is detached: it is
    the quantity to report (perplexity), `loss_sum` the one to optimise.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing ({smoothing}) must be in [0, 1)")
    if logits.shape[:-1] != target.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and target {tuple(target.shape)} disagree")
    flat_target = target.reshape(-1)
    # one log-softmax serves both sums (F.cross_entropy would need a second one for the nll);
    # the result equals F.cross_entropy(label_smoothing=smoothing, reduction="sum"), which the tests check
    lprobs = F.log_softmax(logits.reshape(-1, logits.size(-1)).float(), dim=-1)
    keep = flat_target != ignore_index
    gold = lprobs.gather(-1, flat_target.masked_fill(~keep, 0).unsqueeze(-1)).squeeze(-1)
    nll_all = -gold.masked_fill(~keep, 0.0)
    if smoothing:
        smooth_all = -lprobs.mean(dim=-1).masked_fill(~keep, 0.0)
        loss = ((1.0 - smoothing) * nll_all + smoothing * smooth_all).sum()
    else:
        loss = nll_all.sum()
    nll = nll_all.sum().detach()
    n_tokens = keep.sum()
    return loss, nll.detach(), n_tokens


def smoothed_distribution(target: torch.Tensor, vocab: int, smoothing: float, ignore_index: int) -> torch.Tensor:
    """The target distribution (N, V) the smoothed loss is a cross-entropy against.

    Each row: smoothing / vocab everywhere, plus 1 - smoothing on the gold class; rows whose
    target is `ignore_index` are all zero (they contribute nothing).
    """
    flat = target.reshape(-1)
    dist = torch.full((flat.numel(), vocab), smoothing / vocab, dtype=torch.float32, device=target.device)
    keep = flat != ignore_index
    rows = torch.arange(flat.numel(), device=target.device)[keep]
    dist[rows, flat[keep]] += 1.0 - smoothing
    dist[~keep] = 0.0
    return dist


def output_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    *,
    smoothing: float = 0.1,
    ignore_index: int,
    chunk: int = 512,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`label_smoothed_nll(F.linear(hidden, weight, bias), target)` without the (N, V) logits tensor.

    The training loss of the output layer, fused (Liger-Kernel's and Apple's cut-cross-entropy idea,
    in plain PyTorch for CPUs): padding rows are dropped first, then `chunk` rows at a time get their
    logits, log-sum-exp and *gradients* (softmax minus the smoothed target, times the weight and the
    hidden rows) while the chunk is still in cache; backward only scales the stored gradients. On the
    Multi30k config (3.6k target tokens, V = 8000, d = 128, 2 cores) the output layer and loss take
    163 ms instead of 336 ms for logits + `label_smoothed_nll` + autograd: the (N, V) tensors that
    the unfused path writes and reads about ten times are memory-bound, the three matmuls are not.

    Same sums and gradients as the unfused path (tested); `nll` is detached. Gradients are computed in
    the forward pass only when autograd needs them, so validation pays for the loss alone. Expects
    float32 (under bf16 autocast the trainer casts the decoder output first). `rows`, when the caller knows
    them (`corpus.data.Batch.tgt_rows`, found on the host), are the flat positions of `target` that are not
    `ignore_index`, ascending: finding them here makes the host wait for the device on an accelerator.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing ({smoothing}) must be in [0, 1)")
    if hidden.shape[:-1] != target.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and target {tuple(target.shape)} disagree")
    flat_target = target.reshape(-1)
    keep = flat_target != ignore_index
    if rows is None:
        rows = keep.nonzero().squeeze(1)  # on an accelerator the host waits here for the device
    h = hidden.reshape(-1, hidden.size(-1)).index_select(0, rows)
    t = flat_target.index_select(0, rows)
    grads = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad
                                         or (bias is not None and bias.requires_grad))
    loss, nll = _OutputLoss.apply(h, weight, bias, t, smoothing, chunk, grads)
    return loss, nll, keep.sum()


class _OutputLoss(torch.autograd.Function):
    """Chunked linear + label-smoothed cross-entropy whose gradients are computed in `forward`.

    Per chunk of rows h (c, D) with targets t and logits z = h Wᵀ + b: lse = m + log Σ exp(z - m);
    nll = lse - z_t; smoothed = (1-ε)·nll + ε·(lse - mean z). d loss/dz = p - ε/V - (1-ε)·onehot(t),
    p = exp(z - lse). The ε/V and one-hot terms are applied as rank-1 corrections and row gathers on
    the (c, D) / (V, D) side, and the softmax's 1/Σ scales rows of h and of p·W, so the only passes
    over the (c, V) block are the matmul, its max, mean and gold gather, one exp and one sum.
    """

    @staticmethod
    def forward(ctx, h, weight, bias, t, smoothing, chunk, grads):  # noqa: D102
        n, v = h.size(0), weight.size(0)
        eps = float(smoothing)
        loss = torch.zeros((), dtype=torch.float64, device=h.device)
        nll = torch.zeros((), dtype=torch.float64, device=h.device)
        if grads:
            grad_h = torch.empty_like(h)
            grad_w = torch.zeros_like(weight)
            grad_b = None if bias is None else torch.zeros_like(bias)
            w_sum = weight.sum(0)
        for s in range(0, n, chunk):
            hc, tc = h[s : s + chunk], t[s : s + chunk]
            z = hc @ weight.t() if bias is None else torch.addmm(bias, hc, weight.t())
            m = z.amax(-1, keepdim=True)
            z_gold = z.gather(1, tc.unsqueeze(1)).squeeze(1)
            z_mean = z.mean(-1)
            p = z.sub_(m).exp_()  # unnormalised softmax, in place of the logits
            total = p.sum(-1)
            lse = m.squeeze(1) + total.log()
            nll_c = (lse - z_gold).sum()
            loss += (1.0 - eps) * nll_c + eps * (lse - z_mean).sum()
            nll += nll_c
            if not grads:
                continue
            inv = total.reciprocal().unsqueeze(1)
            gh = torch.mm(p, weight).mul_(inv)
            if eps:
                gh.sub_(w_sum, alpha=eps / v)
            gh.sub_(weight.index_select(0, tc), alpha=1.0 - eps)
            grad_h[s : s + chunk] = gh
            grad_w.addmm_(p.t(), hc * inv)
            if eps:
                grad_w.sub_(hc.sum(0), alpha=eps / v)
            grad_w.index_add_(0, tc, hc, alpha=-(1.0 - eps))
            if grad_b is not None:
                grad_b.add_((p * inv).sum(0))
                grad_b.sub_(eps * hc.size(0) / v)
                grad_b.index_add_(0, tc, torch.full_like(z_gold, -(1.0 - eps)))
        ctx.has_bias = bias is not None
        if grads:
            ctx.save_for_backward(grad_h, grad_w, *(() if grad_b is None else (grad_b,)))
        loss, nll = loss.to(h.dtype), nll.to(h.dtype)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):  # noqa: D102
        saved = ctx.saved_tensors
        grad_h, grad_w = saved[0] * grad_loss, saved[1] * grad_loss
        grad_b = saved[2] * grad_loss if ctx.has_bias else None
        return grad_h, grad_w, grad_b, None, None, None, None


def teacher_forced_loss(
    model: torch.nn.Module,
    src: torch.Tensor,
    tgt_in: torch.Tensor,
    tgt_out: torch.Tensor,
    *,
    smoothing: float,
    amp: bool = False,
    call: torch.nn.Module | None = None,
    target_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss_sum, nll_sum, n_tokens) of a `Transformer` on one padded batch: what training and validation use.

    The decoder output goes through `output_loss` (the output layer fused with the loss) in float32,
    also under bf16 autocast (`amp`): only the encoder and decoder run in bf16. Rounding the logits to
    bf16 (8 bits of mantissa: steps of 0.06 at a logit of 10) before the log-softmax had kept the bf16
    Multi30k run's loss 0.1-0.14 nats above fp32's on the H100 (docs/gpu.md). `call` is the module to
    run (a torch.compile or DDP wrapper of `model`), `model` the one whose output layer and pad id are
    read. `target_rows`: the flat positions of `tgt_out` that are not padding (`Batch.tgt_rows`), when known.
    """
    call = model if call is None else call
    pad = model.cfg.pad_id
    if amp:
        with torch.autocast(src.device.type, dtype=torch.bfloat16):
            hidden = call(src, tgt_in, project=False)
        hidden = hidden.float()
    else:
        hidden = call(src, tgt_in, project=False)
    proj = model.output_proj
    return output_loss(hidden, proj.weight, proj.bias, tgt_out, smoothing=smoothing, ignore_index=pad,
                       rows=target_rows)

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

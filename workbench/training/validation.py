"""Held-out evaluation during training: teacher-forced loss, and greedy sacreBLEU/chrF on the text.

Plain functions of a model and data (the trainer calls them at each validation); scoring is
`evaluate.score`, the same as `workbench evaluate`, and batching is `core.batching.token_batches`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..checkpoint.tokenizer import Tokenizer
from ..core.batching import pad_sequences, token_batches
from ..core.model import Transformer
from ..corpus.data import ParallelData
from ..decoding.evaluate import score
from ..decoding.search import greedy
from .loss import teacher_forced_loss


@torch.no_grad()
def valid_loss(model: Transformer, data: ParallelData, *, max_tokens: int, smoothing: float,
               amp: bool = False) -> dict[str, float]:
    """valid_loss (label-smoothed), valid_nll and valid_ppl per target token, teacher forcing."""
    cfg, device = model.cfg, next(model.parameters()).device
    loss = nll = tokens = 0.0
    for idx in data.batches(max_tokens, shuffle=False):
        batch = data.collate(idx, cfg).to(device)
        l_, n_, t_ = teacher_forced_loss(model, batch.src, batch.tgt_in, batch.tgt_out, smoothing=smoothing, amp=amp,
                                         target_rows=batch.tgt_rows)
        loss, nll, tokens = loss + float(l_), nll + float(n_), tokens + float(t_)
    return {"valid_loss": loss / tokens, "valid_nll": nll / tokens, "valid_ppl": math.exp(min(nll / tokens, 50.0))}


@torch.no_grad()
def greedy_ids(model: Transformer, sources: list[list[int]], *, max_tokens: int = 4096,
               amp: bool = False) -> list[list[int]]:
    """Greedy outputs (ids, EOS included) for source ids without EOS, in token-budget batches."""
    cfg, device = model.cfg, next(model.parameters()).device
    rows = [[*s, cfg.eos_id] for s in sources]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    out: list[list[int]] = [[] for _ in sources]
    for chunk in token_batches([len(r) for r in rows], max_tokens, order):
        src = pad_sequences([rows[i] for i in chunk], cfg.pad_id, device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            gen = greedy(model, src, max_len_a=1.2, max_len_b=10)
        for i, hyp in zip(chunk, gen.best):
            out[i] = hyp.tokens
    return out


def bleu_chrf(model: Transformer, src_tok: Tokenizer, tgt_tok: Tokenizer, text: tuple[list[str], list[str]], *,
              limit: int = 0, amp: bool = False) -> dict[str, Any]:
    """Greedy translations of the first `limit` (0: all) source lines scored against the references."""
    src_text, ref_text = text
    if limit:
        src_text, ref_text = src_text[:limit], ref_text[:limit]
    ids = [src_tok.encode(s)[: model.cfg.max_positions - 1] for s in src_text]
    hyps = [tgt_tok.decode(h) for h in greedy_ids(model, ids, amp=amp)]
    scores = score(hyps, [ref_text])
    return {"valid_bleu": round(scores.bleu, 2), "valid_chrf": round(scores.chrf, 2),
            "bleu_signature": scores.bleu_signature, "chrf_signature": scores.chrf_signature,
            "valid_example": hyps[0] if hyps else ""}

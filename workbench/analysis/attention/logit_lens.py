"""Logit lens on the decoder residual stream (nostalgebraist 2020): project each layer's output through
the final norm and the output layer, to see when the next token becomes readable.

    lens = logit_lens(model, src, tgt_in, targets=tgt_out)
    lens.top_ids[l, b, t, 0]          # top token after layer l (layer 0 = the embeddings)
    lens.target_log_prob[l, b, t]     # log-probability of the reference next token after layer l

For pre-norm models the final norm (`dec_norm`) is applied to every layer's state, as the model does to
its last one; post-norm layers end in their own norm, so the states are projected as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.hooks import path_of


@dataclass(frozen=True)
class LogitLens:
    layers: tuple[str, ...]  # "embed", "dec.0", ... : what each row reads
    top_ids: torch.Tensor  # (L+1, B, T, k)
    top_log_probs: torch.Tensor  # (L+1, B, T, k)
    target_log_prob: torch.Tensor | None  # (L+1, B, T) when targets were given
    log_probs: torch.Tensor | None = None  # (L+1, B, T, V) with keep_full=True


@torch.no_grad()
def logit_lens(model, src: torch.Tensor, tgt: torch.Tensor, *, targets: torch.Tensor | None = None,
               top_k: int = 5, keep_full: bool = False) -> LogitLens:
    """Decoder states after the embeddings and after every layer, read through the output layer."""
    if targets is not None and targets.shape != tgt.shape:
        raise ValueError(f"targets {tuple(targets.shape)} must match the decoder input {tuple(tgt.shape)}")
    stream = model.stream("dec")
    points = [stream.hook_embed, *(layer.hook_resid_ffn for layer in stream.layers)]
    _, trace = model.run_with_cache(src, tgt, names=[p.name for p in points])
    states = torch.stack([trace[p.name] for p in points])  # (L+1, B, T, D)
    if model.dec_norm is not None:
        states = model.dec_norm(states)
    logp = model.output_proj(states).float().log_softmax(-1)  # (L+1, B, T, V)
    k = min(top_k, logp.size(-1))
    top_lp, top_ids = logp.topk(k, dim=-1)
    target_lp = None if targets is None else logp.gather(-1, targets.to(logp.device)[None, ..., None]
                                                         .expand(logp.size(0), -1, -1, 1))[..., 0]
    labels = ("embed", *(path_of(layer) for layer in stream.layers))
    return LogitLens(labels, top_ids.cpu(), top_lp.cpu(), None if target_lp is None else target_lp.cpu(),
                     logp.cpu() if keep_full else None)

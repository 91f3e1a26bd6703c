"""Any hook points along the hypothesis a greedy or beam search chose, captured during the search itself.

    hyp, trace = generation_trace(model, src, names=["*.hook_result", "dec.*.hook_resid_ffn"], beam=4)
    trace["dec.1.cross_attn.hook_result"]     # (1, H, T, D): position t = what step t computed
    trace.meta["rows"]                        # the beam row read at each step (the ancestry walked)

During decoding every listened hook point fires once per step with one new position per beam; the encoder's
(and the cross-attention keys/values) fire once. The chosen hypothesis's beam at each step comes from the
search's recorded ancestry (`replay_beam(...).path`), so the trace holds what the search actually computed for
that hypothesis. It equals the teacher-forced forward on the final output (tested), with decoder
self-attention scores/probabilities of keys after a step filled as the causal mask fills them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..core.trace import Trace
from ..decoding.search import Hypothesis, beam_search, greedy
from .beam_replay import replay_beam

_ONCE_TOP = ("hook_src_tok", "hook_src_pos", "hook_src_embed", "hook_memory")


def _once(name: str) -> bool:
    """Hook points that fire once per search (encoder side, cross-attention keys/values)."""
    return (name.startswith(("enc.", "enc_norm.", "src_emb_norm.")) or name in _ONCE_TOP
            or (".cross_attn.hook_k" in name or ".cross_attn.hook_v" in name))


def generation_trace(model, src, names: str | Iterable[str] = "*", *, beam: int = 1, **options
                     ) -> tuple[Hypothesis, Trace]:
    """Decode one sentence (`src` (S,) or (1, S), padding allowed) greedily (`beam=1`) or with beam search,
    capturing `names`; returns the best hypothesis and the trace along it (decoder input = start + its tokens
    without the final EOS). `options` go to the search (max_len_b=, alpha=, ...)."""
    src = torch.as_tensor(src, dtype=torch.long)
    src = src.view(1, -1) if src.dim() == 1 else src
    if src.dim() != 2 or src.size(0) != 1:
        raise ValueError(f"generation_trace takes one sentence, (S,) or (1, S); got shape {tuple(src.shape)}")
    if beam < 1:
        raise ValueError(f"beam must be at least 1, got {beam}")
    cfg = model.cfg
    src = src[:, : int((src[0] != cfg.pad_id).sum())].to(model.device)
    chosen = model.hook_names(names)
    with model.capture(chosen) as store:
        if beam == 1:
            gen = greedy(model, src, **options)
        else:
            gen = beam_search(model, src, beam=beam, record_steps=True, **options)
    hyp = gen.hypotheses[0][0]
    steps = len(hyp.tokens)  # decoder positions: start token + every generated token but the last
    rows = [0] * steps if beam == 1 else replay_beam(gen, 0).path
    if len(rows) != steps:
        raise RuntimeError(f"the recorded ancestry has {len(rows)} steps for a hypothesis of {steps} tokens")
    tensors: dict[str, torch.Tensor] = {}
    for name in chosen:
        calls = store.get(name, [])
        if not calls:
            continue  # e.g. a hook point the search never runs
        if _once(name):
            tensors[name] = calls[0][:1]
            continue
        if len(calls) < steps:
            raise RuntimeError(f"{name} fired {len(calls)} times for {steps} decoding steps")
        pieces = [calls[s][rows[s] if calls[s].size(0) > 1 else 0][None] for s in range(steps)]
        axis = 2 if pieces[0].dim() == 4 else 1
        if name.startswith("dec.") and ".self_attn.hook_" in name and name.endswith(("hook_scores", "hook_probs")):
            fill = 0.0 if name.endswith("hook_probs") else torch.finfo(pieces[0].dtype).min
            pieces = [torch.nn.functional.pad(p, (0, steps - p.size(-1)), value=fill) for p in pieces]
        tensors[name] = torch.cat(pieces, axis)
    tgt = torch.tensor([[cfg.start_id, *hyp.tokens[:-1]]], dtype=torch.long, device=model.device)
    return hyp, Trace(tensors, src=src, tgt=tgt, meta={"search": "greedy" if beam == 1 else f"beam {beam}",
                                                     "rows": list(rows)})

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

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ...core.batching import decoder_input
from ...core.config import DecodeConfig
from ...core.hooks import HookPoint
from ...core.trace import Trace
from ...decoding.search import Hypothesis, beam_search, decode_config, greedy
from .beam_replay import replay_beam


def source_side(model, name: str) -> bool:
    """Whether hook point `name` lies on the source side: the encoder stream, its sub-layers and norms, and the
    cross-attention keys/values (and their per-head inputs) read from the memory. Their position axis is the
    source's, and in a search they fire once (the decoder side fires once per step). From the model's own stream
    description, not the names."""
    return name in source_side_names(model)


def source_side_names(model) -> set[str]:
    """Every source-side hook point's name (see `source_side`)."""
    enc = model.stream("enc")
    modules = [m for m in (enc.emb_norm, enc.final_norm) if m is not None] + list(enc.layers)
    points = {enc.hook_tok, enc.hook_pos, enc.hook_embed, enc.hook_out}
    points |= {p for m in modules for p in m.modules() if isinstance(p, HookPoint)}
    points |= {p for layer in model.dec for p in (layer.cross_attn.hook_k, layer.cross_attn.hook_v,
                                                  layer.cross_attn.hook_k_input, layer.cross_attn.hook_v_input)}
    return {p.name for p in points}


def decoding_setup(model, config: DecodeConfig | None = None) -> tuple[Any, DecodeConfig | None]:
    """(Transformer, DecodeConfig) for an analysis that decodes: a `TranslationModel` brings its own decoding
    settings (its checkpoint's beam, length penalty, repetition guard), unless `config` is given; a bare model
    uses `config` (None: the search functions' defaults)."""
    if config is not None and not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a DecodeConfig, got {type(config).__name__}")
    if hasattr(model, "decode_config") and hasattr(model, "model"):  # a TranslationModel (duck-typed: no import up)
        return model.model, config if config is not None else model.decode_config
    return model, config


def generation_trace(model, src, names: str | Iterable[str] | DecodeConfig = "*", config: DecodeConfig | None = None,
                     *, beam: int | None = None, **options) -> tuple[Hypothesis, Trace]:
    """Decode one sentence (`src` (S,) or (1, S), padding allowed; text with a TranslationModel), capturing `names`;
    returns `(hypothesis, trace)`: the best hypothesis and the trace along it (decoder input = start + its tokens
    without the final EOS).

    `model` is a Transformer or a `TranslationModel`; the search follows `config` (a DecodeConfig, also accepted
    in place of `names`), else the TranslationModel's own settings, so the trace follows what `tm.translate`
    outputs; a bare model without a config decodes greedily with the defaults. `beam` and `options`
    (max_len_b=, alpha=, ...) override single fields. beam 1 is greedy search (equal to beam search's output)."""
    if isinstance(names, DecodeConfig):
        names, config = "*", names if config is None else config
    if isinstance(src, str):  # text: only a TranslationModel can encode it
        if not hasattr(model, "encode_source"):
            raise TypeError("a text source needs a TranslationModel (its tokenizer); pass ids to a bare model")
        ids, _ = model.encode_source(src, where="the source")
        if not ids:
            raise ValueError("the source is empty: nothing to decode")
        src = ids
    model, config = decoding_setup(model, config)
    cfg_search = decode_config(config or DecodeConfig(beam=1), options)
    if beam is not None and beam < 1:
        raise ValueError(f"beam must be at least 1, got {beam}")
    if beam is not None:
        cfg_search = dataclasses.replace(cfg_search, beam=beam, n_best=min(cfg_search.n_best, beam))
    beam = cfg_search.beam
    src = torch.as_tensor(src, dtype=torch.long)
    src = src.view(1, -1) if src.dim() == 1 else src
    if src.dim() != 2 or src.size(0) != 1:
        raise ValueError(f"generation_trace takes one sentence, (S,) or (1, S); got shape {tuple(src.shape)}")
    cfg = model.cfg
    src = src[:, : int((src[0] != cfg.pad_id).sum())].to(model.device)
    chosen = model.hook_names(names)
    with model.capture(chosen) as store:
        if beam == 1:
            gen = greedy(model, src, cfg_search)
        else:
            gen = beam_search(model, src, cfg_search, record_steps=True)
    hyp = gen.hypotheses[0][0]
    steps = len(hyp.tokens)  # decoder positions: start token + every generated token but the last
    rows = [0] * steps if beam == 1 else replay_beam(gen, 0).path
    if len(rows) != steps:
        raise RuntimeError(f"the recorded ancestry has {len(rows)} steps for a hypothesis of {steps} tokens")
    tensors = _along_path(model, chosen, store, rows)
    tgt = torch.tensor([decoder_input(hyp.tokens, cfg.start_id)], dtype=torch.long, device=model.device)
    return hyp, Trace(tensors, src=src, tgt=tgt, meta={"search": "greedy" if beam == 1 else f"beam {beam}",
                                                     "rows": list(rows)})


def _along_path(model, chosen: Sequence[str], store: dict, rows: Sequence[int]) -> dict[str, torch.Tensor]:
    """{hook: tensor} along the chosen hypothesis: source-side hooks once, decoder hooks one row per step (the beam
    row `rows[step]`), concatenated over positions; the decoder's self-attention padded to the last step's keys."""
    steps = len(rows)
    tensors: dict[str, torch.Tensor] = {}
    once = source_side_names(model)
    # decoder self-attention grows one key per step: its rows are padded to the last step's keys
    growing = {point.name for layer in model.dec for point in (layer.self_attn.hook_scores, layer.self_attn.hook_probs)}
    for name in chosen:
        calls = store.get(name, [])
        if not calls:
            continue  # e.g. a hook point the search never runs
        if name in once:
            tensors[name] = calls[0][:1]
            continue
        if len(calls) < steps:
            raise RuntimeError(f"{name} fired {len(calls)} times for {steps} decoding steps")
        pieces = [calls[s][rows[s] if calls[s].size(0) > 1 else 0][None] for s in range(steps)]
        axis = 2 if pieces[0].dim() == 4 else 1
        if name in growing:
            fill = 0.0 if name.endswith("hook_probs") else torch.finfo(pieces[0].dtype).min
            pieces = [torch.nn.functional.pad(p, (0, steps - p.size(-1)), value=fill) for p in pieces]
        tensors[name] = torch.cat(pieces, axis)
    return tensors

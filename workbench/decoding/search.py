"""Batched greedy and beam search over the model's KV cache, with optional whole-generation traces.

    gen = beam_search(model, src, beam=5, length_penalty="gnmt", alpha=0.6, n_best=3)
    gen = beam_search(model, src, DecodeConfig(beam=5, alpha=0.6), n_best=3)   # the same search
    gen.hypotheses[0][0].tokens        # best output of sentence 0 (ends with EOS)
    gen = greedy(model, src, trace=True)
    gen.traces[0]["dec.1.cross_attn.hook_probs"]   # (1, H, T, S): every step, every head

Design (fairseq's search, written with fixed-shape tensors so an accelerator needs no per-step
host sync):
- Each step ranks the 2K best continuations of a sentence's K live beams. EOS candidates among
  the top K are *finished* (scored with the length penalty) and merged into a pool of the K best
  finished hypotheses; the K best non-EOS candidates stay alive.
- A sentence is done once K hypotheses finished (fairseq's stopping rule: "early stopping when
  all beams end"), or when it reached its length limit (EOS is forced there, so every output
  ends with EOS and every hypothesis is scored the same way).
- Done sentences are dropped from the batch at check points (every step on CPU where a check is
  free; every few steps on CUDA, which is the only host sync of the loop).
- Beam size 1 is exactly greedy: the top candidate is either EOS (finished, sentence done) or the
  single survivor.

Traces: while tracing, every `*.hook_probs` is captured during generation itself (the explicit
attention path), and each sentence's final hypothesis is assembled by walking its beam ancestry
back through the per-step captures. A trace is therefore what the search actually computed,
and the tests check it equals a teacher-forced `run_with_cache` over the produced output.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

import torch

from ..core.batching import decoder_input, pad_sequences
from ..core.config import DecodeConfig, LengthPenaltyKind, config_keys
from ..core.hooks import decoding_step
from ..core.model import Encoded, Transformer
from ..core.trace import Trace

NEG_INF = float("-inf")


@dataclass
class Hypothesis:
    tokens: list[int]
    """Generated ids (no start token), ending with EOS."""
    score: float
    """Log-probability divided by the length penalty: what hypotheses are ranked by."""
    log_prob: float
    """Sum of token log-probabilities, EOS included."""

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass
class BeamStep:
    """One step of beam search, for replaying the search (all tensors on CPU, rows = live sentences).

    Candidate c of sentence row i extends live beam `cand_beam[i, c]` with `cand_token[i, c]` to
    total log-probability `cand_score[i, c]`; `cand_finished` marks EOS candidates that entered the
    finished pool; `survivors[i, j]` is the candidate that became live beam j of the next step.
    """

    step: int
    sentences: torch.Tensor  # (b,) indices into the input batch
    cand_beam: torch.Tensor  # (b, 2K)
    cand_token: torch.Tensor  # (b, 2K)
    cand_score: torch.Tensor  # (b, 2K)
    cand_finished: torch.Tensor  # (b, 2K) bool
    survivors: torch.Tensor  # (b, K) positions into the candidates
    alive_scores: torch.Tensor  # (b, K) log-probabilities of the next step's live beams


@dataclass
class Generation:
    hypotheses: list[list[Hypothesis]]
    """Per input sentence, the n best hypotheses, best first."""
    steps: list[BeamStep] | None = None
    """Per-step beam state when `record_steps=True`."""
    traces: list[Trace] | None = None
    """Per sentence, attention of its best hypothesis (source without padding) when `trace=True`."""
    meta: dict = field(default_factory=dict)

    @property
    def best(self) -> list[Hypothesis]:
        return [h[0] for h in self.hypotheses]

    def tokens(self, pad_id: int = 0) -> torch.Tensor:
        """Best outputs as one right-padded (B, T) tensor."""
        return pad_sequences([h.tokens for h in self.best], pad_id)


# ---------------------------------------------------------------------------- scoring and limits


def penalty_divisor(lengths: torch.Tensor | int, kind: LengthPenaltyKind = "average", alpha: float = 1.0):
    """Divisor of the summed log-probability (lengths count the EOS).

    average: len^alpha (fairseq `--lenpen`, Hugging Face `length_penalty`; alpha=1 is the plain mean);
    gnmt: ((5 + len) / 6)^alpha (Wu et al. 2016, eq. 14; Marian `--normalize`, OpenNMT, CTranslate2).
    """
    if kind == "none" or alpha == 0:
        return lengths * 0 + 1.0 if isinstance(lengths, torch.Tensor) else 1.0
    if kind == "average":
        return lengths**alpha
    if kind == "gnmt":
        return ((5.0 + lengths) / 6.0) ** alpha
    raise ValueError(f"length_penalty must be 'gnmt', 'average' or 'none', got {kind!r}")


def normalized_score(log_prob: float, length: int, kind: LengthPenaltyKind = "average", alpha: float = 1.0) -> float:
    return float(log_prob / penalty_divisor(float(length), kind, alpha))


def length_limits(model: Transformer, src: torch.Tensor, cfg: DecodeConfig | None = None, **options) -> torch.Tensor:
    """(B,) most tokens each sentence may generate before its EOS: min(a·|src| + b, max_len, positions - 1).

    `options` (max_len_a=, max_len_b=, max_len=) override `cfg`'s fields.
    """
    cfg = decode_config(cfg, options)
    src_len = (src != model.cfg.pad_id).sum(1)
    limit = (cfg.max_len_a * src_len.double()).floor().long() + cfg.max_len_b
    cap = model.cfg.max_positions - 1  # the decoder reads start + limit tokens
    if cfg.max_len is not None:
        cap = min(cap, cfg.max_len)
    return limit.clamp(max=cap)


def decode_config(cfg: DecodeConfig | None = None, options: dict | None = None) -> DecodeConfig:
    """`cfg` (default DecodeConfig()) with keyword `options` applied: how every search reads its settings."""
    cfg = cfg or DecodeConfig()
    if not options:
        return cfg
    unknown = sorted(set(options) - config_keys(DecodeConfig))
    if unknown:
        valid = sorted(f.name for f in dataclasses.fields(DecodeConfig))
        raise TypeError(f"unknown decoding options {unknown}; valid: {valid}")
    return dataclasses.replace(cfg, **options)


def _constrain(
    logp: torch.Tensor, generated: torch.Tensor, step: int, limits: torch.Tensor, cfg: DecodeConfig, *, eos: int,
    pad: int, first_limit: int = 0,
) -> torch.Tensor:
    """Apply cfg's bans (min_len, no_repeat_ngram, length limits) to (N, V) log-probabilities of rows
    that generated `generated` (N, step) so far."""
    min_len, no_repeat_ngram = cfg.min_len, cfg.no_repeat_ngram
    eos_logp = logp[:, eos].clone()  # what a forced EOS costs, even where min_len bans it
    logp[:, pad] = NEG_INF
    if step < min_len:
        logp[:, eos] = NEG_INF
    if no_repeat_ngram and step >= no_repeat_ngram:  # at least one whole n-gram exists
        n = no_repeat_ngram
        if n == 1:
            banned = generated
        else:
            grams = generated.unfold(1, n, 1)  # (N, M, n)
            prefix = generated[:, step - n + 1 :]  # (N, n-1): the n-gram being completed
            hit = (grams[:, :, :-1] == prefix[:, None, :]).all(-1)  # (N, M)
            banned = torch.where(hit, grams[:, :, -1], torch.full_like(grams[:, :, -1], pad))
        if banned.numel():
            logp.scatter_(1, banned, NEG_INF)
    if step < first_limit:
        return logp  # no row is at its length limit yet (a host-side test: no sync)
    # at the limit only EOS remains; EOS wins over min_len there
    forced = (step >= limits)[:, None]
    eos_only = torch.full_like(logp, NEG_INF)
    eos_only[:, eos] = eos_logp
    return torch.where(forced, eos_only, logp)


def _check_every(device: torch.device, check_every: int | None) -> int:
    if check_every is not None:
        if check_every < 1:
            raise ValueError(f"check_every ({check_every}) must be at least 1")
        return check_every
    return 1 if device.type == "cpu" else 4


# ---------------------------------------------------------------------------- trace assembly


class _Recorder:
    """Per-step attention captures plus the row map between steps, to walk a hypothesis back."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.parents: list[torch.Tensor | None] = []  # parents[s][row at s+1] = row at s (None = same)

    def __enter__(self) -> _Recorder:
        self._ctx = self.model.capture("*.hook_probs")
        self.store = self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._ctx.__exit__(*exc)

    def link(self, parent: torch.Tensor | None) -> None:
        self.parents.append(parent)

    def assemble(self, src: torch.Tensor, sentence: int, tokens: list[int], last_step: int, last_row: int) -> Trace:
        cfg = self.model.cfg
        src_len = int((src[sentence] != cfg.pad_id).sum())
        rows = [last_row]
        for s in range(last_step - 1, -1, -1):
            parent = self.parents[s]
            rows.append(rows[-1] if parent is None else int(parent[rows[-1]]))
        rows.reverse()  # rows[s]: the batch row that fed decoder position s
        steps = last_step + 1
        tensors: dict[str, torch.Tensor] = {}
        for name, calls in self.store.items():
            if name.startswith("enc."):
                tensors[name] = calls[0][sentence : sentence + 1, :, :src_len, :src_len].cpu()
            elif ".self_attn." in name:
                probs = calls[0].new_zeros(1, calls[0].size(1), steps, steps)
                for s in range(steps):
                    probs[0, :, s, : s + 1] = calls[s][rows[s], :, 0, : s + 1]
                tensors[name] = probs.cpu()
            else:  # cross-attention
                tensors[name] = torch.stack([calls[s][rows[s], :, 0, :src_len] for s in range(steps)], 1)[None].cpu()
        tgt = torch.tensor([decoder_input(tokens, cfg.start_id)], dtype=torch.long)
        return Trace(tensors, src=src[sentence : sentence + 1, :src_len].cpu(), tgt=tgt)


# ---------------------------------------------------------------------------- greedy


@torch.no_grad()  # not inference_mode: traces and ids must be usable with autograd later
def greedy(
    model: Transformer,
    src: torch.Tensor,
    config: DecodeConfig | None = None,
    *,
    trace: bool = False,
    check_every: int | None = None,
    encoded: Encoded | None = None,
    **options,
) -> Generation:
    """Arg-max decoding of a (B, S) source batch; scores are normalised as beam search's are.

    Settings come from `config` (a DecodeConfig; its beam and n_best are ignored) with keyword
    `options` (max_len_b=, min_len=, alpha=, ...) overriding its fields. `encoded`: the encoder's output
    for `src`, computed before (`model.encode(src)`), so runs that edit only the decoder reuse it.

    One step: the decoding loop. Its state (sentences, tokens, scores, end steps, limits, encoder output, cache,
    recorder) shrinks together when sentences finish; split into functions, each would pass all eight back and
    forth, and the loop is the one place a reader checks that they stay aligned.
    """
    cfg = decode_config(config, options)
    _check_model(model, src)
    eos, pad = model.cfg.eos_id, model.cfg.pad_id
    batch = src.size(0)
    every = _check_every(src.device, check_every)
    limits = length_limits(model, src, cfg)
    horizon, first_limit = int(limits.max()), int(limits.min())  # one host sync before the loop
    results: list[list[Hypothesis] | None] = [None] * batch
    finals: dict[int, tuple[int, int]] = {}  # sentence -> (last step, row) for traces

    recorder = _Recorder(model) if trace else None
    with recorder if recorder is not None else contextlib.nullcontext():
        encoded = model.encode(src) if encoded is None else _check_encoded(encoded, src)
        cache = model.start_cache(encoded)
        sent = torch.arange(batch, device=src.device)
        tokens = torch.full((batch, 1), model.cfg.start_id, dtype=torch.long, device=src.device)
        scores = torch.zeros(batch, device=src.device)
        ended_at = torch.full((batch,), -1, dtype=torch.long, device=src.device)
        for step in range(horizon + 1):
            with decoding_step(step, sent, torch.zeros_like(sent)):
                logits, cache = model.decode(tokens[:, -1:], encoded, cache)
            logp = logits[:, -1].log_softmax(-1, dtype=torch.float32)  # one pass, no float copy of bf16 logits
            logp = _constrain(logp, tokens[:, 1:], step, limits, cfg, eos=eos, pad=pad, first_limit=first_limit)
            best, tok = logp.topk(1, dim=-1)  # topk, as beam search ranks, so ties break the same way
            running = ended_at < 0
            tok = torch.where(running[:, None], tok, torch.full_like(tok, pad))
            scores = scores + torch.where(running, best[:, 0], torch.zeros_like(scores))
            ended_at = torch.where(running & (tok[:, 0] == eos), torch.full_like(ended_at, step), ended_at)
            tokens = torch.cat([tokens, tok], dim=1)
            last = step == horizon
            if not last and (step + 1) % every:
                if recorder is not None:
                    recorder.link(None)
                continue
            done = ended_at >= 0
            if bool(done.all()) or last:
                _collect_greedy(results, finals, sent, tokens, scores, ended_at, done, cfg)
                break
            if bool(done.any()):
                _collect_greedy(results, finals, sent, tokens, scores, ended_at, done, cfg)
                keep = (~done).nonzero()[:, 0]
                sent, tokens, scores, ended_at = sent[keep], tokens[keep], scores[keep], ended_at[keep]
                limits = limits[keep]
                encoded = encoded.index_select(keep)
                cache = cache.index_select(keep)
                if recorder is not None:
                    recorder.link(keep)
            elif recorder is not None:
                recorder.link(None)
        traces = None
        if recorder is not None:
            traces = [recorder.assemble(src, i, results[i][0].tokens, *finals[i]) for i in range(batch)]
    return Generation(_complete(results), traces=traces, meta={"search": "greedy"})


def _collect_greedy(results, finals, sent, tokens, scores, ended_at, done, cfg: DecodeConfig) -> None:
    idx = done.nonzero()[:, 0].tolist()
    if not idx:
        return
    rows_tokens = tokens[:, 1:].cpu()
    ends = ended_at.cpu()
    raw = scores.cpu()
    for r in idx:
        n = int(ends[r]) + 1
        toks = rows_tokens[r, :n].tolist()
        # float32 division, exactly as beam search normalises (beam 1 == greedy, scores included)
        score = float(raw[r] / length_penalty_value(n, cfg.length_penalty, cfg.alpha))
        results[int(sent[r])] = [Hypothesis(toks, score, float(raw[r]))]
        finals[int(sent[r])] = (n - 1, r)


def _complete(results: list) -> list[list[Hypothesis]]:
    missing = [i for i, r in enumerate(results) if r is None]
    if missing:  # the length limit forces EOS, so this is a bug, not bad input
        raise RuntimeError(f"decoding ended without a hypothesis for sentences {missing[:10]}")
    return results


def _check_encoded(encoded: Encoded, src: torch.Tensor) -> Encoded:
    """`encoded` when it can be the encoder's output for `src` (batch and length agree), else a ValueError."""
    if tuple(encoded.memory.shape[:2]) != tuple(src.shape):
        raise ValueError(f"encoded memory {tuple(encoded.memory.shape)} does not belong to a source batch of shape "
                         f"{tuple(src.shape)}")
    return encoded


def _check_model(model: Transformer, src: torch.Tensor) -> None:
    if model.training:
        raise ValueError("the model is in training mode (dropout would randomise the search); call model.eval()")
    if src.dim() != 2 or src.size(0) == 0 or src.size(1) == 0:
        raise ValueError(f"src must be a non-empty (batch, length) id tensor, got shape {tuple(src.shape)}")


# ---------------------------------------------------------------------------- beam search


@dataclass
class _Beams:
    """The search state of the sentences still searching: b rows of K beams each (rows = sentences).

    Live beams: `alive` (b·K, t) ids so far, start token first, and their log-probabilities. The
    finished pool: the K best EOS-terminated hypotheses per sentence, normalised score first.
    """

    sent: torch.Tensor  # (b,) input-batch index of each row
    limits: torch.Tensor  # (b,) length limit per sentence
    limits_rows: torch.Tensor  # (b·K,) the same, per beam
    alive: torch.Tensor  # (b·K, t)
    alive_score: torch.Tensor  # (b, K) summed log-probabilities
    fin_score: torch.Tensor  # (b, K) normalised scores, -inf where empty
    fin_raw: torch.Tensor  # (b, K) summed log-probabilities
    fin_tok: torch.Tensor  # (b, K, width) ids, EOS-terminated, pad after
    fin_len: torch.Tensor  # (b, K)
    fin_row: torch.Tensor  # (b, K) the beam row that fed each hypothesis's last step (for traces)
    done: torch.Tensor  # (b,) bool

    @classmethod
    def start(cls, limits: torch.Tensor, K: int, width: int, *, start_id: int, pad: int) -> _Beams:
        batch, dev = limits.size(0), limits.device
        alive_score = torch.full((batch, K), NEG_INF, device=dev)
        alive_score[:, 0] = 0.0  # the first step expands one beam only
        return cls(
            sent=torch.arange(batch, device=dev), limits=limits, limits_rows=limits.repeat_interleave(K),
            alive=torch.full((batch * K, 1), start_id, dtype=torch.long, device=dev), alive_score=alive_score,
            fin_score=torch.full((batch, K), NEG_INF, device=dev), fin_raw=torch.full((batch, K), NEG_INF, device=dev),
            fin_tok=torch.full((batch, K, width), pad, dtype=torch.long, device=dev),
            fin_len=torch.zeros((batch, K), dtype=torch.long, device=dev),
            fin_row=torch.zeros((batch, K), dtype=torch.long, device=dev),
            done=torch.zeros(batch, dtype=torch.bool, device=dev),
        )

    def keep(self, keep: torch.Tensor, rows: torch.Tensor) -> None:
        """Drop finished sentences: `keep` indexes sentence rows, `rows` their beam rows."""
        self.sent, self.done, self.limits = self.sent[keep], self.done[keep], self.limits[keep]
        self.alive_score, self.fin_score = self.alive_score[keep], self.fin_score[keep]
        self.fin_raw = self.fin_raw[keep]
        self.fin_tok, self.fin_len = self.fin_tok[keep], self.fin_len[keep]
        # rows of finished hypotheses refer to this step's rows; they stay valid for traces
        self.fin_row = self.fin_row[keep]
        self.alive, self.limits_rows = self.alive[rows], self.limits_rows[rows]


@dataclass
class _Candidates:
    """The 2K best continuations of each sentence's live beams at one step."""

    score: torch.Tensor  # (b, 2K) total log-probabilities
    beam: torch.Tensor  # (b, 2K) which live beam each extends
    token: torch.Tensor  # (b, 2K)
    is_eos: torch.Tensor  # (b, 2K)
    base: torch.Tensor  # (b, 1) first beam row of each sentence


def _candidates(beams: _Beams, logp: torch.Tensor, K: int, eos: int) -> _Candidates:
    """The 2K best continuations of each sentence, in two rounds: each beam's own 2K best tokens, then the 2K
    best of a sentence's K·2K. The same set as one top-2K over all K·V (a continuation among its sentence's 2K
    best has fewer than 2K better ones in its own beam too), without adding the beam's score to all V entries
    or ranking K·V of them; only exact ties may come out in another order."""
    b, vocab = beams.sent.size(0), logp.size(-1)
    width = min(2 * K, vocab)
    row_score, row_token = logp.topk(width, dim=-1)  # (b·K, 2K) each beam's best, by log-probability
    cand = (row_score + beams.alive_score.view(-1, 1)).view(b, K * width)
    top_score, top_idx = cand.topk(min(2 * K, K * width), dim=-1)  # (b, 2K)
    beam = top_idx // width
    token = row_token.view(b, K * width).gather(1, top_idx)
    base = (torch.arange(b, device=logp.device) * K)[:, None]
    return _Candidates(top_score, beam, token, token == eos, base)


def _merge_finished(beams: _Beams, cands: _Candidates, step: int, K: int, cfg: DecodeConfig, eos: int, pad: int
                    ) -> torch.Tensor:
    """Move EOS among the top K candidates into the finished pool; returns which did, (b, K)."""
    b, width = beams.sent.size(0), beams.fin_tok.size(2)
    new_fin = cands.is_eos[:, :K] & ~beams.done[:, None]
    # on CPU a host check is free and skips the pool update on most steps; on an accelerator the
    # update always runs, so the loop needs no sync here
    if beams.alive.device.type == "cpu" and not bool(new_fin.any()):
        return new_fin
    new_raw = cands.score[:, :K]
    new_norm = new_raw / length_penalty_value(step + 1, cfg.length_penalty, cfg.alpha)
    new_norm = new_norm.masked_fill(~new_fin, NEG_INF)
    new_rows = cands.base + cands.beam[:, :K]  # (b, K)
    new_tok = torch.full((b, K, width), pad, dtype=torch.long, device=new_rows.device)
    new_tok[:, :, :step] = beams.alive[:, 1:].index_select(0, new_rows.view(-1)).view(b, K, step)
    new_tok[:, :, step] = eos
    pool = torch.cat([beams.fin_score, new_norm], 1)
    beams.fin_score, pick = pool.topk(K, dim=-1)
    beams.fin_raw = torch.cat([beams.fin_raw, new_raw], 1).gather(1, pick)
    beams.fin_len = torch.cat([beams.fin_len, torch.full_like(beams.fin_len, step + 1)], 1).gather(1, pick)
    beams.fin_row = torch.cat([beams.fin_row, new_rows], 1).gather(1, pick)
    beams.fin_tok = torch.cat([beams.fin_tok, new_tok], 1).gather(1, pick[:, :, None].expand(b, K, width))
    return new_fin


def _advance(beams: _Beams, cands: _Candidates, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Live beams become the K best non-EOS candidates; returns (parent row per new beam, survivors)."""
    survivors_score, survivors = cands.score.masked_fill(cands.is_eos, NEG_INF).topk(K, dim=-1)
    beams.alive_score = survivors_score
    parent = (cands.base + cands.beam.gather(1, survivors)).view(-1)
    beams.alive = torch.cat([beams.alive.index_select(0, parent), cands.token.gather(1, survivors).view(-1, 1)], 1)
    return parent, survivors


@torch.no_grad()  # not inference_mode: traces and ids must be usable with autograd later
def beam_search(
    model: Transformer,
    src: torch.Tensor,
    config: DecodeConfig | None = None,
    *,
    record_steps: bool = False,
    trace: bool = False,
    check_every: int | None = None,
    encoded: Encoded | None = None,
    **options,
) -> Generation:
    """Beam search over a (B, S) source batch; see the module docstring for the search rules.

    Settings come from `config` (a DecodeConfig) with keyword `options` (beam=, n_best=, alpha=, ...)
    overriding its fields. `encoded`: the encoder's output for `src` when already computed (as `greedy`).

    One step: the decoding loop; each stage of a step is already its own function (`_candidates`, `_merge_finished`,
    `_advance`, `_collect_beam`), and what remains is the state they share (beams, encoder output, cache, hook rows,
    recorder), shrunk together when sentences finish, which a reader checks in one place.
    """
    cfg = decode_config(config, options)
    _check_model(model, src)
    eos, pad = model.cfg.eos_id, model.cfg.pad_id
    dev = src.device
    batch, K = src.size(0), cfg.beam
    every = _check_every(dev, check_every)
    limits = length_limits(model, src, cfg)
    horizon, first_limit = int(limits.max()), int(limits.min())
    results: list[list[Hypothesis] | None] = [None] * batch
    finals: dict[int, tuple[int, int]] = {}
    steps: list[BeamStep] | None = [] if record_steps else None

    recorder = _Recorder(model) if trace else None
    with recorder if recorder is not None else contextlib.nullcontext():
        encoded = model.encode(src) if encoded is None else _check_encoded(encoded, src)
        # cross-attention K/V (and the source mask) stay one row per sentence, read by its K beams' rows
        cache = model.start_cache(encoded).for_beams(K, horizon + 1)
        beams = _Beams.start(limits, K, horizon + 1, start_id=model.cfg.start_id, pad=pad)  # width: tokens + EOS

        # what hooks see as `hook.decoding`, per beam row; rebuilt only when finished sentences leave the batch
        row_sent, row_beam = beams.sent.repeat_interleave(K), torch.arange(K, device=dev).repeat(batch)
        for step in range(horizon + 1):
            with decoding_step(step, row_sent, row_beam):
                logits, cache = model.decode(beams.alive[:, -1:], encoded, cache)
            logp = logits[:, -1].log_softmax(-1, dtype=torch.float32)  # one pass, no float copy of bf16 logits
            logp = _constrain(logp, beams.alive[:, 1:], step, beams.limits_rows, cfg, eos=eos, pad=pad,
                              first_limit=first_limit)
            cands = _candidates(beams, logp, K, eos)
            new_fin = _merge_finished(beams, cands, step, K, cfg, eos, pad)
            beams.done = beams.done | (beams.fin_score > NEG_INF).all(1) | (step >= beams.limits)
            parent, survivors = _advance(beams, cands, K)
            if steps is not None:
                steps.append(_record_step(step, beams, cands, new_fin, survivors))

            last = step == horizon
            check = last or (step + 1) % every == 0
            all_done = check and (last or bool(beams.done.all()))
            if check and (all_done or bool(beams.done.any())):
                _collect_beam(results, finals, beams, cfg.n_best)
            if all_done:
                break
            if check and bool(beams.done.any()):
                keep = (~beams.done).nonzero()[:, 0]
                rows = (keep[:, None] * K + torch.arange(K, device=dev)).view(-1)
                beams.keep(keep, rows)
                parent = parent[rows]
                encoded = encoded.index_select(keep)
                cache = cache.keep_sentences(keep)
                row_sent, row_beam = beams.sent.repeat_interleave(K), row_beam[: rows.numel()]
            # the self-attention K/V follow their beams (owed: the next step's append gathers them as it writes);
            # cross K/V are the same within a sentence
            cache = cache.reorder(parent)
            if recorder is not None:
                recorder.link(parent)

        traces = None
        if recorder is not None:
            traces = [recorder.assemble(src, i, results[i][0].tokens, *finals[i]) for i in range(batch)]
    return Generation(_complete(results), steps=steps, traces=traces,
                      meta={"search": "beam", "beam": K, "length_penalty": cfg.length_penalty, "alpha": cfg.alpha})


def _record_step(step: int, beams: _Beams, cands: _Candidates, new_fin: torch.Tensor, survivors: torch.Tensor
                 ) -> BeamStep:
    finished = torch.cat([new_fin, torch.zeros_like(new_fin)], 1)[:, : cands.score.size(1)]
    return BeamStep(step, beams.sent.cpu(), cands.beam.cpu(), cands.token.cpu(), cands.score.cpu(), finished.cpu(),
                    survivors.cpu(), beams.alive_score.cpu())


def length_penalty_value(length: int, kind: LengthPenaltyKind, alpha: float) -> float:
    return float(penalty_divisor(float(length), kind, alpha))


def _collect_beam(results, finals, beams: _Beams, n_best: int) -> None:
    idx = beams.done.nonzero()[:, 0].tolist()
    scores, raws, toks, lens = beams.fin_score.cpu(), beams.fin_raw.cpu(), beams.fin_tok.cpu(), beams.fin_len.cpu()
    for r in idx:
        s = int(beams.sent[r])
        if results[s] is not None:
            continue
        hyps = []
        for j in range(n_best):
            if scores[r, j] == NEG_INF:
                break
            n = int(lens[r, j])
            hyps.append(Hypothesis(toks[r, j, :n].tolist(), float(scores[r, j]), float(raws[r, j])))
        results[s] = hyps
        finals[s] = (int(lens[r, 0]) - 1, int(beams.fin_row[r, 0]))


# ---------------------------------------------------------------------------- one entry point


def generate(model: Transformer, src: torch.Tensor, cfg: DecodeConfig | None = None, **options) -> Generation:
    """Greedy when cfg.beam == 1, else beam search; `options` (trace, record_steps, check_every) pass through."""
    cfg = cfg or DecodeConfig()
    if cfg.beam == 1 and not options.get("record_steps"):
        options.pop("record_steps", None)
        return greedy(model, src, cfg, **options)
    return beam_search(model, src, cfg, **options)

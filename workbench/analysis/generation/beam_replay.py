"""Beam-search replay: rebuild, step by step, what the search saw and chose, from the per-step state
that `beam_search(..., record_steps=True)` records.

    gen = beam_search(model, src, beam=4, record_steps=True)
    replay = replay_beam(gen, sentence=0)
    replay.steps[3].candidates        # every candidate of step 3: parent beam, token, score, fate
    replay.final                      # == gen.hypotheses[0][0] (tested)
    add_cross_attention(replay, model, src[0])   # each live beam's cross-attention at each step

The cross-attention of a beam at step s is recomputed by teacher-forcing its prefix (the decoding tests
check that incremental decoding equals the full recompute), so the search itself needs no capture.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...core.batching import decoder_input
from ...core.heads import hook_name
from ...decoding.search import Generation, length_penalty_value


@dataclass
class Candidate:
    beam: int  # the live beam it extends
    token: int
    log_prob: float  # total log-probability of prefix + token
    finished: bool  # an EOS that entered the finished pool
    score: float | None  # length-normalised score when finished
    survivor: int | None  # index of the live beam it became at the next step, if any


@dataclass
class ReplayStep:
    step: int
    live: list[list[int]]  # prefixes of the live beams read by this step (no start token)
    live_log_probs: list[float]
    candidates: list[Candidate]
    cross_attention: torch.Tensor | None = None  # (K live, L, H, S) after add_cross_attention

    @property
    def chosen(self) -> list[Candidate]:
        """Candidates that stay alive, in live-beam order."""
        return sorted((c for c in self.candidates if c.survivor is not None), key=lambda c: c.survivor)


@dataclass
class BeamReplay:
    sentence: int
    steps: list[ReplayStep]
    final: tuple[list[int], float, float]  # tokens (with EOS), normalised score, log-probability
    final_step: int
    path: list[int] = field(default_factory=list)  # path[s]: the live beam at step s on the final hypothesis


def replay_beam(generation: Generation, sentence: int = 0) -> BeamReplay:
    """Rebuild one sentence's search; its best finished hypothesis equals the decoder's output."""
    if generation.steps is None:
        raise ValueError("this generation has no per-step state: decode with beam_search(..., record_steps=True)")
    meta = generation.meta
    kind, alpha = meta.get("length_penalty", "average"), meta.get("alpha", 1.0)
    n_sent = len(generation.hypotheses)
    if not 0 <= sentence < n_sent:
        raise IndexError(f"sentence {sentence} out of range: the generation has {n_sent}")
    live: list[list[int]] | None = None
    live_lp: list[float] = []
    parents: list[list[int]] = []  # parents[s][j]: the live beam at step s that live beam j of step s+1 came from
    steps: list[ReplayStep] = []
    best: tuple[float, int, int, list[int], float] | None = None  # score, step, beam, tokens, log-prob
    for st in generation.steps:
        rows = (st.sentences == sentence).nonzero()
        if len(rows) == 0:
            break  # the sentence was done and dropped from the batch
        r = int(rows[0, 0])
        k = st.survivors.size(1)
        if live is None:
            live, live_lp = [[] for _ in range(k)], [0.0] + [float("-inf")] * (k - 1)
        penalty = length_penalty_value(st.step + 1, kind, alpha)
        survivor_of = {int(c): j for j, c in enumerate(st.survivors[r].tolist())}
        cands = []
        for c in range(st.cand_token.size(1)):
            beam, tok = int(st.cand_beam[r, c]), int(st.cand_token[r, c])
            lp = float(st.cand_score[r, c])
            fin = bool(st.cand_finished[r, c])
            score = float(st.cand_score[r, c] / penalty) if fin else None  # float32, as the search divides
            cands.append(Candidate(beam, tok, lp, fin, score, survivor_of.get(c)))
            if fin and (best is None or score > best[0]):
                best = (score, st.step, beam, [*live[beam], tok], lp)
        steps.append(ReplayStep(st.step, [list(p) for p in live], list(live_lp), cands))
        new = [cands[int(c)] for c in st.survivors[r].tolist()]
        parents.append([c.beam for c in new])
        live = [[*live[c.beam], c.token] for c in new]
        live_lp = [float(x) for x in st.alive_scores[r].tolist()]
    if best is None:
        raise RuntimeError(f"sentence {sentence}: no finished hypothesis in the recorded steps")
    score, last, beam, tokens, lp = best
    path = [beam]
    for s in range(last - 1, -1, -1):
        path.append(parents[s][path[-1]])
    path.reverse()
    return BeamReplay(sentence, steps, (tokens, score, lp), last, path)


@torch.no_grad()
def add_cross_attention(replay: BeamReplay, model, src: torch.Tensor) -> BeamReplay:
    """Fill each step's `cross_attention` (K live beams, L, H, S): teacher-forced prefixes, one forward a step.
    `src` is this sentence's source ids (1-D or (1, S)), padding allowed."""
    src = src.view(1, -1) if src.dim() == 1 else src
    src = src[:, : int((src[0] != model.cfg.pad_id).sum())].to(model.device)
    names = model.hook_names(hook_name("cross", "*"))
    for st in replay.steps:
        prefixes = torch.tensor([decoder_input(p, model.cfg.start_id, prefix=True) for p in st.live],
                                dtype=torch.long, device=model.device)
        _, trace = model.run_with_cache(src.expand(len(st.live), -1), prefixes, names=names)
        cross = trace.stack(hook_name("cross", "*"))[:, :, :, -1]  # (L, K, H, S): the step's query
        st.cross_attention = cross.permute(1, 0, 2, 3).float().cpu()
    return replay

"""Beam replay: its final hypothesis and score are the decoder's; its attention is the search's."""

from __future__ import annotations

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.analysis.generation.beam_replay import add_cross_attention, replay_beam
from workbench.decoding.search import beam_search


@pytest.mark.parametrize("check_every,penalty", [(1, "average"), (3, "gnmt")])
def test_replay_final_equals_decoder_output(check_every, penalty):
    cfg = presets.tiny(vocab=20)
    model = make_model(cfg, seed=2)
    src, _ = make_batch(cfg, batch=3, src_len=6)
    gen = beam_search(model, src, beam=3, max_len_b=7, record_steps=True, length_penalty=penalty, alpha=0.6,
                      check_every=check_every)
    for i in range(3):
        replay = replay_beam(gen, i)
        tokens, score, log_prob = replay.final
        best = gen.hypotheses[i][0]
        assert tokens == best.tokens
        assert score == pytest.approx(best.score, abs=1e-6) and log_prob == pytest.approx(best.log_prob, abs=1e-5)
        assert replay.final_step == len(tokens) - 1
        # survivors extend live prefixes, and the path walks back to the final hypothesis
        for s, beam in enumerate(replay.path):
            assert replay.steps[s].live[beam] == tokens[:s]
        assert [len(c.candidates) for c in replay.steps] == [6] * len(replay.steps)


def test_replay_cross_attention_equals_the_search_trace():
    cfg = presets.tiny(vocab=20)
    model = make_model(cfg, seed=2)
    src = torch.tensor([[5, 6, 7, 8, 2]])
    gen = beam_search(model, src, beam=3, max_len_b=6, record_steps=True, trace=True)
    replay = add_cross_attention(replay_beam(gen, 0), model, src[0])
    traced = gen.traces[0].stack("dec.*.cross_attn.hook_probs")[:, 0]  # (L, H, T, S)
    for s, beam in enumerate(replay.path):
        torch.testing.assert_close(replay.steps[s].cross_attention[beam], traced[:, :, s], atol=1e-5, rtol=1e-5)
    assert replay.steps[0].cross_attention.shape == (3, 2, 4, 5)


def test_replay_needs_recorded_steps():
    cfg = presets.tiny(vocab=20)
    model = make_model(cfg)
    gen = beam_search(model, torch.tensor([[5, 2]]), beam=2, max_len_b=3)
    with pytest.raises(ValueError, match="record_steps=True"):
        replay_beam(gen, 0)

"""One DecodeConfig carries every search setting through decoding (keywords override its fields)."""

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench.core.config import DecodeConfig
from workbench.decoding.search import beam_search, generate, greedy, length_limits


def _same(a, b):
    return [[(h.tokens, h.score, h.log_prob) for h in hs] for hs in a.hypotheses] == \
           [[(h.tokens, h.score, h.log_prob) for h in hs] for hs in b.hypotheses]


def test_a_config_and_keywords_give_the_same_search(tiny_config):
    model = make_model(tiny_config).eval()
    src, _ = make_batch(tiny_config)
    cfg = DecodeConfig(beam=3, n_best=2, length_penalty="gnmt", alpha=0.6, max_len_b=6, min_len=2, no_repeat_ngram=2)
    assert _same(beam_search(model, src, cfg), beam_search(model, src, beam=3, n_best=2, length_penalty="gnmt",
                                                           alpha=0.6, max_len_b=6, min_len=2, no_repeat_ngram=2))
    assert _same(beam_search(model, src, cfg, beam=2, n_best=1), beam_search(model, src, cfg.__class__(
        beam=2, length_penalty="gnmt", alpha=0.6, max_len_b=6, min_len=2, no_repeat_ngram=2)))
    assert _same(greedy(model, src, cfg), generate(model, src, DecodeConfig(
        beam=1, length_penalty="gnmt", alpha=0.6, max_len_b=6, min_len=2, no_repeat_ngram=2)))
    assert torch.equal(length_limits(model, src, cfg), length_limits(model, src, max_len_b=6))


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), -1.0])
def test_searches_refuse_a_non_finite_alpha(tiny_config, alpha):
    model = make_model(tiny_config).eval()
    src, _ = make_batch(tiny_config)
    for search in (greedy, beam_search):
        with pytest.raises(ValueError, match=r"alpha \(.*\) must be a finite number >= 0"):
            search(model, src, alpha=alpha)


def test_unknown_search_options_are_named(tiny_config):
    model = make_model(tiny_config).eval()
    src, _ = make_batch(tiny_config)
    with pytest.raises(TypeError, match=r"unknown decoding options \['beam_size'\]"):
        beam_search(model, src, beam_size=4)


@pytest.mark.parametrize("beam", [0, -3, 1025, 99999])
def test_a_beam_outside_1_to_1024_is_refused_before_any_search(beam):
    """Beam 99999 on one word ran for minutes (memory and time grow with beam x vocabulary): refused at once."""
    with pytest.raises(ValueError, match=r"beam \(-?\d+\) must be between 1 and 1024"):
        DecodeConfig(beam=beam)
    assert DecodeConfig(beam=1024).beam == 1024

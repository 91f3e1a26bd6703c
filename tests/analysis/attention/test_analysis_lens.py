"""Logit lens: its last row is the model's output; positional split: the terms sum to the scores."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.analysis.attention.logit_lens import logit_lens
from workbench.analysis.attention.positional_share import positional_share, score_terms


@pytest.mark.parametrize("norm_first", [False, True])
def test_logit_lens_last_layer_is_the_model_output(norm_first):
    cfg = presets.tiny(vocab=40, norm_first=norm_first)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=2)
    targets = torch.roll(tgt, -1, 1)
    lens = logit_lens(model, src, tgt, targets=targets, top_k=3, keep_full=True)
    assert lens.layers == ("embed", "dec.0", "dec.1")
    with torch.no_grad():
        expected = model(src, tgt).float().log_softmax(-1)
    torch.testing.assert_close(lens.log_probs[-1], expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(lens.top_ids[-1, ..., 0], expected.argmax(-1))
    torch.testing.assert_close(lens.target_log_prob[-1], expected.gather(-1, targets[..., None])[..., 0])
    assert lens.top_ids.shape == (3, 2, tgt.size(1), 3)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("kind", ["enc_self", "dec_self"])
def test_score_terms_sum_to_the_scores(norm_first, kind):
    cfg = dataclasses.replace(presets.tiny(vocab=40, norm_first=norm_first), positions="learned")
    model = make_model(cfg)
    with torch.no_grad():
        model.positions.weight.normal_()  # learned positions start at zero-ish; make them matter
    src, tgt = make_batch(cfg, batch=2)
    terms = score_terms(model, src, tgt, kind)
    name = "enc.0.self_attn.hook_scores" if kind == "enc_self" else "dec.0.self_attn.hook_scores"
    _, trace = model.run_with_cache(src, tgt, names=[name])
    scores = trace[name]
    visible = scores > torch.finfo(scores.dtype).min / 2
    total = sum(terms.values())
    torch.testing.assert_close(total[visible], scores[visible], atol=1e-4, rtol=1e-4)
    df = positional_share(model, src, tgt, kinds=[kind])
    assert len(df) == cfg.n_heads and df["pos_share"].between(0, 1).all()


def test_no_positions_is_refused():
    cfg = dataclasses.replace(presets.tiny(vocab=40), positions="none")
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    with pytest.raises(ValueError, match="no positional encodings"):
        score_terms(model, src, tgt)

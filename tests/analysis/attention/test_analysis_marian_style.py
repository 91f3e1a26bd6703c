"""The analysis suite on a Marian-style model: the decoder starts with the padding id (pad 0, start 0).

Every decoder input then begins with the pad id, so "real position" must come from lengths, not `ids != pad`.
Each statistic is checked against a hand computation over unpadded single sentences."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_helpers import make_model

from workbench import presets
from workbench.analysis import (
    attention_rollout,
    attribution_patching,
    corpus_head_stats,
    decoder_rollout,
    direct_logit_attribution,
    generation_trace,
    head_importance,
    head_stats,
    integrated_gradients,
    log_prob,
    logit_diff,
    logit_lens,
    patching_sweep,
    path_patching,
    positional_share,
    score_terms,
    token_attribution,
    value_norms,
)
from workbench.analysis.attention.norms import layer_output_from_norm_terms
from workbench.core.batching import decoder_input, pad_sequences, teacher_forced
from workbench.core.heads import hook_name
from workbench.core.masks import causal_mask, real_positions, target_lengths

SOURCES = [[5, 6, 7, 8, 2], [9, 12, 2], [14, 15, 16, 17, 18, 2]]
OUTPUTS = [[9, 10, 11, 2], [13, 2], [20, 21, 22, 23, 24, 2]]


@pytest.fixture(scope="module")
def model():
    cfg = presets.tiny(vocab=40, decoder_start_id=0)
    assert cfg.pad_id == cfg.start_id == 0
    return make_model(cfg, seed=3)


def _batch(model):
    return teacher_forced(SOURCES, OUTPUTS, pad_id=0, start_id=0)


def test_decoder_positions_come_from_lengths():
    tgt = pad_sequences([decoder_input(o, 0) for o in OUTPUTS], 0)  # [[0, 9, 10, 11, 0, 0], [0, 13, 0, ...], ...]
    assert target_lengths(tgt, 0).tolist() == [4, 2, 6]
    assert real_positions(tgt, 0, decoder=True)[:, 0].all()  # the start token is real although it is the pad id
    assert (tgt != 0)[:, 0].sum() == 0  # what the old mask said
    b = teacher_forced(SOURCES, OUTPUTS, pad_id=0, start_id=0)
    assert torch.equal(b.tgt_mask(), real_positions(b.tgt_in, 0, decoder=True))
    assert torch.equal(b.src_mask(), b.src != 0)


def _entropy_by_hand(model, kind: str) -> np.ndarray:
    """(layers, H): mean over every real query row of every sentence, each sentence run alone (no padding)."""
    total, rows = 0.0, 0
    for src, out in zip(SOURCES, OUTPUTS):
        s, t = torch.tensor([src]), torch.tensor([decoder_input(out, 0)])
        _, trace = model.run_with_cache(s, t)
        probs = trace.stack(hook_name(kind, "*"))
        p = probs[:, 0].double()  # (L, H, Lq, Lk)
        total = total + (-(p * p.clamp_min(1e-300).log()).sum(-1)).sum(-1)  # (L, H)
        rows += p.size(2)
    return (total / rows).numpy()


def test_corpus_head_stats_count_the_start_row(model):
    table = corpus_head_stats(model, SOURCES, OUTPUTS, batch_size=2)
    for kind in ("enc_self", "dec_self", "cross"):
        got = np.stack([table.values("entropy")[table.block_index(kind, i)] for i in range(2)])
        np.testing.assert_allclose(got, _entropy_by_hand(model, kind), atol=1e-5, err_msg=kind)
    # the start row of decoder self-attention sees one key: entropy 0 and all weight on itself
    b = _batch(model)
    _, trace = model.run_with_cache(b.src, b.tgt_in)
    per_sentence = head_stats(trace, pad_id=0, eos_id=2)
    counts = per_sentence.counts["entropy"][:, per_sentence.block_index("dec_self", 0)]
    assert counts.tolist() == [4, 2, 6]  # every real decoder position, the start included


def _forward_with(model, src, tgt, name, fn):
    with torch.no_grad(), model.hooks({name: fn}):
        return model(src, tgt)


def test_resample_and_mean_ablation_on_decoder_sites(model):
    src, tgt = torch.tensor([[5, 6, 7, 8, 2]]), torch.tensor([[0, 9, 10, 11]])
    metric = logit_diff(3, 2, 11)
    # the repro: the reference has position 3 (its decoder input is [0, 9, 10, 11])
    same = patching_sweep(model, src, tgt, sites="resid_dec", metric=metric, ablation="resample",
                          reference=(src, tgt))
    # resampling from the sentence itself changes nothing: every site gives the clean metric
    np.testing.assert_allclose(same.values.numpy(), same.clean_metric, atol=1e-5)
    ref = teacher_forced(SOURCES, OUTPUTS, pad_id=0, start_id=0)
    mean = patching_sweep(model, src, tgt, sites="resid_dec", metric=metric, ablation="mean",
                          reference=(ref.src, ref.tgt_in))
    name = "hook_tgt_embed"
    _, cache = model.run_with_cache(ref.src, ref.tgt_in, names=[name])
    # the mean over every real position of every reference: 4 + 2 + 6 rows, the three start positions included
    rows = torch.cat([cache[name][i, :n] for i, n in enumerate(ref.tgt_lengths.tolist())])
    assert rows.size(0) == 12
    mean_row = rows.mean(0)

    def put(pos, value):
        def hook(x, h):
            x = x.clone()
            x[:, pos] = value
            return x
        return hook

    for pos, value in ((0, mean_row), (3, mean_row)):
        want = float(metric(_forward_with(model, src, tgt, name, put(pos, value)))[0])
        assert mean.values[mean.rows.index(name), pos].item() == pytest.approx(want, abs=1e-5)


def test_positional_share_counts_the_start_position(model):
    b = _batch(model)
    table = positional_share(model, b.src, b.tgt_in, kinds=("dec_self",))
    terms = score_terms(model, b.src, b.tgt_in, "dec_self")
    # by hand: sentence by sentence, every causal pair of its real positions
    sums = {t: torch.zeros(model.cfg.n_heads, dtype=torch.float64) for t in terms}
    count = 0
    for i, n in enumerate(b.tgt_lengths.tolist()):
        vis = causal_mask(n)
        count += int(vis.sum())
        for t, v in terms.items():
            sums[t] += (v[i, :, :n, :n].abs() * vis).sum((-1, -2)).double()
    for t in terms:
        np.testing.assert_allclose(table[t].to_numpy(), (sums[t] / count).numpy(), rtol=1e-5, err_msg=t)


def test_the_rest_of_the_suite_runs_and_holds_its_invariants(model):
    b = _batch(model)
    src, tgt, out = b.src[:1, :5], b.tgt_in[:1, :4], b.tgt_out[:1, :4]
    # direct logit attribution sums to the logit
    dla = direct_logit_attribution(model, src, tgt, position=0, token=9)
    assert dla.values.sum().item() == pytest.approx(dla.logit, abs=1e-4)
    # generation trace equals the teacher-forced capture of its own output
    hyp, trace = generation_trace(model, src, names="*.hook_probs", max_len_b=6)
    _, forced = model.run_with_cache(src, torch.tensor([decoder_input(hyp.tokens, 0)]))
    assert trace.tgt[0, 0].item() == 0
    for name in forced:
        torch.testing.assert_close(trace[name], forced[name], atol=1e-5, rtol=1e-4)
    # decoder rollout rows are distributions over source + target prefix, start row included
    _, full = model.run_with_cache(src, tgt)
    rolled = decoder_rollout(full)
    assert torch.isfinite(rolled.source).all()
    enc = attention_rollout(full.stack("enc.*.self_attn.hook_probs")[:, 0])
    torch.testing.assert_close(enc.sum(-1), torch.ones_like(enc.sum(-1)))
    # logit lens reads the start position like any other
    lens = logit_lens(model, src, tgt, targets=out)
    assert torch.isfinite(lens.target_log_prob).all()
    # integrated gradients is complete (rows sum to log p(y|x) - log p(y|baseline))
    _, delta = integrated_gradients(model, src, tgt, out, return_convergence_delta=True)
    assert delta.abs().max() < 0.05
    # gradients reach the start position's embedding
    attr = token_attribution(model, src, tgt, out)
    assert (attr.target_saliency[:, 0] > 0).all()
    # value norms rebuild the block output
    _, vt = model.run_with_cache(src, tgt, names=["dec.0.self_attn.hook_probs", "dec.0.self_attn.hook_v",
                                                  "dec.0.self_attn.hook_out"])
    norms = value_norms(model, vt, "dec_self", 0)
    assert norms.per_head.shape[-2:] == (4, 4)
    torch.testing.assert_close(layer_output_from_norm_terms(model, vt, "dec_self", 0).float(),
                               vt["dec.0.self_attn.hook_out"], atol=1e-5, rtol=1e-4)
    # patching estimates and path patching run on decoder-start-is-pad inputs
    corrupted = torch.tensor([[5, 6, 12, 8, 2]])
    lp = log_prob(out[0])
    ap = attribution_patching(model, src, tgt, corrupted_src=corrupted, sites="resid_dec", metric=lp)
    assert torch.isfinite(ap.values).all()
    pp = path_patching(model, src, tgt, corrupted_src=corrupted, metric=lp)
    assert pp.values.shape == (2 * (model.cfg.n_heads + 1), 2)
    # head importance: teacher-forced log-probabilities of the references, start position included
    table = head_importance(model, SOURCES[:2], OUTPUTS[:2], kinds=("dec_self",), max_len_b=6)
    assert len(table) == 2 * model.cfg.n_heads

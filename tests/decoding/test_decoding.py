"""Decoding: beam 1 == greedy, batched == one by one, scores == teacher-forced log-probs,
traces == teacher-forced attention, limits and bans hold, beam never loses to greedy."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from model_helpers import ROOT, make_batch, make_model

from workbench import Transformer, presets
from workbench.core.config import DecodeConfig
from workbench.decoding.search import beam_search, generate, greedy, penalty_divisor

LIMITS = dict(max_len_a=1.0, max_len_b=3)



def copy_batch(cfg, batch: int, g: torch.Generator, lo: int = 3, hi: int = 8):
    """Copy task: the target is the source (ids above the specials), variable lengths."""
    lengths = torch.randint(lo, hi + 1, (batch,), generator=g)
    width = int(lengths.max()) + 1
    src = torch.full((batch, width), cfg.pad_id)
    for i, n in enumerate(lengths.tolist()):
        src[i, :n] = torch.randint(4, cfg.src_vocab, (n,), generator=g)
        src[i, n] = cfg.eos_id
    tgt_out = src.clone()
    tgt_in = torch.cat([torch.full((batch, 1), cfg.start_id), src[:, :-1]], 1)
    tgt_in[tgt_in == cfg.eos_id] = cfg.pad_id
    return src, tgt_in, tgt_out


@pytest.fixture(scope="module")
def trained():
    """A tiny model trained for a few seconds on copying: confident but imperfect outputs."""
    cfg = presets.tiny(vocab=16, dropout=0.0, max_positions=64)
    torch.manual_seed(0)
    model = Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(150):
        src, tgt_in, tgt_out = copy_batch(cfg, 32, g)
        logits = model(src, tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=cfg.pad_id)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    src, _, _ = copy_batch(cfg, 12, torch.Generator().manual_seed(123))
    return model, src


def teacher_forced_log_prob(model, src_row: torch.Tensor, tokens: list[int]) -> float:
    """Sum of log p(token) over the output, computed by one full forward (the second path)."""
    cfg = model.cfg
    src_row = src_row[src_row != cfg.pad_id][None]
    tgt_in = torch.tensor([[cfg.start_id, *tokens[:-1]]])
    with torch.no_grad():
        logp = model(src_row, tgt_in).float().log_softmax(-1)[0]
    return float(logp[torch.arange(len(tokens)), torch.tensor(tokens)].sum())


def strip(src: torch.Tensor, i: int, pad: int) -> torch.Tensor:
    row = src[i]
    return row[row != pad][None]


@pytest.mark.parametrize("options", [
    {},
    {"length_penalty": "gnmt", "alpha": 0.6},
    {"length_penalty": "none", "min_len": 4},
    {"no_repeat_ngram": 2},
])
def test_beam_one_equals_greedy(tiny_config, trained, options):
    for model, src in [(make_model(tiny_config), make_batch(tiny_config, batch=4)[0]), trained]:
        g = greedy(model, src, **LIMITS, **options)
        b = beam_search(model, src, beam=1, **LIMITS, **options)
        assert [h.tokens for h in g.best] == [h.tokens for h in b.best]
        assert [h.log_prob for h in g.best] == [h.log_prob for h in b.best]
        assert [h.score for h in g.best] == [h.score for h in b.best]


@pytest.mark.parametrize("beam", [1, 4])
def test_batched_equals_one_by_one(trained, beam):
    model, src = trained
    pad = model.cfg.pad_id
    batched = beam_search(model, src, beam=beam, n_best=min(2, beam), **LIMITS)
    for i in range(src.size(0)):
        alone = beam_search(model, strip(src, i, pad), beam=beam, n_best=min(2, beam), **LIMITS)
        assert [h.tokens for h in alone.hypotheses[0]] == [h.tokens for h in batched.hypotheses[i]]
        for a, b in zip(alone.hypotheses[0], batched.hypotheses[i]):
            assert a.score == pytest.approx(b.score, abs=1e-5)


@pytest.mark.parametrize("check_every", [1, 3, 100])
def test_check_interval_does_not_change_results(trained, check_every):
    model, src = trained
    ref = beam_search(model, src, beam=3, **LIMITS, check_every=1)
    got = beam_search(model, src, beam=3, **LIMITS, check_every=check_every)
    assert [h.tokens for h in ref.best] == [h.tokens for h in got.best]
    g_ref = greedy(model, src, **LIMITS, check_every=1)
    g_got = greedy(model, src, **LIMITS, check_every=check_every)
    assert [h.tokens for h in g_ref.best] == [h.tokens for h in g_got.best]


@pytest.mark.parametrize("K,vocab", [(1, 7), (3, 5), (4, 50), (5, 1000)])
def test_candidates_in_two_rounds_equal_one_top_2k_over_every_beam_and_token(K, vocab):
    """`_candidates` ranks each beam's 2K best tokens, then a sentence's K·2K: the same candidates (score, beam,
    token, in order) as one top-2K over all K·V continuations, also with beams not yet alive (-inf, the first
    step) and a vocabulary smaller than 2K."""
    from workbench.decoding.search import _Beams, _candidates

    g = torch.Generator().manual_seed(K * vocab)
    b = 6
    beams = _Beams.start(torch.full((b,), 9), K, 10, start_id=1, pad=0)
    beams.alive_score = -torch.rand(b, K, generator=g) * 5
    beams.alive_score[0, 1:] = float("-inf")
    logp = torch.randn(b * K, vocab, generator=g).log_softmax(-1)
    got = _candidates(beams, logp.clone(), K, eos=2)
    flat = (logp + beams.alive_score.view(-1, 1)).view(b, K * vocab)
    want_score, want_idx = flat.topk(min(2 * K, K * vocab), dim=-1)
    finite = want_score > float("-inf")
    assert torch.equal(got.score, want_score)
    assert torch.equal(got.beam[finite], (want_idx // vocab)[finite])
    assert torch.equal(got.token[finite], (want_idx % vocab)[finite])
    assert torch.equal(got.is_eos, got.token == 2)


@pytest.mark.parametrize("kind,alpha", [("average", 1.0), ("gnmt", 0.6), ("none", 1.0), ("average", 0.5)])
def test_beam_never_scores_worse_than_greedy(trained, kind, alpha):
    model, src = trained
    g = greedy(model, src, length_penalty=kind, alpha=alpha, **LIMITS)
    for beam in (2, 5):
        b = beam_search(model, src, beam=beam, length_penalty=kind, alpha=alpha, **LIMITS)
        for hb, hg in zip(b.best, g.best):
            # beam's cross-attention meets a sentence's K/V once for all its beams' queries, greedy's one query
            # row at a time: other kernel shapes, other summation orders (the same output scores 1e-6 apart)
            assert hb.score >= hg.score - 1e-5


def test_trained_model_copies(trained):
    """Guards the fixture: the other tests need a model whose outputs are not degenerate."""
    model, src = trained
    out = beam_search(model, src, beam=4, **LIMITS)
    pad = model.cfg.pad_id
    exact = sum(h.tokens == strip(src, i, pad)[0].tolist() for i, h in enumerate(out.best))
    assert exact >= src.size(0) // 2


def test_scores_are_teacher_forced_log_probs(trained):
    model, src = trained
    gen = beam_search(model, src, beam=3, n_best=3, length_penalty="gnmt", alpha=0.6, **LIMITS)
    for i, hyps in enumerate(gen.hypotheses):
        for h in hyps:
            assert h.tokens[-1] == model.cfg.eos_id and model.cfg.eos_id not in h.tokens[:-1]
            lp = teacher_forced_log_prob(model, src[i], h.tokens)
            assert h.log_prob == pytest.approx(lp, abs=1e-4)
            assert h.score == pytest.approx(lp / ((5 + h.length) / 6) ** 0.6, abs=1e-4)


def test_n_best_is_sorted_and_distinct(trained):
    model, src = trained
    gen = beam_search(model, src, beam=5, n_best=5, **LIMITS)
    for hyps in gen.hypotheses:
        assert len(hyps) == 5
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 5


def test_length_limits_and_min_len(tiny_config):
    model = make_model(tiny_config)
    src, _ = make_batch(tiny_config, batch=3, src_len=7)
    src_len = (src != tiny_config.pad_id).sum(1)
    for search in (greedy, lambda m, s, **k: beam_search(m, s, beam=3, **k)):
        gen = search(model, src, max_len_a=0.5, max_len_b=2)
        for n, h in zip(src_len.tolist(), gen.best):
            assert h.length - 1 <= int(0.5 * n) + 2 and h.tokens[-1] == tiny_config.eos_id
        gen = search(model, src, max_len=3, max_len_b=50)
        assert all(h.length <= 4 for h in gen.best)
        gen = search(model, src, min_len=6, max_len_b=8)
        assert all(h.length - 1 >= 6 for h in gen.best)
        gen = search(model, src, max_len=0)  # only EOS fits
        assert all(h.tokens == [tiny_config.eos_id] for h in gen.best)


def test_max_positions_caps_the_output(tiny_config):
    import dataclasses

    cfg = dataclasses.replace(tiny_config, max_positions=9)
    model = make_model(cfg)
    src, _ = make_batch(cfg, batch=2, src_len=5)
    gen = beam_search(model, src, beam=2, min_len=100, max_len_b=1000)
    assert all(h.length == 9 for h in gen.best)  # 8 tokens + EOS: start + 8 inputs fill 9 positions


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram(tiny_config, n):
    model = make_model(tiny_config)  # untrained: left alone it repeats tokens
    src, _ = make_batch(tiny_config, batch=3)
    for gen in (greedy(model, src, no_repeat_ngram=n, min_len=10, max_len_b=12),
                beam_search(model, src, beam=3, no_repeat_ngram=n, min_len=10, max_len_b=12)):
        for h in gen.best:
            grams = [tuple(h.tokens[i : i + n]) for i in range(len(h.tokens) - n + 1)]
            assert len(grams) == len(set(grams))


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_trace_equals_teacher_forced_forward(tiny_config, search):
    model = make_model(tiny_config)
    src, _ = make_batch(tiny_config, batch=3, src_len=7)
    if search == "greedy":
        gen = greedy(model, src, max_len_b=6, trace=True)
    else:
        gen = beam_search(model, src, beam=4, max_len_b=6, trace=True, length_penalty="none")
    assert gen.traces is not None and len(gen.traces) == 3
    for i, (trace, hyp) in enumerate(zip(gen.traces, gen.best)):
        assert trace.tgt[0].tolist() == [tiny_config.start_id, *hyp.tokens[:-1]]
        assert torch.equal(trace.src, strip(src, i, tiny_config.pad_id))
        _, ref = model.run_with_cache(trace.src, trace.tgt)
        assert sorted(ref) == sorted(trace)
        for name in ref:
            assert trace[name].shape == ref[name].shape, name
            torch.testing.assert_close(trace[name], ref[name], atol=1e-6, rtol=0)


def test_trace_does_not_change_the_search(trained):
    model, src = trained
    plain = beam_search(model, src, beam=3, **LIMITS)
    traced = beam_search(model, src, beam=3, **LIMITS, trace=True)
    assert [h.tokens for h in plain.best] == [h.tokens for h in traced.best]


def test_recorded_steps_replay_the_search(trained):
    model, src = trained
    K = 3
    gen = beam_search(model, src, beam=K, record_steps=True, **LIMITS)
    steps = gen.steps
    assert steps is not None and steps[0].step == 0
    for st in steps:
        # survivors are the best non-finished, non-EOS candidates, and carry their scores
        picked = st.cand_score.gather(1, st.survivors)
        assert torch.equal(picked, st.alive_scores)
        assert not (st.cand_token.gather(1, st.survivors) == model.cfg.eos_id).any()
        assert (st.cand_token[st.cand_finished] == model.cfg.eos_id).all()
    # replay: walk sentence 0's best hypothesis through the recorded candidates
    best = gen.best[0]
    finished = [(st, c) for st in steps for c in range(st.cand_token.size(1))
                if int(st.sentences[0]) == 0 and st.cand_finished[0, c]
                and st.cand_score[0, c] == pytest.approx(best.log_prob, abs=1e-6)]
    assert finished and finished[0][0].step == best.length - 1


def test_generate_dispatches_on_beam(trained):
    model, src = trained
    g = generate(model, src, DecodeConfig(beam=1, max_len_b=5))
    assert g.meta["search"] == "greedy"
    b = generate(model, src, DecodeConfig(beam=3, n_best=2, max_len_b=5))
    assert b.meta["search"] == "beam" and all(len(h) == 2 for h in b.hypotheses)


def test_length_penalty_formulas():
    lengths = torch.tensor([1.0, 4.0, 10.0])
    torch.testing.assert_close(penalty_divisor(lengths, "average", 1.0), lengths)
    torch.testing.assert_close(penalty_divisor(lengths, "gnmt", 0.6), ((5 + lengths) / 6) ** 0.6)
    torch.testing.assert_close(penalty_divisor(lengths, "none", 1.0), torch.ones(3))
    with pytest.raises(ValueError, match="length_penalty"):
        penalty_divisor(lengths, "fairseq", 1.0)


def test_bad_calls_are_refused(tiny_config):
    model = make_model(tiny_config)
    src, _ = make_batch(tiny_config)
    with pytest.raises(ValueError, match="n_best"):
        beam_search(model, src, beam=2, n_best=3)
    with pytest.raises(ValueError, match="training mode"):
        greedy(model.train(), src)
    with pytest.raises(ValueError, match="min_len"):
        DecodeConfig(min_len=5, max_len=3)


# ---------------------------------------------------------------------------- the naive reference search


def naive_beam_search(model, src_row: torch.Tensor, cfg: DecodeConfig) -> list[tuple[list[int], float, float]]:
    """The search rules of `beam_search` written the plain way, one sentence at a time: every beam's whole
    prefix re-run through the model each step (no cache, no batching, no pruning of finished sentences),
    Python lists for the pool. Returns the n best (tokens, score, log_prob).

    Rules (fairseq's, as the module docstring states them): rank the 2K best continuations of the K live
    beams; EOS among the top K finishes (scored with the length penalty) into a pool of the K best; the K
    best non-EOS candidates live on; done once K have finished or at the length limit, where EOS is forced.
    """
    mc, K = model.cfg, cfg.beam
    eos, pad = mc.eos_id, mc.pad_id
    src_row = src_row[src_row != pad][None]
    limit = min(int(cfg.max_len_a * src_row.size(1)) + cfg.max_len_b, mc.max_positions - 1,
                cfg.max_len if cfg.max_len is not None else 10**9)
    alive = [([], 0.0)]  # (tokens so far, summed log-probability); the first step expands one beam
    pool: list[tuple[float, float, list[int]]] = []  # (score, log_prob, tokens)
    for step in range(limit + 1):
        rows = []
        for toks, lp in alive:
            with torch.no_grad():
                logp = model(src_row, torch.tensor([[mc.start_id, *toks]]))[0, -1].float().log_softmax(-1)
            eos_lp = float(logp[eos])
            logp[pad] = float("-inf")
            if step < cfg.min_len:
                logp[eos] = float("-inf")
            if step >= limit:
                logp = torch.full_like(logp, float("-inf"))
                logp[eos] = eos_lp
            rows.append(lp + logp)
        flat = torch.stack(rows).view(-1)  # candidates in (beam, token) order
        totals, order = flat.sort(descending=True, stable=True)  # equal totals keep that order
        vocab = rows[0].numel()
        top = [(float(t), int(i) // vocab, int(i) % vocab) for t, i in zip(totals[: 2 * K], order[: 2 * K])]
        for total, b, t in top[:K]:
            if t == eos and total > float("-inf"):
                toks = [*alive[b][0], eos]
                pool.append((total / penalty_divisor(float(len(toks)), cfg.length_penalty, cfg.alpha), total, toks))
        pool = sorted(pool, key=lambda p: -p[0])[:K]
        if len(pool) == K or step >= limit:
            break
        alive = [([*alive[b][0], t], total) for total, b, t in top if t != eos][:K]
    return [(toks, score, lp) for score, lp, toks in pool[: cfg.n_best]]


@pytest.mark.parametrize("options", [
    dict(beam=4, n_best=2),
    dict(beam=3, length_penalty="gnmt", alpha=0.6, min_len=2),
    dict(beam=5, length_penalty="none", max_len=4),
])
def test_beam_search_equals_the_naive_search(tiny_config, trained, options):
    """Batched, cached, pruned search == the plain per-sentence loop over full forwards: the same outputs,
    token for token, and the same scores up to the cache's rounding."""
    cfg = DecodeConfig(**LIMITS, **options)
    for model, src in [(make_model(tiny_config), make_batch(tiny_config, batch=4)[0]), trained]:
        gen = beam_search(model, src, cfg)
        for i, hyps in enumerate(gen.hypotheses):
            ref = naive_beam_search(model, src[i], cfg)
            assert [h.tokens for h in hyps] == [r[0] for r in ref]
            for h, (_, score, lp) in zip(hyps, ref):
                assert h.score == pytest.approx(score, abs=1e-5) and h.log_prob == pytest.approx(lp, abs=1e-5)


def test_beam_search_equals_the_naive_search_on_the_shipped_model(shared_data):
    """The shipped Multi30k de->en checkpoint on the first test2016 sentences, with its own decoding defaults."""
    import workbench

    tm = workbench.load(ROOT / "checkpoints" / "multi30k-de-en")
    lines = (shared_data / "multi30k" / "test_2016_flickr.de").read_text().splitlines()[:8]
    batch = tm.encode_batch(lines)
    cfg = dataclasses.replace(tm.decode_config, beam=5, n_best=2)
    gen = beam_search(tm.model, batch.src, cfg)
    for i, hyps in enumerate(gen.hypotheses):
        ref = naive_beam_search(tm.model, batch.src[i], cfg)
        assert [h.tokens for h in hyps] == [r[0] for r in ref], lines[i]

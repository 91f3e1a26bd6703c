"""Batched "why": logit attribution for every sentence and position in one call, a padded batch from text, the
decoding step seen by hooks during generation, embeddings as path-patching senders and paths into queries.
Each is checked against the one-at-a-time functions or a hand-written run."""

from __future__ import annotations

import pytest
import torch
from model_helpers import SHARED_DATA, make_model

from workbench import Transformer, presets
from workbench.analysis import (
    attribution_patching,
    batch_attribution_patching,
    direct_logit_attribution,
    log_prob,
    logit_attributions,
    path_patching,
    sequence_log_prob,
)
from workbench.checkpoint.tokenizer import SentencePieceTokenizer
from workbench.core.batching import decoder_input, teacher_forced
from workbench.core.config import DecodeConfig
from workbench.decoding.search import beam_search, greedy
from workbench.decoding.translator import TranslationModel

SOURCES = [[5, 6, 7, 8, 2], [9, 12, 2], [14, 15, 16, 17, 18, 2]]
OUTPUTS = [[9, 10, 11, 2], [13, 2], [20, 21, 22, 23, 24, 2]]


@pytest.fixture(scope="module", params=[False, True], ids=["post-norm", "pre-norm"])
def model(request):
    return make_model(presets.tiny(vocab=40, norm_first=request.param, output_bias=True), seed=5)


def test_logit_attributions_over_a_batch_equal_one_position_at_a_time(model):
    b = teacher_forced(SOURCES, OUTPUTS, pad_id=0, start_id=model.cfg.start_id)
    foils = torch.full_like(b.tgt_out, 7)
    batch = logit_attributions(model, b.src, b.tgt_in, b.tgt_out, baseline_tokens=foils)
    assert batch.values.shape == (len(batch.labels), 3, b.tgt_in.size(1))
    torch.testing.assert_close(batch.values.sum(0), batch.logits, atol=1e-4, rtol=0)  # complete, every (b, t)
    for i, (src, out) in enumerate(zip(SOURCES, OUTPUTS)):
        tgt = decoder_input(out, model.cfg.start_id)
        for t in range(len(out)):
            one = direct_logit_attribution(model, src, tgt, position=t, token=out[t], baseline_token=7)
            assert one.labels == batch.labels
            torch.testing.assert_close(batch.values[:, i, t], one.values, atol=1e-6, rtol=1e-6)
            assert batch.at(i, t).logit == pytest.approx(one.logit, abs=1e-5)


@pytest.fixture(scope="module")
def tm():
    de = (SHARED_DATA / "multi30k" / "train.de").read_text(encoding="utf-8").splitlines()[:300]
    en = (SHARED_DATA / "multi30k" / "train.en").read_text(encoding="utf-8").splitlines()[:300]
    tok = SentencePieceTokenizer.train(sentences=de + en, vocab_size=400, num_threads=1)
    torch.manual_seed(0)
    model = Transformer(presets.tiny(vocab=tok.vocab_size, max_positions=48)).eval()
    return TranslationModel(model, tok, decode=DecodeConfig(beam=1, max_len_b=5))


def test_encode_batch_is_ready_for_run_with_cache(tm):
    texts = ["Ein Hund läuft.", "Zwei Männer spielen Fußball auf der Wiese.", "Ja."]
    outputs = ["A dog runs.", "Two men play.", "Yes."]
    b = tm.encode_batch(texts, outputs)
    with torch.no_grad():
        logits, trace = tm.model.run_with_cache(b.src, b.tgt_in)
    for i, (text, output) in enumerate(zip(texts, outputs)):
        one = tm.score(text, output, trace=True)
        n, s = int(b.tgt_lengths[i]), int(b.src_lengths[i])
        assert b.tgt_out[i, :n].tolist() == one.tokens and b.src[i, :s].tolist() == one.source_tokens
        lp = logits[i, :n].float().log_softmax(-1).gather(-1, b.tgt_out[i, :n, None]).sum()
        assert float(lp.detach()) == pytest.approx(one.log_prob, abs=1e-4)
        name = "dec.1.cross_attn.hook_probs"
        torch.testing.assert_close(trace[name][i, :, :n, :s], one.trace[name][0], atol=1e-5, rtol=1e-4)
    assert tm.encode_batch(texts).tgt_in is None
    with pytest.raises(ValueError, match="empty"):
        tm.encode_batch(["Ein Hund.", "  "])


def test_hooks_during_generation_see_the_step_sentence_and_beam():
    cfg = presets.tiny(vocab=40)
    model = make_model(cfg, seed=2)
    src = torch.tensor([[5, 6, 7, 2, 0], [9, 12, 13, 14, 2], [4, 2, 0, 0, 0]])
    seen = []

    def record(x, hook):
        ctx = hook.decoding
        seen.append(None if ctx is None else (ctx.step, ctx.sentences.tolist(), ctx.beams.tolist(), x.size(0)))

    with model.hooks({"dec.0.self_attn.hook_q": record, "enc.0.self_attn.hook_q": record}):
        gen = greedy(model, src, max_len_b=6)
    assert seen[0] is None  # the encoder runs once, before any step
    lengths = [len(h.tokens) for h in gen.best]
    for step, sentences, beams, rows in seen[1:]:
        assert sentences == [i for i in range(3) if lengths[i] > step]  # finished sentences leave the batch
        assert beams == [0] * rows and rows == len(sentences)
    assert [s[0] for s in seen[1:]] == list(range(max(lengths)))
    # an edit at one step of one sentence changes that sentence only, from that step on
    def zero_at(x, hook):
        ctx = hook.decoding
        if ctx is not None and ctx.step == 1:
            return x * (ctx.sentences != 1).to(x.dtype)[:, None, None, None]
        return None

    with model.hooks({"dec.*.cross_attn.hook_context": zero_at}):
        edited = greedy(model, src, max_len_b=6)
    for i in (0, 2):
        assert edited.best[i].tokens == gen.best[i].tokens
    with model.hooks({"dec.*.cross_attn.hook_context": zero_at}):
        alone = greedy(model, src[1:2], max_len_b=6)  # sentence 1 alone is row 0: the edit skips it
    assert alone.best[0].tokens == gen.best[1].tokens
    # beam search: every row knows its beam
    beams = []
    with model.hooks({"dec.0.self_attn.hook_q": lambda x, h: beams.append(h.decoding.beams.tolist())}):
        beam_search(model, src[:2], beam=3, max_len_b=4)
    assert beams[0] == [0, 1, 2, 0, 1, 2]


@torch.no_grad()
def _path_by_hand(model, src, tgt, c_src, metric, sender: str, head, receivers: list[str]):
    """One sender, one receiver: corrupted sender, every component frozen clean, receiver patched alone."""
    comps = [n for n in model.hook_names() if n.endswith((".hook_result", ".ffn.hook_out"))]
    names = sorted(set(comps) | {sender})
    _, clean = model.run_with_cache(src, tgt, names=names)
    _, corr = model.run_with_cache(c_src, tgt, names=names)

    def freeze(x, hook):
        out = clean[hook.name].clone()
        if hook.name == sender:
            if head is None:
                out = corr[sender].clone()
            else:
                out[:, head] = corr[sender][:, head]
        return out

    with model.capture(receivers) as store, model.hooks({n: freeze for n in names}):
        model(src, tgt)
    with model.hooks({r: (lambda x, h: store[h.name][-1]) for r in receivers}):
        return float(metric(model(src, tgt))[0])


def test_embeddings_as_senders_and_paths_into_queries():
    cfg = presets.tiny(vocab=40)
    model = make_model(cfg, seed=4)
    src, c_src = torch.tensor([[5, 6, 7, 8, 2]]), torch.tensor([[5, 6, 12, 8, 2]])
    tgt = torch.tensor([[cfg.start_id, 9, 10, 11]])
    metric = log_prob([9, 10, 11, 2])
    kv = path_patching(model, src, tgt, corrupted_src=c_src, metric=metric, embeddings=True)
    assert kv.rows[0] == "hook_src_tok" and kv.positions == ["dec.0.cross_attn.kv", "dec.1.cross_attn.kv"]
    want = _path_by_hand(model, src, tgt, c_src, metric, "hook_src_tok", None,
                         ["dec.1.cross_attn.hook_k", "dec.1.cross_attn.hook_v"])
    assert kv.values[0, 1].item() == pytest.approx(want, abs=1e-5)
    q = path_patching(model, src, tgt, corrupted_src=c_src, metric=metric, senders="decoder", receivers="cross_q",
                      embeddings=True)
    assert q.positions == ["dec.0.cross_attn.hook_q", "dec.1.cross_attn.hook_q"]
    row = q.rows.index("cross:0:2")
    want = _path_by_hand(model, src, tgt, c_src, metric, "dec.0.cross_attn.hook_result", 2,
                         ["dec.1.cross_attn.hook_q"])
    assert q.values[row, 1].item() == pytest.approx(want, abs=1e-5)
    assert q.values[row, 1].item() != pytest.approx(q.clean_metric, abs=1e-6)  # a real path
    # the target embedding is the same in both runs: patching it along any path changes nothing
    assert q.values[q.rows.index("hook_tgt_tok")].tolist() == pytest.approx([q.clean_metric] * 2, abs=1e-5)


def test_batch_attribution_patching_equals_one_sentence_at_a_time(model):
    b = teacher_forced(SOURCES, OUTPUTS, pad_id=0, start_id=model.cfg.start_id)
    corrupted = b.src.clone()
    corrupted[:, 1] = 30  # the second source token of every sentence swapped
    metric = sequence_log_prob(b.tgt_out, b.tgt_lengths)
    for sites in ("head", "resid_enc", "cross_kv", "resid_dec"):
        batch = batch_attribution_patching(model, b.src, b.tgt_in, corrupted_src=corrupted, sites=sites,
                                           metric=metric)
        for i, (src, out) in enumerate(zip(SOURCES, OUTPUTS)):
            tgt = decoder_input(out, model.cfg.start_id)
            one = attribution_patching(model, src, tgt, corrupted_src=corrupted[i, : len(src)], sites=sites,
                                       metric=log_prob(out))
            assert batch.clean_metric[i].item() == pytest.approx(one.clean_metric, abs=1e-5)
            assert batch.corrupted_metric[i].item() == pytest.approx(one.corrupted_metric, abs=1e-5)
            got = batch.values[i, :, : one.values.size(1)]
            torch.testing.assert_close(got, one.values, atol=1e-4, rtol=1e-4, equal_nan=True, msg=sites)
            assert torch.isnan(batch.values[i, :, one.values.size(1):]).all()  # the sentence's padding

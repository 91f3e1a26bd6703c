"""Analyses that decode follow the model's own decoding settings: a TranslationModel's DecodeConfig, or one passed
(positionally too) with a bare model; the trace follows what `tm.translate` outputs."""

from __future__ import annotations

import pytest
import torch
from model_helpers import SHARED_DATA

from workbench import Transformer, presets
from workbench.analysis import generation_trace, head_importance, run_outcome
from workbench.checkpoint.tokenizer import SentencePieceTokenizer
from workbench.core.batching import decoder_input
from workbench.core.config import DecodeConfig
from workbench.decoding.translator import TranslationModel

SENTENCES = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball.", "Eine Frau liest ein Buch."]
# a repetition guard and a length penalty the defaults lack: a random tiny model repeats itself, so they matter
SETTINGS = DecodeConfig(beam=3, length_penalty="gnmt", alpha=0.6, no_repeat_ngram=1, max_len_a=1.0, max_len_b=4)


@pytest.fixture(scope="module")
def tm():
    de = (SHARED_DATA / "multi30k" / "train.de").read_text(encoding="utf-8").splitlines()[:300]
    en = (SHARED_DATA / "multi30k" / "train.en").read_text(encoding="utf-8").splitlines()[:300]
    tok = SentencePieceTokenizer.train(sentences=de + en, vocab_size=400, num_threads=1)
    torch.manual_seed(0)
    model = Transformer(presets.tiny(vocab=tok.vocab_size, max_positions=48)).eval()
    return TranslationModel(model, tok, decode=SETTINGS)


def test_traces_follow_what_translate_outputs(tm):
    results = tm.translate(SENTENCES, return_tokens=True)
    differs = 0
    for text, r in zip(SENTENCES, results):
        hyp, trace = generation_trace(tm, text, names="dec.*.cross_attn.hook_probs")
        assert hyp.tokens == r.tokens
        assert trace.tgt[0].tolist() == decoder_input(r.tokens, tm.model.cfg.start_id)
        # the same with the bare model and the DecodeConfig, given in place of the names (positionally)
        hyp_bare, _ = generation_trace(tm.model, torch.tensor(r.source_tokens), SETTINGS)
        assert hyp_bare.tokens == r.tokens
        hyp_pos, _ = generation_trace(tm.model, r.source_tokens, "*.hook_probs", SETTINGS)
        assert hyp_pos.tokens == r.tokens
        default, _ = generation_trace(tm.model, r.source_tokens, "*.hook_probs", max_len_a=1.0, max_len_b=4)
        differs += default.tokens != r.tokens
    assert differs > 0  # the defaults (greedy, no guard) give another output: the settings are what matters


def test_head_importance_and_run_outcome_decode_as_translate_does(tm):
    results = tm.translate(SENTENCES, return_tokens=True)
    sources = [r.source_tokens for r in results]
    targets = [r.tokens for r in results]
    outcome = run_outcome(tm, sources, targets)
    assert outcome.outputs == targets
    assert run_outcome(tm.model, sources, targets, config=SETTINGS).outputs == targets
    table = head_importance(tm, sources, targets, kinds=("cross",))
    # with no head ablated nothing changes; ablating reads the same outputs as a baseline
    assert table.attrs["baseline"]["ref_log_prob"] == pytest.approx(float(outcome.ref_log_prob.mean()))
    assert len(table) == 2 * tm.model.cfg.n_heads


def test_a_text_source_needs_a_translation_model(tm):
    with pytest.raises(TypeError, match="needs a TranslationModel"):
        generation_trace(tm.model, "Ein Hund.")
    with pytest.raises(TypeError, match="config must be a DecodeConfig"):
        generation_trace(tm, "Ein Hund.", "*", {"beam": 2})

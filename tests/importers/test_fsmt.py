"""Hugging Face FSMT (fairseq WMT19 port) -> workbench: same encoder output, logits, greedy and beam."""

from __future__ import annotations

import pytest
import torch
from importer_helpers import PER_STACK, bpe_files, eos_prone_fsmt, fsmt_model, padded_batch

from workbench.decoding.search import beam_search, greedy
from workbench.importers.fsmt import convert_fsmt, import_fsmt

pytest.importorskip("transformers", reason="the parity reference is transformers' FSMTForConditionalGeneration")

VARIANTS = {
    "separate_untied": {},  # 53 / 47 vocabularies, 3 + 2 layers, untied output (FSMT's default)
    "shared_tied": {"src_vocab_size": 47, "tie_word_embeddings": True},
    "gelu_unscaled": {"activation_function": "gelu", "scale_embedding": False},
    "per_stack_sizes": PER_STACK,
}


def _batch(hf, **kw):
    c = hf.config
    return padded_batch(src_vocab=c.src_vocab_size, tgt_vocab=c.tgt_vocab_size, pad=c.pad_token_id,
                        eos=c.eos_token_id, start=c.decoder_start_token_id, low=4, **kw)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_encoder_output_and_logits_match_transformers(variant):
    hf = fsmt_model(seed=2, **VARIANTS[variant])
    model, report = convert_fsmt(hf.state_dict(), hf.config.to_dict())
    src, tgt = _batch(hf)
    mask = src != hf.config.pad_token_id
    with torch.no_grad():
        ref_memory = hf.model.encoder(src, attention_mask=mask.long()).last_hidden_state
        # use_cache=False: with a cache, FSMT's forward skips the causal mask (it expects one step at a time)
        ref = hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt, use_cache=False).logits
        memory = model.encode(src).memory
        logits = model(src, tgt)
    torch.testing.assert_close(memory[mask], ref_memory[mask], rtol=0, atol=1e-5)
    real = tgt != hf.config.pad_token_id
    torch.testing.assert_close(logits[real], ref[real], rtol=0, atol=1e-5)
    assert model.cfg.position_offset == hf.config.pad_token_id + 1
    positions = {k: why for k, why in report.ignored.items() if "embed_positions" in k}
    assert len(positions) == 2 and all("checked equal" in why for why in positions.values())
    c = hf.config
    assert (model.cfg.heads("enc"), model.cfg.heads("cross")) == (c.encoder_attention_heads, c.decoder_attention_heads)
    assert (model.cfg.ffn_dim("enc"), model.cfg.ffn_dim("dec")) == (c.encoder_ffn_dim, c.decoder_ffn_dim)


@pytest.mark.parametrize("beam", [1, 5])
def test_greedy_and_beam_outputs_match_generate(beam):
    hf = eos_prone_fsmt(fsmt_model(seed=4), boost=4.0)
    model, _ = convert_fsmt(hf.state_dict(), hf.config.to_dict())
    src, _ = _batch(hf, batch=5)
    max_new = 20
    with torch.no_grad():
        ref = hf.generate(input_ids=src, attention_mask=(src != 1).long(), num_beams=beam, do_sample=False,
                          max_new_tokens=max_new, length_penalty=1.0, early_stopping=True)
    ours = greedy(model, src, max_len=max_new) if beam == 1 else beam_search(model, src, beam=beam, max_len=max_new)
    for i, hyp in enumerate(ours.best):
        expected = ref[i, 1:].tolist()
        expected = expected[: expected.index(hf.config.eos_token_id) + 1]
        assert len(expected) < max_new, "the test needs searches that end by EOS"
        assert hyp.tokens == expected, f"sentence {i}"


def test_tokenizer_matches_fsmt_tokenizer(tmp_path):
    from transformers import FSMTTokenizer

    vocab, _ = bpe_files(tmp_path)
    hf = fsmt_model(src_vocab_size=len(vocab), tgt_vocab_size=len(vocab))
    hf.save_pretrained(tmp_path)
    imported = import_fsmt(tmp_path)
    ref = FSMTTokenizer(langs=["en", "de"], src_vocab_file=str(tmp_path / "vocab-src.json"),
                        tgt_vocab_file=str(tmp_path / "vocab-tgt.json"), merges_file=str(tmp_path / "merges.txt"))
    for text in ["The cat sat on the mat.", "hello world, hello again", "news \u201cquoted\u201d - dashes-here"]:
        expected = ref(text).input_ids
        assert imported.src_tokenizer.encode(text) + [imported.model.cfg.eos_id] == expected, text
        assert imported.tgt_tokenizer.decode(expected) == ref.decode(expected, skip_special_tokens=True), text


def test_import_save_load_translate_identical(tmp_path):
    from workbench.checkpoint.format import load_checkpoint

    vocab, _ = bpe_files(tmp_path)
    eos_prone_fsmt(fsmt_model(src_vocab_size=len(vocab), tgt_vocab_size=len(vocab)), 2.0).save_pretrained(tmp_path)
    imported = import_fsmt(tmp_path)
    ck = load_checkpoint(imported.save(tmp_path / "ckpt"))
    assert ck.meta["source_format"] == "fsmt"
    text = "the dog sat in the park ."
    ids = torch.tensor([ck.src_tokenizer.encode(text) + [ck.config.eos_id]])
    a = beam_search(imported.model, ids, beam=3, max_len=10).best[0].tokens
    b = beam_search(ck.model, ids, beam=3, max_len=10).best[0].tokens
    assert a == b
    assert ck.tgt_tokenizer.decode(b) == imported.tgt_tokenizer.decode(a)

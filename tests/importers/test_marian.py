"""Hugging Face MarianMTModel -> workbench: same encoder output, logits, greedy and beam outputs."""

from __future__ import annotations

import pytest
import torch
from importer_helpers import PER_STACK, TARGET_SENTENCES, marian_model, padded_batch, write_marian_dir

from workbench.decoding.search import beam_search, greedy
from workbench.importers.marian import convert_marian, import_marian

pytest.importorskip("transformers", reason="the parity reference is transformers' MarianMTModel")

VARIANTS = {
    # deliberately odd: separate vocabularies of different odd sizes, untied output, 3+2 layers
    "separate_untied": {},
    "separate_tied": {"tie_word_embeddings": True},
    # opus-mt's usual layout: one shared vocabulary, everything tied
    "shared_tied": {"share_encoder_decoder_embeddings": True, "tie_word_embeddings": True, "vocab_size": 47},
    "relu_unscaled": {"activation_function": "relu", "scale_embedding": False},
    # one vocabulary, untied: transformers 5 keeps encoder, decoder and output matrices apart
    "shared_untied": {"share_encoder_decoder_embeddings": True, "tie_word_embeddings": False, "vocab_size": 47},
    "per_stack_sizes": PER_STACK,
    "per_stack_shared_tied": {**PER_STACK, "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
                              "vocab_size": 47},
}


def _convert(hf):
    return convert_marian(hf.state_dict(), hf.config.to_dict())


def _batch(hf):
    c = hf.config
    return padded_batch(src_vocab=c.vocab_size, tgt_vocab=c.decoder_vocab_size, pad=c.pad_token_id,
                        eos=c.eos_token_id, start=c.decoder_start_token_id, low=1)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_encoder_output_and_logits_match_transformers(variant):
    hf = marian_model(seed=3, **VARIANTS[variant])
    model, report = _convert(hf)
    src, tgt = _batch(hf)
    mask = src != hf.config.pad_token_id
    with torch.no_grad():
        ref_memory = hf.get_encoder()(input_ids=src, attention_mask=mask.long()).last_hidden_state
        ref = hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits
        memory = model.encode(src).memory
        logits = model(src, tgt)
    torch.testing.assert_close(memory[mask], ref_memory[mask], rtol=0, atol=1e-5)
    real = tgt != hf.config.pad_token_id
    torch.testing.assert_close(logits[real], ref[real], rtol=0, atol=1e-5)
    assert report.converted["output_proj.bias"] == "flatten(final_logits_bias)"
    c = hf.config
    assert (model.cfg.heads("enc"), model.cfg.heads("cross")) == (c.encoder_attention_heads, c.decoder_attention_heads)
    assert (model.cfg.ffn_dim("enc"), model.cfg.ffn_dim("dec")) == (c.encoder_ffn_dim, c.decoder_ffn_dim)


def test_shared_untied_file_with_equal_copies_imports_as_equal_copies():
    """What transformers 4 saved for a shared, untied opus-mt model: `shared`, encoder and decoder
    embed_tokens equal (one module), lm_head its own."""
    hf = marian_model(seed=3, **VARIANTS["shared_untied"])
    sd = dict(hf.state_dict())
    for key in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        sd[key] = sd["model.shared.weight"].clone()
    model, report = convert_marian(sd, hf.config.to_dict())
    assert model.cfg.tie_embeddings == "none" and model.cfg.src_vocab == model.cfg.tgt_vocab == 47
    assert torch.equal(model.src_embed.weight, model.tgt_embed.weight)
    assert torch.equal(model.output_proj.weight, sd["lm_head.weight"])
    assert report.ignored["model.shared.weight"] == "tied copy of model.encoder.embed_tokens.weight"
    assert any("equal copies" in note for note in report.notes)


def _eos_prone(hf, boost: float):
    """Make EOS likely enough that every hypothesis ends well before the length limit, so both
    searches stop by their own rules (HF forces EOS at max_length with score 0; we do not)."""
    with torch.no_grad():
        hf.final_logits_bias[0, hf.config.eos_token_id] += boost
    return hf


@pytest.mark.parametrize("beam", [1, 4])
def test_greedy_and_beam_outputs_match_generate(beam):
    hf = _eos_prone(marian_model(seed=5, **VARIANTS["shared_tied"]), boost=3.0)
    model, _ = _convert(hf)
    src, _ = _batch(hf)
    src = torch.cat([src, src.flip(0)])  # 6 sentences
    mask = src != hf.config.pad_token_id
    max_new = 20
    with torch.no_grad():
        ref = hf.generate(input_ids=src, attention_mask=mask.long(), num_beams=beam, do_sample=False,
                          max_new_tokens=max_new, length_penalty=1.0, early_stopping=True, num_return_sequences=1)
    if beam == 1:
        ours = greedy(model, src, max_len=max_new)
    else:
        ours = beam_search(model, src, beam=beam, length_penalty="average", alpha=1.0, max_len=max_new)
    for i, hyp in enumerate(ours.best):
        expected = ref[i, 1:].tolist()  # drop the decoder start token
        expected = expected[: expected.index(hf.config.eos_token_id) + 1]
        assert len(expected) < max_new, "the test needs searches that end by EOS"
        assert hyp.tokens == expected, f"sentence {i}"


def test_tokenizer_matches_marian_tokenizer(tmp_path):
    from transformers import MarianTokenizer

    write_marian_dir(tmp_path)
    imported = import_marian(tmp_path)
    ref = MarianTokenizer(str(tmp_path / "source.spm"), str(tmp_path / "target.spm"), str(tmp_path / "vocab.json"))
    for text in ["the cat sat on the mat .", ">>fr<< hello world", "unseen wörds zzz", ">>de<< a dog"]:
        expected = ref(text).input_ids
        assert imported.src_tokenizer.encode(text) + [imported.model.cfg.eos_id] == expected, text
        assert imported.tgt_tokenizer.decode(expected) == ref.decode(expected, skip_special_tokens=True).replace(
            ">>fr<< ", "").replace(">>de<< ", ""), text


def test_pieces_of_either_side_decode_as_marian_tokenizer_does(tmp_path):
    """A shared vocabulary holds pieces only the source sentencepiece model knows; an output may use them.
    MarianTokenizer decodes with the target model and turns any "▁" left into a space: so does the import."""
    from transformers import MarianTokenizer

    write_marian_dir(tmp_path, target_sentences=TARGET_SENTENCES)
    imported = import_marian(tmp_path)
    ref = MarianTokenizer(str(tmp_path / "source.spm"), str(tmp_path / "target.spm"), str(tmp_path / "vocab.json"))
    tok = imported.tgt_tokenizer
    source_only = [i for i, p in enumerate(tok.vocab) if p.startswith("\u2581") and tok.sp_decode.piece_to_id(p) == 0]
    assert len(source_only) >= 4  # pieces the target model does not know, as in the "▁look"
    g = torch.Generator().manual_seed(0)
    rows = [source_only[:2] * 2, source_only[1:4]]
    rows += [torch.randint(0, tok.vocab_size, (12,), generator=g).tolist() for _ in range(20)]
    for ids in rows:
        expected = ref.decode(ids, skip_special_tokens=True)
        for code in (">>fr<<", ">>de<<"):  # MarianTokenizer keeps language codes; the workbench drops them
            expected = expected.replace(code, "")
        got = tok.decode(ids)
        assert "\u2581" not in got, ids
        assert got.split() == expected.split(), ids


@pytest.mark.parametrize("sizes", ["uniform", "per_stack"])
def test_import_save_load_translate_identical(tmp_path, sizes):
    from workbench.checkpoint.format import load_checkpoint

    hf = write_marian_dir(tmp_path / "opus", **(PER_STACK if sizes == "per_stack" else {}))
    _eos_prone(hf, 0.0)
    imported = import_marian(tmp_path / "opus")
    out = imported.save(tmp_path / "ckpt")
    ck = load_checkpoint(out)
    assert ck.meta["source_format"] == "marian"
    assert ck.meta["generation"]["append_eos"] is True
    assert ck.config == imported.model.cfg
    assert ck.model.dec[0].cross_attn.n_heads == hf.config.decoder_attention_heads
    for name, tensor in imported.model.state_dict().items():
        assert torch.equal(tensor, ck.model.state_dict()[name]), name
    text = "the cat sat on the mat ."
    ids = torch.tensor([ck.src_tokenizer.encode(text) + [ck.config.eos_id]])
    assert ids.tolist() == [imported.src_tokenizer.encode(text) + [imported.model.cfg.eos_id]]
    a = beam_search(imported.model, ids, beam=3, max_len=8).best[0].tokens
    b = beam_search(ck.model, ids, beam=3, max_len=8).best[0].tokens
    assert a == b
    assert ck.tgt_tokenizer.decode(b) == imported.tgt_tokenizer.decode(a)


def test_cli_import_then_translate_equals_in_memory_import(tmp_path, capsys):
    from workbench.cli import main
    from workbench.decoding.translator import load as load_checkpoint_model
    from workbench.importers import load

    _eos_prone(write_marian_dir(tmp_path / "opus"), 0.0)
    assert main(["import", "marian", str(tmp_path / "opus"), "--out", str(tmp_path / "ckpt")]) == 0
    printed = capsys.readouterr().out
    assert "imported marian checkpoint" in printed and "tensors converted" in printed
    texts = ["the cat sat on the mat .", "hello world"]
    from_disk = load_checkpoint_model(tmp_path / "ckpt", max_len=8).translate(texts)
    in_memory = load(f"marian:{tmp_path / 'opus'}", max_len=8).translate(texts)
    assert from_disk == in_memory and len(from_disk) == 2


def test_hub_download_offline_says_network_unreachable(tmp_path, monkeypatch, capsys):
    from workbench.cli import main

    # a proxy on a closed local port: the request fails the way it does without a network
    for var in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    for var in ("no_proxy", "NO_PROXY", "HF_ENDPOINT"):  # the machine's own settings must not change the route
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    code = main(["import", "marian", "hf:Helsinki-NLP/opus-mt-en-de", "--out", str(tmp_path / "ckpt")])
    err = capsys.readouterr().err
    assert code == 3
    assert "network unreachable" in err and "huggingface.co/Helsinki-NLP/opus-mt-en-de" in err
    assert not (tmp_path / "ckpt").exists()


def test_imported_checkpoint_opens_in_a_fresh_process(tmp_path):
    """A new process that never imported workbench.importers still finds the Marian tokenizer kind."""
    import subprocess
    import sys

    write_marian_dir(tmp_path / "opus")
    out = import_marian(tmp_path / "opus").save(tmp_path / "ckpt")
    code = "import sys, workbench; print(len(workbench.load(sys.argv[1]).translate(['the cat sat .'])))"
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"

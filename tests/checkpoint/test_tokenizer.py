import json

import pytest

from workbench.checkpoint.tokenizer import SentencePieceTokenizer, Tokenizer, check_special_ids, load_tokenizer

SENTENCES = [
    "Ein Mann fährt ein rotes Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau liest ein Buch im Park.",
    "Kinder spielen Fußball auf einer Wiese.",
    "Ein Hund läuft über den Strand.",
] * 20


@pytest.fixture(scope="module")
def spm_tok():
    return SentencePieceTokenizer.train(sentences=SENTENCES, vocab_size=300, model_type="unigram")


def test_special_ids_agree_with_model_config(spm_tok, tiny_config):
    assert isinstance(spm_tok, Tokenizer)
    assert (spm_tok.pad_id, spm_tok.bos_id, spm_tok.eos_id, spm_tok.unk_id) == (0, 1, 2, 3)
    check_special_ids(spm_tok, tiny_config.__class__(src_vocab=300, tgt_vocab=300), "src")
    with pytest.raises(ValueError, match="src_vocab is 50"):
        check_special_ids(spm_tok, tiny_config, "src")


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_round_trip_and_unseen_characters(model_type):
    tok = SentencePieceTokenizer.train(sentences=SENTENCES, vocab_size=300, model_type=model_type)
    for text in ["Zwei Hunde spielen im Park.", "漢字 and ☃ were never seen", "Ωmega ünïcödé"]:
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text  # byte fallback makes unseen characters round-trip
    pieces = tok.pieces(tok.encode("Ein Mann"))
    assert pieces[0].startswith("▁")


def test_without_byte_fallback_unseen_becomes_unk():
    tok = SentencePieceTokenizer.train(sentences=SENTENCES, vocab_size=60, byte_fallback=False)
    ids = tok.encode("☃")
    assert tok.unk_id in ids


def test_decode_skips_specials_and_rejects_out_of_range(spm_tok):
    ids = spm_tok.encode("Ein Hund")
    assert spm_tok.decode([spm_tok.bos_id, *ids, spm_tok.eos_id, spm_tok.pad_id]) == "Ein Hund"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        spm_tok.decode([spm_tok.vocab_size])


def test_training_is_deterministic(tmp_path):
    a = SentencePieceTokenizer.train(sentences=SENTENCES, vocab_size=300)
    b = SentencePieceTokenizer.train(sentences=SENTENCES, vocab_size=300)
    assert a.proto == b.proto
    f = tmp_path / "corpus.txt"
    f.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    c = SentencePieceTokenizer.train(f, vocab_size=300)
    assert c.proto == a.proto  # a file and the same sentences in memory give the same model


def test_save_load_via_spec(spm_tok, tmp_path):
    spec = spm_tok.save(tmp_path, "src")
    json.dumps(spec)
    again = load_tokenizer(tmp_path, spec)
    text = "Kinder lesen ein Buch."
    assert again.encode(text) == spm_tok.encode(text)
    with pytest.raises(ValueError, match="unknown tokenizer kind 'moses'"):
        load_tokenizer(tmp_path, {"kind": "moses"})
    (tmp_path / "bad.spm.model").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="bad.spm.model"):
        load_tokenizer(tmp_path, {"kind": "sentencepiece", "file": "bad.spm.model"})

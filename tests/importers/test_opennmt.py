"""OpenNMT-py v1/v2/v3 checkpoints -> workbench: same encoder output and logits as OpenNMT-py's
forward (onmt_reference.py, transcribed from its source; scripts/check_opennmt_parity.py runs the
same comparison against the real library when it is installed)."""

from __future__ import annotations

import argparse
import functools
from collections import defaultdict

import pytest
import torch
from importer_helpers import SENTENCES, foreign_class, foreign_modules, train_spm
from onmt_reference import forward, random_state

from workbench.decoding.search import beam_search
from workbench.importers.opennmt import convert_opennmt, import_opennmt

SPECIALS = ["<unk>", "<blank>", "<s>", "</s>"]
SRC_V, TGT_V = 37, 41


def _opt(**changes):
    return argparse.Namespace(**{"heads": 4, "transformer_ff": 24, "position_encoding": True, "hidden_size": 16,
                                 "share_embeddings": False, "share_decoder_embeddings": False, **changes})


def _itos(n: int, prefix: str) -> list[str]:
    return SPECIALS + [f"{prefix}{i}" for i in range(n - len(SPECIALS))]


def _v2_vocab(src_itos, tgt_itos):
    """OpenNMT-py 2.x: {"src": TextMultiField([("src", Field)]), ...}, each Field holding a torchtext Vocab
    whose stoi is a defaultdict(torchtext.vocab._default_unk_index)."""
    vocab_cls = foreign_class("torchtext.vocab.Vocab")
    field_cls = foreign_class("torchtext.data.field.Field")
    multi_cls = foreign_class("onmt.inputters.text_dataset.TextMultiField")
    unk_index = foreign_class("torchtext.vocab._default_unk_index")
    tokenize = foreign_class("onmt.inputters.text_dataset._feature_tokenize")
    classes = (vocab_cls, field_cls, multi_cls, unk_index, tokenize)

    def field(itos, name):
        v = vocab_cls()
        v.itos, v.stoi = itos, defaultdict(unk_index, {t: i for i, t in enumerate(itos)})
        f = field_cls()
        f.vocab, f.dtype, f.pad_token = v, torch.int64, "<blank>"
        f.tokenize = functools.partial(tokenize, layer=0, feat_delim=None, truncate=None)
        m = multi_cls()
        m.base_name, m.fields = name, [(name, f)]
        return m

    return classes, {"src": field(src_itos, "src"), "tgt": field(tgt_itos, "tgt")}


def _checkpoint(version: str, *, qkv_bias=True, pe="SinusoidalInterleaved", shared=False):
    vocab_t = TGT_V if not shared else SRC_V
    sd, gen = random_state(src_vocab=SRC_V, tgt_vocab=vocab_t, d=16, d_ff=24, enc=3, dec=2, qkv_bias=qkv_bias, pe=pe)
    src_itos, tgt_itos = _itos(SRC_V, "s"), _itos(vocab_t, "t" if not shared else "s")
    opt = _opt(position_encoding_type=pe, add_qkvbias=qkv_bias)
    if shared:  # -share_embeddings -share_decoder_embeddings: one table for encoder, decoder and generator
        table = sd["encoder.embeddings.make_embedding.emb_luts.0.weight"]
        sd["decoder.embeddings.make_embedding.emb_luts.0.weight"] = gen["weight"] = table
        opt = _opt(position_encoding_type=pe, share_embeddings=True, share_decoder_embeddings=True)
    ckpt = {"model": sd, "generator": gen, "opt": opt, "vocab": {"src": src_itos, "tgt": tgt_itos}}
    if version in ("v2", "v1"):
        ckpt["generator"] = {"0." + k: v for k, v in gen.items()}
    if version == "v1":  # OpenNMT-py 0.x: custom LayerNorm a_2/b_2 and per-layer causal-mask buffers
        ckpt["model"] = {k.replace("layer_norm.weight", "layer_norm.a_2").replace("layer_norm.bias", "layer_norm.b_2"):
                         v for k, v in sd.items()}
        for j in range(2):
            mask = torch.triu(torch.ones(1, 64, 64, dtype=torch.uint8), 1)
            ckpt["model"][f"decoder.transformer_layers.{j}.mask"] = mask
    return ckpt, sd, gen


CASES = {
    "v3_no_qkv_bias": dict(version="v3", qkv_bias=False),
    "v3_concat_positions": dict(version="v3", pe="SinusoidalConcat"),
    "v2": dict(version="v2"),
    "v2_shared_tied": dict(version="v2", shared=True),
    "v1": dict(version="v1"),
}


def _batch(tgt_vocab):
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, SRC_V, (3, 7), generator=g)
    src[0, 5:] = 1  # OpenNMT sources carry no </s>: padding follows the last word
    tgt = torch.randint(4, tgt_vocab, (3, 6), generator=g)
    tgt[:, 0] = 2
    tgt[1, 4:] = 1
    return src, tgt


@pytest.mark.parametrize("case", sorted(CASES))
def test_encoder_output_and_logits_match_opennmt_forward(case):
    kw = dict(CASES[case])
    ckpt, sd, gen = _checkpoint(**kw)
    model, report, _, _ = convert_opennmt(ckpt)
    src, tgt = _batch(model.cfg.tgt_vocab)
    with torch.no_grad():
        ref_memory, ref = forward(sd, gen, src, tgt, heads=4, pad=1)
        memory, logits = model.encode(src).memory, model(src, tgt)
    torch.testing.assert_close(memory[src != 1], ref_memory[src != 1], rtol=0, atol=2e-5)
    torch.testing.assert_close(logits[tgt != 1], ref[tgt != 1], rtol=0, atol=2e-5)
    assert model.cfg.layer_norm_eps == 1e-6 and model.cfg.norm_first and model.cfg.start_id == 2
    if not kw.get("qkv_bias", True):
        assert report.converted["enc.0.self_attn.q_proj.bias"] == "zeros(16,)()"


def test_v2_pickled_torchtext_fields_load_without_torchtext(tmp_path):
    ckpt, sd, gen = _checkpoint("v2")
    classes, vocab = _v2_vocab(ckpt["vocab"]["src"], ckpt["vocab"]["tgt"])
    with foreign_modules(*classes):
        torch.save({**ckpt, "vocab": vocab, "optim": {"step": 3}}, tmp_path / "model.pt")
    (tmp_path / "sentencepiece.model").write_bytes(train_spm())
    imported = import_opennmt(tmp_path)
    src, tgt = _batch(TGT_V)
    with torch.no_grad():
        ours, ref = imported.model(src, tgt), forward(sd, gen, src, tgt, heads=4, pad=1)[1]
    torch.testing.assert_close(ours[tgt != 1], ref[tgt != 1], rtol=0, atol=2e-5)
    assert imported.src_tokenizer.vocab[:4] == SPECIALS
    assert imported.generation["append_eos"] is False


def test_v1_checkpoint_with_pickled_optimizer_object_loads(tmp_path):
    """OpenNMT-py 0.x saved (name, Vocab) pairs and the Optimizer object wrapping torch.optim.Adam."""
    ckpt, sd, gen = _checkpoint("v1")
    vocab_cls = foreign_class("torchtext.vocab.Vocab")
    optim_cls = foreign_class("onmt.utils.optimizers.Optimizer")

    def vocab(itos):
        v = vocab_cls()
        v.itos, v.stoi, v.freqs = itos, {t: i for i, t in enumerate(itos)}, None
        return v

    optim = optim_cls()
    optim.optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=2.0)
    optim.method, optim.lr, optim._step = "adam", 2.0, 100
    with foreign_modules(vocab_cls, optim_cls):
        torch.save({**ckpt, "vocab": [("src", vocab(ckpt["vocab"]["src"])), ("tgt", vocab(ckpt["vocab"]["tgt"]))],
                    "optim": optim, "epoch": 10}, tmp_path / "model.pt", _use_new_zipfile_serialization=False)
    imported = import_opennmt(tmp_path / "model.pt")
    src, tgt = _batch(TGT_V)
    with torch.no_grad():
        ours, ref = imported.model(src, tgt), forward(sd, gen, src, tgt, heads=4, pad=1)[1]
    torch.testing.assert_close(ours[tgt != 1], ref[tgt != 1], rtol=0, atol=2e-5)
    assert any("a_2/b_2" in n for n in imported.report.notes)
    assert imported.src_tokenizer is None  # no sentencepiece model beside it: ids only, and the report says so
    assert any("no sentencepiece" in n for n in imported.report.notes)


def test_import_with_sentencepiece_save_load_translate_identical(tmp_path):
    import sentencepiece as spm

    from workbench.checkpoint.format import load_checkpoint

    proto = train_spm()
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(proto)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.id_to_piece(i) not in ("<unk>",)]
    itos = SPECIALS + pieces
    sd, gen = random_state(src_vocab=len(itos), tgt_vocab=len(itos), d=16, d_ff=24, enc=2, dec=3, seed=4)
    gen["bias"][3] += 2.0  # </s> likely, so the search ends by itself
    torch.save({"model": sd, "generator": gen, "opt": _opt(), "vocab": {"src": itos, "tgt": itos}}, tmp_path / "m.pt")
    (tmp_path / "sentencepiece.model").write_bytes(proto)
    imported = import_opennmt(tmp_path / "m.pt")
    text = SENTENCES[0]
    ids = imported.src_tokenizer.encode(text)
    assert ids == [itos.index(p) for p in sp.encode(text, out_type=str)]  # no </s>: OpenNMT adds none
    ck = load_checkpoint(imported.save(tmp_path / "ckpt"))
    src = torch.tensor([ids])
    a = beam_search(imported.model, src, beam=3, max_len=12, length_penalty="none").best[0].tokens
    b = beam_search(ck.model, src, beam=3, max_len=12, length_penalty="none").best[0].tokens
    assert a == b and ck.tgt_tokenizer.decode(b) == imported.tgt_tokenizer.decode(a)
    assert ck.meta["generation"]["append_eos"] is False

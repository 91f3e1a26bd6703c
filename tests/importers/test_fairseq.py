"""fairseq transformer checkpoints -> workbench, checked against FSMT (transformers' port of fairseq's
transformer) holding the same weights, in both the 2018 layout (fused in_proj_weight,
layer_norms.{0,1,2}, embed_out) and the current one."""

from __future__ import annotations

import argparse

import pytest
import torch
from importer_helpers import (
    PER_STACK,
    SENTENCES,
    eos_prone_fsmt,
    foreign_class,
    foreign_modules,
    fsmt_model,
    fsmt_to_fairseq,
    padded_batch,
)

from workbench.decoding.search import beam_search
from workbench.importers.errors import ConversionError
from workbench.importers.fairseq import convert_fairseq, import_fairseq

pytest.importorskip("transformers", reason="the parity reference is transformers' FSMT")


def _args(hf, **changes) -> argparse.Namespace:
    c = hf.config
    return argparse.Namespace(**{
        "arch": "transformer_vaswani_wmt_en_de_big", "encoder_embed_dim": c.d_model, "decoder_embed_dim": c.d_model,
        "encoder_attention_heads": c.encoder_attention_heads, "decoder_attention_heads": c.decoder_attention_heads,
        "encoder_ffn_embed_dim": c.encoder_ffn_dim, "decoder_ffn_embed_dim": c.decoder_ffn_dim,
        "encoder_normalize_before": False, "decoder_normalize_before": False, "activation_fn": "relu",
        "max_source_positions": c.max_position_embeddings, "max_target_positions": c.max_position_embeddings,
        "share_all_embeddings": bool(c.tie_word_embeddings), "share_decoder_input_output_embed": False,
        "source_lang": "en", "target_lang": "de", "dropout": 0.3, **changes})


def _batch(hf):
    c = hf.config
    return padded_batch(src_vocab=c.src_vocab_size, tgt_vocab=c.tgt_vocab_size, pad=1, eos=2, start=2, low=4)


@pytest.mark.parametrize("layout", ["2018_fused", "current"])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("sizes", ["uniform", "per_stack"])
def test_logits_match_fsmt_reference(layout, tied, sizes):
    hf = fsmt_model(seed=7, **({"src_vocab_size": 47, "tie_word_embeddings": True} if tied else {}),
                    **(PER_STACK if sizes == "per_stack" else {}))
    old = layout == "2018_fused"
    sd = fsmt_to_fairseq(hf.state_dict(), fused=old, old_norms=old)
    if tied:  # a shared-embedding fairseq model stores no separate output projection
        sd.pop("decoder.embed_out" if old else "decoder.output_projection.weight")
    model, report = convert_fairseq(sd, vars(_args(hf)))
    src, tgt = _batch(hf)
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=(src != 1).long(), decoder_input_ids=tgt, use_cache=False).logits
        ref_memory = hf.model.encoder(src, attention_mask=(src != 1).long()).last_hidden_state
        logits, memory = model(src, tgt), model.encode(src).memory
    torch.testing.assert_close(memory[src != 1], ref_memory[src != 1], rtol=0, atol=1e-5)
    torch.testing.assert_close(logits[tgt != 1], ref[tgt != 1], rtol=0, atol=1e-5)
    if old:
        assert report.converted["dec.1.cross_attn.v_proj.weight"] == (
            "chunk2/3(decoder.layers.1.encoder_attn.in_proj_weight)")
        assert report.converted["dec.0.cross_attn_norm.bias"] == "decoder.layers.0.layer_norms.1.bias"
    assert (model.cfg.heads("enc"), model.cfg.heads("cross")) == (hf.config.encoder_attention_heads,
                                                                   hf.config.decoder_attention_heads)
    assert model.cfg.ffn_dim("dec") == hf.config.decoder_ffn_dim


def _write_fairseq_dir(directory, hf):
    """model.pt as fairseq 0.6 saved it (args Namespace, optimizer history, meters in extra_state),
    dict.en.txt / dict.de.txt and subword-nmt bpecodes."""
    import io

    from subword_nmt.learn_bpe import learn_bpe

    codes = io.StringIO()
    learn_bpe(io.StringIO("\n".join(SENTENCES * 2)), codes, 50, min_frequency=1)
    (directory / "bpecodes").write_text(codes.getvalue(), encoding="utf-8")
    from subword_nmt.apply_bpe import BPE

    bpe = BPE(io.StringIO(codes.getvalue()))
    tokens = sorted({t for s in SENTENCES for t in bpe.process_line(s).split()})
    vocab_size = 4 + len(tokens)
    for lang in ("en", "de"):
        (directory / f"dict.{lang}.txt").write_text("".join(f"{t} 5\n" for t in tokens), encoding="utf-8")
    return vocab_size, bpe


def test_model_pt_import_translates_like_the_reference(tmp_path):
    vocab, bpe = _write_fairseq_dir(tmp_path, None)
    hf = eos_prone_fsmt(fsmt_model(seed=9, src_vocab_size=vocab, tgt_vocab_size=vocab), boost=3.0)
    sd = fsmt_to_fairseq(hf.state_dict(), fused=True, old_norms=True)
    # a fairseq 0.6 training meter in extra_state, pickled under its real name without fairseq installed
    meter = foreign_class("fairseq.meters.AverageMeter")
    with foreign_modules(meter):
        m = meter()
        m.val, m.avg, m.count = 0.5, 0.5, 2
        # the pre-1.6 (non-zip) serialization, as the 2018 "Scaling NMT" files were written
        torch.save({"args": _args(hf), "model": sd, "optimizer_history": [{"num_updates": 10}],
                    "extra_state": {"train_meters": {"loss": m}}}, tmp_path / "model.pt",
                   _use_new_zipfile_serialization=False)
    imported = import_fairseq(tmp_path)
    assert imported.generation["length_penalty"] == {"kind": "average", "alpha": 1.0}
    assert "extra_state" in imported.report.ignored
    text = "the cat sat on the mat ."
    from sacremoses import MosesTokenizer

    words = MosesTokenizer(lang="en").tokenize(text, aggressive_dash_splits=True, return_str=True, escape=True)
    expected = [imported.src_tokenizer.index[t] for t in bpe.process_line(words).split()]
    assert imported.src_tokenizer.encode(text) == expected  # Moses + subword-nmt, the fairseq recipe
    src = torch.tensor([expected + [2]])
    with torch.no_grad():
        ref = hf.generate(input_ids=src, num_beams=4, max_new_tokens=20, length_penalty=1.0, early_stopping=True)
    ours = beam_search(imported.model, src, beam=4, max_len=20).best[0].tokens
    assert ours == ref[0, 1:].tolist()[: len(ours)] and ours[-1] == 2
    ck_dir = imported.save(tmp_path / "ckpt")
    from workbench.checkpoint.format import load_checkpoint

    ck = load_checkpoint(ck_dir)
    assert beam_search(ck.model, src, beam=4, max_len=20).best[0].tokens == ours
    assert ck.tgt_tokenizer.decode(ours) == imported.tgt_tokenizer.decode(ours)


def test_missing_and_extra_keys_are_named():
    hf = fsmt_model(seed=1)
    sd = fsmt_to_fairseq(hf.state_dict(), fused=False, old_norms=False)
    missing = dict(sd)
    del missing["decoder.layers.1.fc2.bias"]
    with pytest.raises(ConversionError, match=r"missing key 'decoder\.layers\.1\.fc2\.bias'"):
        convert_fairseq(missing, vars(_args(hf)))
    extra = {**sd, "decoder.layers.1.adapter.weight": torch.zeros(3)}
    with pytest.raises(ConversionError, match=r"unexpected key 'decoder\.layers\.1\.adapter\.weight'"):
        convert_fairseq(extra, vars(_args(hf)))
    wrong = {**sd, "encoder.layers.0.fc1.weight": torch.zeros(5, 16)}
    with pytest.raises(ConversionError, match=r"shape mismatch .*enc\.0\.ffn\.up_proj\.weight.*\(5, 16\)"):
        convert_fairseq(wrong, vars(_args(hf)))

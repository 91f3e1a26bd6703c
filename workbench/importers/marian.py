"""Hugging Face MarianMTModel (Helsinki-NLP opus-mt) -> workbench checkpoint.

What HF Marian is, in our config's words (read from transformers' modeling_marian.py):
post-norm layers with no final stack norms and no embedding norm; [sin | cos] positional halves
with the paper's frequencies, positions counted from 0 (`sinusoidal_halves`, offset 0);
embeddings scaled by sqrt(d) when config.scale_embedding (opus-mt: true); swish FFN;
`final_logits_bias` added to the logits (our `output_bias`); layer-norm eps 1e-5; the decoder
starts from the pad token (whose embedding row is zero) and sources end with `</s>`; the encoder
and decoder may have their own head counts and FFN widths (our enc/dec_heads, enc/dec_d_ff).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..core.config import ModelConfig
from .hf import bart_family_sizes, generation_defaults, layer_table, position_tables, read_folder
from .keymap import Source, build_model, check_aliases, convert, copy, first_present, flatten, target_state
from .result import Imported, ImportReport
from .tokenizers import marian_tokenizers

SHARED = "model.shared.weight"
ENC_EMB, DEC_EMB = "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"


def marian_config(hf: dict[str, Any], *, unk_id: int = 1) -> ModelConfig:
    """Our config for a MarianConfig dict (config.json)."""
    shared = hf.get("share_encoder_decoder_embeddings", True)
    tied = hf.get("tie_word_embeddings", True)
    src_vocab = hf["vocab_size"]
    tgt_vocab = src_vocab if shared else (hf.get("decoder_vocab_size") or src_vocab)
    pad = hf["pad_token_id"]
    return ModelConfig(
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        **bart_family_sizes(hf, default_activation="gelu"),
        positions="sinusoidal_halves",
        position_offset=0,
        max_positions=hf.get("max_position_embeddings", 512),
        scale_embedding=bool(hf.get("scale_embedding", False)),
        tie_embeddings="all" if shared and tied else "decoder" if tied else "none",
        output_bias=True,
        pad_id=pad,
        bos_id=pad,  # Marian has no <s>; the decoder starts from pad
        eos_id=hf["eos_token_id"],
        unk_id=unk_id,
        decoder_start_id=hf.get("decoder_start_token_id", pad),
    )


def convert_marian(
    sd: dict[str, torch.Tensor], hf: dict[str, Any], *, source: str = "<state dict>", unk_id: int = 1
) -> tuple[Any, ImportReport]:
    """Our Transformer from a MarianMTModel state dict and its config dict."""
    cfg = marian_config(hf, unk_id=unk_id)
    report = ImportReport("marian", source)
    sd = dict(sd)
    if "final_logits_bias" not in sd:
        # transformers itself fills a missing bias with zeros (_keys_to_ignore_on_load_missing)
        sd["final_logits_bias"] = torch.zeros(1, cfg.tgt_vocab)
        report.notes.append("final_logits_bias absent from the file: zeros, as transformers does")
    shared = hf.get("share_encoder_decoder_embeddings", True)
    tied = cfg.tie_embeddings != "none"
    src_key = first_present(sd, ENC_EMB, SHARED)
    if shared and tied:
        tgt_key = out_key = src_key
        ignore = check_aliases(sd, src_key, [SHARED, ENC_EMB, DEC_EMB, "lm_head.weight"])
    elif shared:
        # transformers 4 keeps one `shared` matrix for both stacks and saves equal copies; transformers 5
        # without tie_word_embeddings uses encoder and decoder embed_tokens as they are: reading each
        # stack's own matrix reproduces both
        tgt_key, out_key = first_present(sd, DEC_EMB, SHARED), first_present(sd, "lm_head.weight")
        ignore = {}
        if SHARED in sd and SHARED not in (src_key, tgt_key):
            same = [k for k in (src_key, tgt_key) if torch.equal(sd[SHARED], sd[k])]
            ignore[SHARED] = (f"tied copy of {same[0]}" if same else
                              "not read by MarianModel's forward when tie_word_embeddings is false (transformers 5)")
        copies = "equal copies" if torch.equal(sd[src_key], sd[tgt_key]) else "their own matrices"
        report.notes.append(f"shared vocabulary, untied embeddings: encoder and decoder embeddings are {copies} "
                            "and the output projection is lm_head (tie_embeddings=none)")
    else:
        tgt_key = first_present(sd, DEC_EMB)
        out_key = tgt_key if tied else first_present(sd, "lm_head.weight")
        ignore = check_aliases(sd, src_key, [SHARED])
        if tied:
            ignore.update(check_aliases(sd, tgt_key, ["lm_head.weight"]))
    table: dict[str, Source] = {
        "src_embed.weight": copy(src_key),
        "tgt_embed.weight": copy(tgt_key),
        "output_proj.weight": copy(out_key),
        "output_proj.bias": flatten("final_logits_bias"),
    }
    table.update(layer_table(cfg.enc_layers, cfg.dec_layers))
    ignore.update(position_tables(sd, cfg))
    converted = convert(sd, table, target_state(cfg), ignore=ignore, report=report)
    return build_model(cfg, converted), report


def forbidden_ids(hf: dict[str, Any], gen: dict[str, Any] | None) -> list[int]:
    """Single-token bad_words_ids (opus-mt forbids <pad>); recorded in meta, not applied by our search."""
    merged = {**hf, **(gen or {})}
    return [ids[0] for ids in (merged.get("bad_words_ids") or []) if len(ids) == 1]


def import_marian(directory: str | Path) -> Imported:
    """Convert a local opus-mt directory (config.json, weights, source.spm/target.spm, vocab.json)."""
    folder = read_folder(directory, "marian", "Marian")
    hf, gen = folder.config, folder.generation
    tokenizers = None
    if (folder.directory / "source.spm").is_file():
        tokenizers = marian_tokenizers(folder.directory, hf)
    unk = tokenizers[0].unk_id if tokenizers else 1
    model, report = convert_marian(folder.state_dict(), hf, source=str(folder.weights), unk_id=unk)
    if tokenizers is None:
        report.notes.append("no source.spm/target.spm/vocab.json: imported without tokenizers (ids only)")
    imported = Imported(model, report, generation=generation_defaults(hf, gen, beam=1))
    forbid = forbidden_ids(hf, gen)
    if forbid:
        imported.extra["forbid_ids"] = forbid
        pad = model.cfg.pad_id
        others = [i for i in forbid if i != pad]
        # workbench search never generates the padding id, which is all opus-mt bans
        report.notes.append(f"the original forbids ids {forbid} during generation (bad_words_ids); "
                            + (f"workbench decoding never generates the padding id {pad}" if not others else
                               f"workbench decoding bans the padding id {pad} but not {others}"))
    if tokenizers:
        imported.src_tokenizer, imported.tgt_tokenizer = tokenizers
    return imported

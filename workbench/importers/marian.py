"""Hugging Face MarianMTModel (Helsinki-NLP opus-mt) -> workbench checkpoint.

What HF Marian is, in our config's words (read from transformers' modeling_marian.py):
post-norm layers with no final stack norms and no embedding norm; [sin | cos] positional halves
with the paper's frequencies, positions counted from 0 (`sinusoidal_halves`, offset 0);
embeddings scaled by sqrt(d) when config.scale_embedding (opus-mt: true); swish FFN;
`final_logits_bias` added to the logits (our `output_bias`); layer-norm eps 1e-5; the decoder
starts from the pad token (whose embedding row is zero) and sources end with `</s>`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..config import ModelConfig
from ..embedding import sinusoidal_positions
from .common import (
    ConversionError,
    Imported,
    ImportReport,
    Source,
    build_model,
    check_aliases,
    check_table,
    convert,
    copy,
    fairseq_layers,
    first_present,
    flatten,
    read_json,
    read_state_dict,
    target_state,
)

ACTIVATIONS = {"swish": "swish", "silu": "silu", "relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh"}
ENC, DEC = "model.encoder.layers.", "model.decoder.layers."


def marian_config(hf: dict[str, Any], *, unk_id: int = 1) -> ModelConfig:
    """Our config for a MarianConfig dict (config.json)."""
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if hf.get(a) != hf.get(b):
            raise ConversionError(
                f"config.json: {a} ({hf.get(a)}) != {b} ({hf.get(b)}); the workbench model needs one value"
            )
    act = hf.get("activation_function", "gelu")
    if act not in ACTIVATIONS:
        raise ConversionError(f"config.json: activation_function {act!r} is not supported ({sorted(ACTIVATIONS)})")
    shared = hf.get("share_encoder_decoder_embeddings", True)
    tied = hf.get("tie_word_embeddings", True)
    src_vocab = hf["vocab_size"]
    tgt_vocab = src_vocab if shared else (hf.get("decoder_vocab_size") or src_vocab)
    pad = hf["pad_token_id"]
    return ModelConfig(
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        d_model=hf["d_model"],
        n_heads=hf["encoder_attention_heads"],
        d_ff=hf["encoder_ffn_dim"],
        enc_layers=hf["encoder_layers"],
        dec_layers=hf["decoder_layers"],
        dropout=float(hf.get("dropout", 0.1)),
        attn_dropout=float(hf.get("attention_dropout", 0.0)),
        act_dropout=float(hf.get("activation_dropout", 0.0)),
        activation=ACTIVATIONS[act],  # type: ignore[arg-type]
        norm_first=False,
        enc_final_norm=False,
        dec_final_norm=False,
        layer_norm_eps=1e-5,
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
    src_key = first_present(sd, "model.encoder.embed_tokens.weight", "model.shared.weight")
    tgt_key = src_key if shared else first_present(sd, "model.decoder.embed_tokens.weight")
    out_key = tgt_key if cfg.tie_embeddings != "none" else first_present(sd, "lm_head.weight")
    table: dict[str, Source] = {
        "src_embed.weight": copy(src_key),
        "tgt_embed.weight": copy(tgt_key),
        "output_proj.weight": copy(out_key),
        "output_proj.bias": flatten("final_logits_bias"),
    }
    table.update(fairseq_layers(ENC, DEC, cfg.enc_layers, cfg.dec_layers))
    ignore = check_aliases(sd, src_key, ["model.shared.weight", "model.encoder.embed_tokens.weight"] if shared else [])
    ignore.update(check_aliases(sd, tgt_key, ["model.decoder.embed_tokens.weight"] if shared else []))
    if cfg.tie_embeddings != "none":
        ignore.update(check_aliases(sd, tgt_key, ["lm_head.weight"]))
    if shared and cfg.tie_embeddings == "none":
        report.notes.append("shared but untied embeddings: encoder and decoder get equal copies (tie_embeddings=none)")
    for side in ("encoder", "decoder"):
        key = f"model.{side}.embed_positions.weight"
        if key in sd:
            table_ = sinusoidal_positions(sd[key].size(0), cfg.d_model, "sinusoidal_halves")
            ignore[key] = check_table(sd, key, table_, "sinusoidal_halves")
    converted = convert(sd, table, target_state(cfg), ignore=ignore, report=report)
    return build_model(cfg, converted), report


def generation_defaults(hf: dict[str, Any], gen: dict[str, Any] | None) -> dict[str, Any]:
    """Decoding settings as transformers' generate() would use them for this model."""
    merged = {**hf, **(gen or {})}
    max_length = merged.get("max_length")
    return {
        "append_eos": True,
        "beam": int(merged.get("num_beams", 1) or 1),
        "length_penalty": {"kind": "average", "alpha": float(merged.get("length_penalty", 1.0))},
        # HF's max_length counts the decoder start token
        "max_len": None if max_length is None else int(max_length) - 1,
    }


def forbidden_ids(hf: dict[str, Any], gen: dict[str, Any] | None) -> list[int]:
    """Single-token bad_words_ids (opus-mt forbids <pad>); recorded in meta, not applied by our search."""
    merged = {**hf, **(gen or {})}
    return [ids[0] for ids in (merged.get("bad_words_ids") or []) if len(ids) == 1]


def import_marian(directory: str | Path) -> Imported:
    """Convert a local opus-mt directory (config.json, weights, source.spm/target.spm, vocab.json)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"Marian source must be a directory with config.json, got {directory}")
    hf = read_json(directory / "config.json")
    if hf.get("model_type") not in (None, "marian"):
        raise ConversionError(f"{directory / 'config.json'} describes a {hf.get('model_type')!r} model, not marian")
    weights = _weights_file(directory)
    tokenizers = None
    if (directory / "source.spm").is_file():
        from .tokenizers import marian_tokenizers

        tokenizers = marian_tokenizers(directory, hf)
    unk = tokenizers[0].unk_id if tokenizers else 1
    model, report = convert_marian(read_state_dict(weights), hf, source=str(weights), unk_id=unk)
    gen_file = directory / "generation_config.json"
    gen = read_json(gen_file) if gen_file.is_file() else None
    if tokenizers is None:
        report.notes.append("no source.spm/target.spm/vocab.json: imported without tokenizers (ids only)")
    imported = Imported(model, report, generation=generation_defaults(hf, gen))
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


def _weights_file(directory: Path) -> Path:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(f"{directory} has neither model.safetensors nor pytorch_model.bin")

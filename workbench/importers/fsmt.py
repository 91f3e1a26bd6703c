"""Hugging Face FSMTForConditionalGeneration (facebook/wmt19-*) -> workbench checkpoint.

FSMT is transformers' port of fairseq's transformer (read from modeling_fsmt.py): post-norm,
no final stack norms, relu, eps 1e-5, embeddings x sqrt(d), tensor2tensor [sin | cos] positions
numbered from padding_idx + 1 (`sinusoidal_t2t`, position_offset = pad + 1), separate source and
target vocabularies, an untied output projection, decoder start `</s>`, sources end with `</s>`.
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
    read_json,
    read_state_dict,
    target_state,
)
from .marian import ACTIVATIONS

ENC, DEC = "model.encoder.layers.", "model.decoder.layers."


def fsmt_config(hf: dict[str, Any]) -> ModelConfig:
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if hf.get(a) != hf.get(b):
            raise ConversionError(
                f"config.json: {a} ({hf.get(a)}) != {b} ({hf.get(b)}); the workbench model needs one value"
            )
    act = hf.get("activation_function", "relu")
    if act not in ACTIVATIONS:
        raise ConversionError(f"config.json: activation_function {act!r} is not supported ({sorted(ACTIVATIONS)})")
    pad = hf.get("pad_token_id", 1)
    return ModelConfig(
        src_vocab=hf["src_vocab_size"],
        tgt_vocab=hf["tgt_vocab_size"],
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
        positions="sinusoidal_t2t",
        position_offset=pad + 1,
        max_positions=hf.get("max_position_embeddings", 1024),
        scale_embedding=bool(hf.get("scale_embedding", True)),
        tie_embeddings="all" if hf.get("tie_word_embeddings", False) else "none",
        output_bias=False,
        pad_id=pad,
        bos_id=hf.get("bos_token_id", 0),
        eos_id=hf.get("eos_token_id", 2),
        unk_id=3,
        decoder_start_id=hf.get("decoder_start_token_id", 2),
    )


def convert_fsmt(
    sd: dict[str, torch.Tensor], hf: dict[str, Any], *, source: str = "<state dict>"
) -> tuple[Any, ImportReport]:
    cfg = fsmt_config(hf)
    report = ImportReport("fsmt", source)
    tied = cfg.tie_embeddings == "all"
    emb_dec = "model.decoder.embed_tokens.weight"
    table: dict[str, Source] = {
        "src_embed.weight": copy(emb_dec if tied else "model.encoder.embed_tokens.weight"),
        "tgt_embed.weight": copy(emb_dec),
        "output_proj.weight": copy(emb_dec if tied else "model.decoder.output_projection.weight"),
    }
    table.update(fairseq_layers(ENC, DEC, cfg.enc_layers, cfg.dec_layers))
    ignore: dict[str, str] = {}
    if tied:
        ignore.update(check_aliases(sd, emb_dec, ["model.encoder.embed_tokens.weight",
                                                  "model.decoder.output_projection.weight"]))
    for side in ("encoder", "decoder"):
        key = f"model.{side}.embed_positions.weight"
        if key in sd:
            expected = sinusoidal_positions(sd[key].size(0), cfg.d_model, "sinusoidal_t2t")
            ignore[key] = check_table(sd, key, expected, "sinusoidal_t2t", start=cfg.pad_id + 1)
    converted = convert(sd, table, target_state(cfg), ignore=ignore, report=report)
    return build_model(cfg, converted), report


def generation_defaults(hf: dict[str, Any], gen: dict[str, Any] | None = None) -> dict[str, Any]:
    merged = {**hf, **(gen or {})}
    max_length = merged.get("max_length")
    return {
        "append_eos": True,
        "beam": int(merged.get("num_beams", 5) or 1),
        "length_penalty": {"kind": "average", "alpha": float(merged.get("length_penalty", 1.0))},
        "max_len": None if max_length is None else int(max_length) - 1,
    }


def import_fsmt(directory: str | Path) -> Imported:
    """Convert a local FSMT directory (config.json, weights, vocab-src/tgt.json, merges.txt)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"FSMT source must be a directory with config.json, got {directory}")
    hf = read_json(directory / "config.json")
    if hf.get("model_type") not in (None, "fsmt"):
        raise ConversionError(f"{directory / 'config.json'} describes a {hf.get('model_type')!r} model, not fsmt")
    from .marian import _weights_file

    weights = _weights_file(directory)
    model, report = convert_fsmt(read_state_dict(weights), hf, source=str(weights))
    gen_file = directory / "generation_config.json"
    gen = read_json(gen_file) if gen_file.is_file() else None
    imported = Imported(model, report, generation=generation_defaults(hf, gen),
                        extra={"languages": list(hf.get("langs", []))})
    if (directory / "vocab-src.json").is_file():
        from .tokenizers import fsmt_tokenizers

        imported.src_tokenizer, imported.tgt_tokenizer = fsmt_tokenizers(directory, hf)
    else:
        report.notes.append("no vocab-src.json/vocab-tgt.json/merges.txt: imported without tokenizers (ids only)")
    return imported

"""Hugging Face FSMTForConditionalGeneration (facebook/wmt19-*) -> workbench checkpoint.

FSMT is transformers' port of fairseq's transformer (read from modeling_fsmt.py): post-norm,
no final stack norms, relu, eps 1e-5, embeddings x sqrt(d), tensor2tensor [sin | cos] positions
numbered from padding_idx + 1 (`sinusoidal_t2t`, position_offset = pad + 1), separate source and
target vocabularies, an untied output projection, decoder start `</s>`, sources end with `</s>`;
per-stack head counts and FFN widths as in Marian.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..core.config import ModelConfig
from .hf import bart_family_sizes, generation_defaults, layer_table, position_tables, read_folder
from .keymap import Source, build_model, check_aliases, convert, copy, target_state
from .result import Imported, ImportReport
from .tokenizers import fsmt_tokenizers


def fsmt_config(hf: dict[str, Any]) -> ModelConfig:
    """Our config for an FSMTConfig dict (config.json)."""
    pad = hf.get("pad_token_id", 1)
    return ModelConfig(
        src_vocab=hf["src_vocab_size"],
        tgt_vocab=hf["tgt_vocab_size"],
        **bart_family_sizes(hf, default_activation="relu"),
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
    table.update(layer_table(cfg.enc_layers, cfg.dec_layers))
    ignore: dict[str, str] = {}
    if tied:
        ignore.update(check_aliases(sd, emb_dec, ["model.encoder.embed_tokens.weight",
                                                  "model.decoder.output_projection.weight"]))
    ignore.update(position_tables(sd, cfg, start=cfg.pad_id + 1))
    converted = convert(sd, table, target_state(cfg), ignore=ignore, report=report)
    return build_model(cfg, converted), report


def import_fsmt(directory: str | Path) -> Imported:
    """Convert a local FSMT directory (config.json, weights, vocab-src/tgt.json, merges.txt)."""
    folder = read_folder(directory, "fsmt", "FSMT")
    hf = folder.config
    model, report = convert_fsmt(folder.state_dict(), hf, source=str(folder.weights))
    imported = Imported(model, report, generation=generation_defaults(hf, folder.generation, beam=5),
                        extra={"languages": list(hf.get("langs", []))})
    if (folder.directory / "vocab-src.json").is_file():
        imported.src_tokenizer, imported.tgt_tokenizer = fsmt_tokenizers(folder.directory, hf)
    else:
        report.notes.append("no vocab-src.json/vocab-tgt.json/merges.txt: imported without tokenizers (ids only)")
    return imported

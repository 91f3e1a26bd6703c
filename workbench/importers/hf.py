"""What the two Hugging Face formats share (MarianMTModel for opus-mt, FSMTForConditionalGeneration for
facebook/wmt19-*): a folder with config.json, model.safetensors or pytorch_model.bin and an optional
generation_config.json; fairseq's layer names under model.encoder/model.decoder; a head count and an
FFN width per stack (encoder_/decoder_attention_heads, encoder_/decoder_ffn_dim); sinusoidal tables
stored as buffers, which we check and recompute; generate()'s decoding settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.config import ModelConfig
from ..core.embedding import sinusoidal_positions
from .errors import ConversionError
from .keymap import ACTIVATIONS, Source, check_table, copy, per_stack
from .reading import read_json, read_state_dict

ENC, DEC = "model.encoder.layers.", "model.decoder.layers."


@dataclass
class HFFolder:
    """A local Hugging Face model folder, read: config, weights file, generation config (or None)."""

    directory: Path
    config: dict[str, Any]
    weights: Path
    generation: dict[str, Any] | None

    def state_dict(self) -> dict[str, torch.Tensor]:
        return read_state_dict(self.weights)


def read_folder(directory: str | Path, model_type: str, what: str) -> HFFolder:
    """config.json (checked to describe `model_type`), the weights file and generation_config.json."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{what} source must be a directory with config.json, got {directory}")
    hf = read_json(directory / "config.json")
    if hf.get("model_type") not in (None, model_type):
        raise ConversionError(
            f"{directory / 'config.json'} describes a {hf.get('model_type')!r} model, not {model_type}"
        )
    gen_file = directory / "generation_config.json"
    return HFFolder(directory, hf, weights_file(directory), read_json(gen_file) if gen_file.is_file() else None)


def weights_file(directory: Path) -> Path:
    """model.safetensors (no pickle) when present, else pytorch_model.bin."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(f"{directory} has neither model.safetensors nor pytorch_model.bin")


def stack_sizes(hf: Mapping[str, Any]) -> dict[str, Any]:
    """ModelConfig n_heads/d_ff (the encoder's) and dec_heads/dec_d_ff (where the decoder differs)."""
    heads, ffn = hf["encoder_attention_heads"], hf["encoder_ffn_dim"]
    return per_stack(heads, hf.get("decoder_attention_heads", heads), ffn, hf.get("decoder_ffn_dim", ffn))


def bart_family_sizes(hf: Mapping[str, Any], *, default_activation: str) -> dict[str, Any]:
    """The ModelConfig fields Marian and FSMT configs spell alike: sizes, dropouts, activation, and the
    post-norm layout without final norms that both use (transformers' BART-family layers)."""
    return dict(
        d_model=hf["d_model"], **stack_sizes(hf),
        enc_layers=hf["encoder_layers"], dec_layers=hf["decoder_layers"],
        dropout=float(hf.get("dropout", 0.1)),
        attn_dropout=float(hf.get("attention_dropout", 0.0)),
        act_dropout=float(hf.get("activation_dropout", 0.0)),
        activation=activation(hf, default_activation),
        norm_first=False, enc_final_norm=False, dec_final_norm=False, layer_norm_eps=1e-5,
    )


def activation(hf: Mapping[str, Any], default: str) -> str:
    act = hf.get("activation_function", default)
    if act not in ACTIVATIONS:
        raise ConversionError(f"config.json: activation_function {act!r} is not supported ({sorted(ACTIVATIONS)})")
    return ACTIVATIONS[act]


def layer_table(n_enc: int, n_dec: int, *, enc: str = ENC, dec: str = DEC, bias: bool = True) -> dict[str, Source]:
    """Per-layer rules for the fairseq layer naming both formats keep (transformers ported both from fairseq).

    `enc`/`dec` are the layer prefixes.
    """
    table: dict[str, Source] = {}
    params = ("weight", "bias") if bias else ("weight",)

    def attn(ours: str, theirs: str) -> None:
        for p in ("q", "k", "v", "out"):
            for w in params:
                table[f"{ours}.{p}_proj.{w}"] = copy(f"{theirs}.{p}_proj.{w}")

    def norm(ours: str, theirs: str) -> None:
        for w in ("weight", "bias"):
            table[f"{ours}.{w}"] = copy(f"{theirs}.{w}")

    def ffn(ours: str, theirs: str) -> None:
        for w in params:
            table[f"{ours}.up_proj.{w}"] = copy(f"{theirs}.fc1.{w}")
            table[f"{ours}.down_proj.{w}"] = copy(f"{theirs}.fc2.{w}")

    for i in range(n_enc):
        attn(f"enc.{i}.self_attn", f"{enc}{i}.self_attn")
        norm(f"enc.{i}.self_attn_norm", f"{enc}{i}.self_attn_layer_norm")
        ffn(f"enc.{i}.ffn", f"{enc}{i}")
        norm(f"enc.{i}.ffn_norm", f"{enc}{i}.final_layer_norm")
    for j in range(n_dec):
        attn(f"dec.{j}.self_attn", f"{dec}{j}.self_attn")
        norm(f"dec.{j}.self_attn_norm", f"{dec}{j}.self_attn_layer_norm")
        attn(f"dec.{j}.cross_attn", f"{dec}{j}.encoder_attn")
        norm(f"dec.{j}.cross_attn_norm", f"{dec}{j}.encoder_attn_layer_norm")
        ffn(f"dec.{j}.ffn", f"{dec}{j}")
        norm(f"dec.{j}.ffn_norm", f"{dec}{j}.final_layer_norm")
    return table


def position_tables(sd: Mapping[str, torch.Tensor], cfg: ModelConfig, *, start: int = 0) -> dict[str, str]:
    """Ignore-entries for the stored sinusoidal tables, each checked equal to the one `cfg` computes.

    Rows before `start` are skipped (FSMT keeps a zero row at padding_idx)."""
    ignore = {}
    for side in ("encoder", "decoder"):
        key = f"model.{side}.embed_positions.weight"
        if key in sd:
            expected = sinusoidal_positions(sd[key].size(0), cfg.d_model, cfg.positions)
            ignore[key] = check_table(sd, key, expected, cfg.positions, start=start)
    return ignore


def generation_defaults(hf: Mapping[str, Any], gen: Mapping[str, Any] | None, *, beam: int) -> dict[str, Any]:
    """Decoding settings as transformers' generate() would use them; `beam` when neither file sets num_beams."""
    merged = {**hf, **(gen or {})}
    max_length = merged.get("max_length")
    return {
        "append_eos": True,
        "beam": int(merged.get("num_beams", beam) or 1),
        "length_penalty": {"kind": "average", "alpha": float(merged.get("length_penalty", 1.0))},
        # HF's max_length counts the decoder start token
        "max_len": None if max_length is None else int(max_length) - 1,
    }

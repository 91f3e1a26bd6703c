"""fairseq `transformer*` checkpoints (model.pt + dict.*.txt + BPE codes) -> workbench checkpoint.

Read from fairseq 0.12.2's source (transformer_encoder/decoder.py, multihead_attention.py):
embeddings x sqrt(d) unless --no-scale-embedding; tensor2tensor [sin | cos] positions numbered
from padding_idx + 1; post-norm unless --*-normalize-before, and then a final stack norm (absent
in decoder version <= 2 files); optional layernorm_embedding; eps 1e-5; the decoder starts from
`</s>` and sources end with `</s>`; fairseq-generate's score is log p / len^lenpen.

2018-era files (the "Scaling NMT" WMT16 en-de / WMT14 en-fr models) store attention as one fused
`in_proj_weight` (q, k, v stacked by rows) and layer norms as `layer_norms.{0,1}` (encoder:
self-attention, FFN) and `layer_norms.{0,1,2}` (decoder: self, cross, FFN); both are read here
with named transforms, exactly as fairseq's own upgrade_state_dict_named renames them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.config import ModelConfig
from .errors import ConversionError
from .keymap import (
    ACTIVATIONS,
    Source,
    build_model,
    check_aliases,
    chunk,
    convert,
    copy,
    layer_count,
    per_stack,
    target_state,
)
from .reading import namespace_dict, torch_load
from .result import Imported, ImportReport
from .tokenizers import fairseq_tokenizers

# Globals that real fairseq checkpoints pickle besides tensors and dicts: training meters in
# extra_state (fairseq 0.6-0.9) and numpy scalars (best validation loss). Mapped to inert stand-ins.
FAIRSEQ_STAND_INS = (
    "fairseq.meters.AverageMeter",
    "fairseq.meters.TimeMeter",
    "fairseq.meters.StopwatchMeter",
    "fairseq.logging.meters.AverageMeter",
    "fairseq.logging.meters.TimeMeter",
    "fairseq.logging.meters.StopwatchMeter",
    "fairseq.logging.meters.MetersDict",
    "fairseq.dataclass.configs.FairseqConfig",
)


def _numpy_allow() -> list[Any]:
    scalar = getattr(getattr(np, "_core", np.core), "multiarray").scalar  # noqa: B009
    reconstruct = getattr(np, "_core", np.core).multiarray._reconstruct
    out: list[Any] = [np.ndarray, np.dtype]
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        out += [(scalar, f"{mod}.scalar"), (reconstruct, f"{mod}._reconstruct")]
    for t in (np.float64, np.float32, np.int64):
        out.append((type(np.dtype(t)), f"numpy.dtypes.{type(np.dtype(t)).__name__}"))
    return out


def fairseq_options(ckpt: dict[str, Any]) -> dict[str, Any]:
    """Model options from `args` (fairseq <= 0.9: argparse.Namespace) or `cfg["model"]` (>= 0.10)."""
    if ckpt.get("cfg") is not None:
        cfg = namespace_dict(ckpt["cfg"])
        model = namespace_dict(cfg.get("model"))
        task = namespace_dict(cfg.get("task"))
        return {**task, **model}
    if ckpt.get("args") is not None:
        return namespace_dict(ckpt["args"])
    raise ConversionError("fairseq checkpoint has neither 'args' nor 'cfg': cannot tell the architecture")


def fairseq_config(opts: dict[str, Any], sd: dict[str, torch.Tensor]) -> ModelConfig:
    get = opts.get
    d = get("encoder_embed_dim", 512)
    for a, b in (("encoder_embed_dim", "decoder_embed_dim"), ("encoder_normalize_before", "decoder_normalize_before")):
        if get(a) is not None and get(b) is not None and get(a) != get(b):
            raise ConversionError(f"fairseq options: {a} ({get(a)}) != {b} ({get(b)}); the workbench model needs one")
    if get("encoder_learned_pos") or get("decoder_learned_pos"):
        raise ConversionError("learned positional embeddings (--encoder/decoder-learned-pos) are not supported: "
                              "the workbench model has one position table for both stacks")
    if get("adaptive_softmax_cutoff") or get("adaptive_input"):
        raise ConversionError("adaptive softmax/input models are not supported")
    if get("no_token_positional_embeddings"):
        raise ConversionError("models without positional embeddings are not supported by this importer")
    act = get("activation_fn", "relu")
    if act not in ACTIVATIONS:
        raise ConversionError(f"fairseq activation_fn {act!r} is not supported ({sorted(ACTIVATIONS)})")
    tie = ("all" if get("share_all_embeddings") else "decoder" if get("share_decoder_input_output_embed")
           else "none")
    pad = 1
    return ModelConfig(
        src_vocab=sd["encoder.embed_tokens.weight"].size(0),
        tgt_vocab=sd["decoder.embed_tokens.weight"].size(0),
        d_model=d,
        **per_stack(get("encoder_attention_heads", 8), get("decoder_attention_heads", 8),
                    get("encoder_ffn_embed_dim", 2048), get("decoder_ffn_embed_dim", 2048)),
        enc_layers=layer_count(sd, "encoder.layers."),
        dec_layers=layer_count(sd, "decoder.layers."),
        dropout=float(get("dropout", 0.1)),
        attn_dropout=float(get("attention_dropout", 0.0)),
        act_dropout=float(get("activation_dropout", get("relu_dropout", 0.0)) or 0.0),
        activation=ACTIVATIONS[act],  # type: ignore[arg-type]
        norm_first=bool(get("encoder_normalize_before", False)),
        enc_final_norm="encoder.layer_norm.weight" in sd,
        dec_final_norm="decoder.layer_norm.weight" in sd,
        emb_norm="encoder.layernorm_embedding.weight" in sd,
        layer_norm_eps=1e-5,
        positions="sinusoidal_t2t",
        position_offset=pad + 1,
        max_positions=max(get("max_source_positions", 1024), get("max_target_positions", 1024)),
        scale_embedding=not get("no_scale_embedding", False),
        tie_embeddings=tie,  # type: ignore[arg-type]
        output_bias=False,
        pad_id=pad,
        bos_id=0,
        eos_id=2,
        unk_id=3,
        decoder_start_id=2,
    )


def _attn(table: dict[str, Source], sd: dict[str, torch.Tensor], ours: str, theirs: str) -> None:
    """Separate q/k/v projections, or the fused in_proj of 2018 files (split by a named transform)."""
    if f"{theirs}.in_proj_weight" in sd:
        for n, p in enumerate(("q", "k", "v")):
            table[f"{ours}.{p}_proj.weight"] = chunk(f"{theirs}.in_proj_weight", n)
            table[f"{ours}.{p}_proj.bias"] = chunk(f"{theirs}.in_proj_bias", n)
    else:
        for p in ("q", "k", "v"):
            for w in ("weight", "bias"):
                table[f"{ours}.{p}_proj.{w}"] = copy(f"{theirs}.{p}_proj.{w}")
    for w in ("weight", "bias"):
        table[f"{ours}.out_proj.{w}"] = copy(f"{theirs}.out_proj.{w}")


def _norm(table: dict[str, Source], sd: dict[str, torch.Tensor], ours: str, new: str, old: str) -> None:
    name = new if f"{new}.weight" in sd else old
    for w in ("weight", "bias"):
        table[f"{ours}.{w}"] = copy(f"{name}.{w}")


def fairseq_table(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> dict[str, Source]:
    table: dict[str, Source] = {}
    for i in range(cfg.enc_layers):
        e = f"encoder.layers.{i}"
        _attn(table, sd, f"enc.{i}.self_attn", f"{e}.self_attn")
        _norm(table, sd, f"enc.{i}.self_attn_norm", f"{e}.self_attn_layer_norm", f"{e}.layer_norms.0")
        _norm(table, sd, f"enc.{i}.ffn_norm", f"{e}.final_layer_norm", f"{e}.layer_norms.1")
        for w in ("weight", "bias"):
            table[f"enc.{i}.ffn.up_proj.{w}"] = copy(f"{e}.fc1.{w}")
            table[f"enc.{i}.ffn.down_proj.{w}"] = copy(f"{e}.fc2.{w}")
    for j in range(cfg.dec_layers):
        dl = f"decoder.layers.{j}"
        _attn(table, sd, f"dec.{j}.self_attn", f"{dl}.self_attn")
        _attn(table, sd, f"dec.{j}.cross_attn", f"{dl}.encoder_attn")
        _norm(table, sd, f"dec.{j}.self_attn_norm", f"{dl}.self_attn_layer_norm", f"{dl}.layer_norms.0")
        _norm(table, sd, f"dec.{j}.cross_attn_norm", f"{dl}.encoder_attn_layer_norm", f"{dl}.layer_norms.1")
        _norm(table, sd, f"dec.{j}.ffn_norm", f"{dl}.final_layer_norm", f"{dl}.layer_norms.2")
        for w in ("weight", "bias"):
            table[f"dec.{j}.ffn.up_proj.{w}"] = copy(f"{dl}.fc1.{w}")
            table[f"dec.{j}.ffn.down_proj.{w}"] = copy(f"{dl}.fc2.{w}")
    for ours, theirs, present in (("enc_norm", "encoder.layer_norm", cfg.has_enc_final_norm),
                                  ("dec_norm", "decoder.layer_norm", cfg.has_dec_final_norm),
                                  ("src_emb_norm", "encoder.layernorm_embedding", cfg.emb_norm),
                                  ("tgt_emb_norm", "decoder.layernorm_embedding", cfg.emb_norm)):
        if present:
            for w in ("weight", "bias"):
                table[f"{ours}.{w}"] = copy(f"{theirs}.{w}")
    tgt = "encoder.embed_tokens.weight" if cfg.tie_embeddings == "all" else "decoder.embed_tokens.weight"
    table["src_embed.weight"] = copy("encoder.embed_tokens.weight")
    table["tgt_embed.weight"] = copy(tgt)
    if cfg.tie_embeddings != "none":
        table["output_proj.weight"] = copy(tgt)
    else:
        key = "decoder.output_projection.weight" if "decoder.output_projection.weight" in sd else "decoder.embed_out"
        table["output_proj.weight"] = copy(key)
    return table


IGNORE = {
    "encoder.version": "fairseq format version counter",
    "decoder.version": "fairseq format version counter",
    "encoder.embed_positions._float_tensor": "placeholder for the sinusoidal table, which we recompute",
    "decoder.embed_positions._float_tensor": "placeholder for the sinusoidal table, which we recompute",
    "encoder.embed_positions.weights": "cached sinusoidal table, recomputed (fairseq drops it too)",
    "decoder.embed_positions.weights": "cached sinusoidal table, recomputed (fairseq drops it too)",
}


def convert_fairseq(
    sd: dict[str, torch.Tensor], opts: dict[str, Any], *, source: str = "<state dict>"
) -> tuple[Any, ImportReport]:
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        if key not in sd:
            raise ConversionError(f"{source}: missing key {key!r}; is this a fairseq transformer checkpoint?")
    cfg = fairseq_config(opts, sd)
    report = ImportReport("fairseq", source)
    ignore = dict(IGNORE)
    if cfg.tie_embeddings == "all":
        ignore.update(check_aliases(sd, "encoder.embed_tokens.weight", ["decoder.embed_tokens.weight"]))
    if cfg.tie_embeddings != "none":
        tgt = "encoder.embed_tokens.weight" if cfg.tie_embeddings == "all" else "decoder.embed_tokens.weight"
        ignore.update(check_aliases(sd, tgt, ["decoder.output_projection.weight", "decoder.embed_out"]))
    if any(".in_proj_weight" in k for k in sd):
        report.notes.append("fused in_proj_weight split into q/k/v (2018-era fairseq layout)")
    if any(".layer_norms." in k for k in sd):
        report.notes.append("layer_norms.{0,1,2} renamed as fairseq's upgrade_state_dict_named does")
    converted = convert(sd, fairseq_table(cfg, sd), target_state(cfg), ignore=ignore, report=report)
    return build_model(cfg, converted), report


def load_fairseq_file(path: str | Path) -> dict[str, Any]:
    ckpt = torch_load(path, stand_ins=FAIRSEQ_STAND_INS, allow=[__import__("argparse").Namespace, *_numpy_allow()])
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise ConversionError(f"{path} is not a fairseq checkpoint (expected a dict with a 'model' state dict)")
    return ckpt


def import_fairseq(source: str | Path, *, lenpen: float = 1.0, beam: int = 5) -> Imported:
    """Convert `model.pt` (or a directory holding model.pt/checkpoint*.pt + dict.*.txt + bpecodes)."""
    source = Path(source)
    directory = source if source.is_dir() else source.parent
    file = source
    if source.is_dir():
        candidates = sorted(source.glob("model*.pt")) + sorted(source.glob("checkpoint*.pt"))
        if not candidates:
            raise FileNotFoundError(f"{source} holds no model.pt or checkpoint*.pt")
        file = candidates[0]
    ckpt = load_fairseq_file(file)
    opts = fairseq_options(ckpt)
    model, report = convert_fairseq(dict(ckpt["model"]), opts, source=str(file))
    for key in ("optimizer_history", "last_optimizer_state", "extra_state"):
        if ckpt.get(key) is not None:
            report.ignored[key] = "training state, not part of the model"
    imported = Imported(
        model,
        report,
        generation={
            "append_eos": True,
            "beam": beam,
            "length_penalty": {"kind": "average", "alpha": lenpen},
            "max_len_a": 0.0,
            "max_len_b": 200,
        },
        extra={"languages": [opts.get("source_lang"), opts.get("target_lang")]},
    )

    toks = fairseq_tokenizers(directory, opts.get("source_lang"), opts.get("target_lang"))
    if toks is None:
        report.notes.append(f"no dict.*.txt + bpecodes in {directory}: imported without tokenizers (ids only)")
    else:
        imported.src_tokenizer, imported.tgt_tokenizer = toks
    return imported

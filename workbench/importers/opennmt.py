"""OpenNMT-py v1/v2/v3 Transformer checkpoints (`*.pt` + sentencepiece model) -> workbench checkpoint.

Read from OpenNMT-py 3.5.1's source (encoders/transformer.py, decoders/transformer.py,
modules/embeddings.py, models/model_saver.py): pre-norm layers (`layer_norm` / `layer_norm_1`
before attention, `layer_norm_2` before cross-attention, `feed_forward.layer_norm` inside the
FFN) with final `encoder.layer_norm` / `decoder.layer_norm`; layer-norm eps 1e-6 (`norm_eps`);
embeddings x sqrt(d) plus sinusoidal positions from 0, interleaved sin/cos by default
("SinusoidalInterleaved"; v3's "SinusoidalConcat" is [sin | cos] with tensor2tensor spacing);
a generator Linear with bias; the decoder starts from `<s>`; sources get no `</s>`.

The checkpoint pickles more than tensors: `opt` (argparse.Namespace) and, before v3, torchtext
`Field`/`Vocab` objects. Those names are mapped to inert stand-ins; anything else is refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from ..core.config import ModelConfig
from ..core.embedding import sinusoidal_positions
from .errors import ConversionError
from .keymap import (
    ACTIVATIONS,
    Source,
    build_model,
    check_aliases,
    check_table,
    convert,
    copy,
    layer_count,
    target_state,
)
from .reading import StandIn, namespace_dict, torch_load
from .result import Imported, ImportReport
from .tokenizers import opennmt_tokenizers

# Exactly the foreign globals OpenNMT-py v1/v2 checkpoints reference (torchtext vocabularies and
# fields, OpenNMT's field wrappers, the partial-bound tokenizer function); each becomes a StandIn.
OPENNMT_STAND_INS = (
    "torchtext.vocab.Vocab",
    "torchtext.vocab._default_unk_index",
    "torchtext.data.field.Field",
    "torchtext.data.field.RawField",
    "torchtext.data.pipeline.Pipeline",
    "onmt.inputters.text_dataset.TextMultiField",
    "onmt.inputters.text_dataset._feature_tokenize",
    "onmt.inputters.inputter._feature_tokenize",
    "functools.partial",
    "collections.defaultdict",
    # OpenNMT-py 0.x saved the optimizer object itself (not its state dict)
    "onmt.utils.optimizers.Optimizer",
    "onmt.utils.optimizers.MultipleOptimizer",
    "torch.optim.adam.Adam",
    "torch.optim.sgd.SGD",
)
SPECIALS = {"unk": "<unk>", "pad": "<blank>", "bos": "<s>", "eos": "</s>"}


def zeros(shape: tuple[int, ...]) -> Source:
    """A bias the original does not have (OpenNMT-py v3 add_qkvbias=False): zeros give the same outputs."""
    return Source((), lambda ts: torch.zeros(shape), f"zeros{tuple(shape)}")


def load_opennmt_file(path: str | Path) -> dict[str, Any]:
    # dict: the factory of torch.optim state defaultdict(dict) in 0.x files (calling it is harmless)
    ckpt = torch_load(path, stand_ins=OPENNMT_STAND_INS, allow=[argparse.Namespace, dict])
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise ConversionError(f"{path} is not an OpenNMT-py checkpoint (expected a dict with 'model')")
    return ckpt


def vocab_lists(vocab: Any) -> tuple[list[str], list[str]]:
    """(source tokens, target tokens) from v3 dicts of lists, v2 fields or v1 (name, Vocab) lists."""
    if isinstance(vocab, list) and all(isinstance(x, tuple) and len(x) == 2 for x in vocab):
        vocab = dict(vocab)
    if not isinstance(vocab, dict) or "src" not in vocab or "tgt" not in vocab:
        raise ConversionError(f"OpenNMT-py vocab must name 'src' and 'tgt', got {type(vocab).__name__}")
    return _itos(vocab["src"], "src"), _itos(vocab["tgt"], "tgt")


def _itos(obj: Any, side: str, depth: int = 0) -> list[str]:
    if isinstance(obj, list) and all(isinstance(t, str) for t in obj):
        return list(obj)
    if depth > 5:
        raise ConversionError(f"cannot find the {side} token list in the checkpoint's vocab")
    if isinstance(obj, list) and obj and isinstance(obj[0], tuple):  # [(name, Field), ...]: the base field
        return _itos(obj[0][1], side, depth + 1)
    if isinstance(obj, StandIn):
        state = obj.state()
        for key in ("itos", "vocab", "fields", "base_field"):
            if key in state and state[key] is not None:
                return _itos(state[key], side, depth + 1)
    raise ConversionError(f"cannot find the {side} token list in the checkpoint's vocab ({type(obj).__name__})")


def _fix_key(key: str) -> str:
    """OpenNMT-py's own back-compat rename of its old LayerNorm (a_2/b_2) to nn.LayerNorm names."""
    for old, new in ((".a_2", ".weight"), (".b_2", ".bias")):
        if "layer_norm" in key and key.endswith(old):
            return key[: -len(old)] + new
    return key


def opennmt_config(opt: dict[str, Any], sd: dict[str, torch.Tensor], src: list[str], tgt: list[str]) -> ModelConfig:
    """The ModelConfig of an OpenNMT-py transformer: its options (`opt`) and weights (`sd`), and the special ids from
    its vocabularies; ConversionError for what the workbench model cannot run."""
    _check_supported(opt, sd)
    get = opt.get
    act = get("pos_ffn_activation_fn", "relu")
    ids = {}
    for role, token in SPECIALS.items():
        if token not in tgt:
            raise ConversionError(f"target vocabulary has no {token!r}")
        ids[role] = tgt.index(token)
    if SPECIALS["pad"] in src and src.index(SPECIALS["pad"]) != ids["pad"]:
        raise ConversionError(f"source pad id {src.index(SPECIALS['pad'])} != target pad id {ids['pad']}")
    pe_key = "encoder.embeddings.make_embedding.pe.pe"
    positional = get("position_encoding", pe_key in sd)
    kind = "sinusoidal_t2t" if get("position_encoding_type") == "SinusoidalConcat" else "sinusoidal"
    shared_emb = bool(get("share_embeddings", False))
    tied = bool(get("share_decoder_embeddings", False))
    d = get("enc_hid_size", get("rnn_size", get("hidden_size", sd["encoder.layer_norm.weight"].size(0))))
    heads = get("heads", 8)
    return ModelConfig(
        src_vocab=sd["encoder.embeddings.make_embedding.emb_luts.0.weight"].size(0),
        tgt_vocab=sd["decoder.embeddings.make_embedding.emb_luts.0.weight"].size(0),
        d_model=d,
        n_heads=heads,
        d_ff=get("transformer_ff", 2048),
        enc_layers=layer_count(sd, "encoder.transformer."),
        dec_layers=layer_count(sd, "decoder.transformer_layers."),
        dropout=float(_first(get("dropout", 0.1))),
        attn_dropout=float(_first(get("attention_dropout", 0.1))),
        activation=ACTIVATIONS[act],  # type: ignore[arg-type]
        norm_first=True,
        enc_final_norm=True,
        dec_final_norm=True,
        layer_norm_eps=float(get("norm_eps", 1e-6)),
        positions=kind if positional else "none",  # type: ignore[arg-type]
        position_offset=0,
        max_positions=sd[pe_key].size(0) if pe_key in sd else 5000,
        scale_embedding=bool(positional),  # OpenNMT-py scales inside PositionalEncoding
        tie_embeddings="all" if shared_emb and tied else "decoder" if tied else "none",
        bias=any(k.endswith("linear_query.bias") or k.endswith("w_1.bias") for k in sd),
        output_bias=True,
        pad_id=ids["pad"],
        bos_id=ids["bos"],
        eos_id=ids["eos"],
        unk_id=ids["unk"],
        decoder_start_id=ids["bos"],
    )



def _check_supported(opt: dict[str, Any], sd: dict[str, torch.Tensor]) -> None:
    """ConversionError for each OpenNMT-py option or weight the workbench model has no counterpart for."""
    get = opt.get
    for name, bad in (("max_relative_positions", 0), ("copy_attn", False), ("parallel_residual", False),
                      ("num_experts", 0), ("rotary_dim", 0)):
        if get(name) not in (None, bad):
            raise ConversionError(f"OpenNMT-py option {name}={get(name)!r} is not supported by the workbench model")
    if get("self_attn_type", "scaled-dot") not in ("scaled-dot", "scaled-dot-flash"):
        raise ConversionError(f"self_attn_type {get('self_attn_type')!r} is not supported (only scaled-dot)")
    if get("layer_norm", "standard") != "standard":
        raise ConversionError(f"layer_norm {get('layer_norm')!r} is not supported (only standard)")
    if get("num_kv", 0) not in (0, None, get("heads", 8)):
        raise ConversionError(f"grouped-query attention (num_kv={get('num_kv')}) is not supported")
    if any(k.endswith("feed_forward.w_3.weight") for k in sd):
        raise ConversionError("gated feed-forward (w_3) is not supported")
    for key in ("encoder_type", "decoder_type"):
        if get(key, "transformer") != "transformer":
            raise ConversionError(f"{key}={get(key)!r}: only transformer models can be imported")
    act = get("pos_ffn_activation_fn", "relu")
    if act not in ACTIVATIONS:
        raise ConversionError(f"pos_ffn_activation_fn {act!r} is not supported ({sorted(ACTIVATIONS)})")


def _first(x: Any) -> Any:
    return x[0] if isinstance(x, (list, tuple)) else x


def opennmt_table(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> dict[str, Source]:
    table: dict[str, Source] = {}
    d = cfg.d_model

    def linear(ours: str, theirs: str, out_dim: int) -> None:
        table[f"{ours}.weight"] = copy(f"{theirs}.weight")
        if cfg.bias:
            has = f"{theirs}.bias" in sd
            table[f"{ours}.bias"] = copy(f"{theirs}.bias") if has else zeros((out_dim,))

    def attn(ours: str, theirs: str) -> None:
        for p, q in (("q", "linear_query"), ("k", "linear_keys"), ("v", "linear_values"), ("out", "final_linear")):
            linear(f"{ours}.{p}_proj", f"{theirs}.{q}", d)

    def norm(ours: str, theirs: str) -> None:
        for w in ("weight", "bias"):
            table[f"{ours}.{w}"] = copy(f"{theirs}.{w}")

    def ffn(ours: str, theirs: str) -> None:
        linear(f"{ours}.up_proj", f"{theirs}.w_1", cfg.ffn_dim(ours))
        linear(f"{ours}.down_proj", f"{theirs}.w_2", d)

    for i in range(cfg.enc_layers):
        e = f"encoder.transformer.{i}"
        attn(f"enc.{i}.self_attn", f"{e}.self_attn")
        norm(f"enc.{i}.self_attn_norm", f"{e}.layer_norm")
        ffn(f"enc.{i}.ffn", f"{e}.feed_forward")
        norm(f"enc.{i}.ffn_norm", f"{e}.feed_forward.layer_norm")
    for j in range(cfg.dec_layers):
        dl = f"decoder.transformer_layers.{j}"
        attn(f"dec.{j}.self_attn", f"{dl}.self_attn")
        norm(f"dec.{j}.self_attn_norm", f"{dl}.layer_norm_1")
        attn(f"dec.{j}.cross_attn", f"{dl}.context_attn")
        norm(f"dec.{j}.cross_attn_norm", f"{dl}.layer_norm_2")
        ffn(f"dec.{j}.ffn", f"{dl}.feed_forward")
        norm(f"dec.{j}.ffn_norm", f"{dl}.feed_forward.layer_norm")
    norm("enc_norm", "encoder.layer_norm")
    norm("dec_norm", "decoder.layer_norm")
    src = "encoder.embeddings.make_embedding.emb_luts.0.weight"
    tgt = src if cfg.tie_embeddings == "all" else "decoder.embeddings.make_embedding.emb_luts.0.weight"
    table["src_embed.weight"] = copy(src)
    table["tgt_embed.weight"] = copy(tgt)
    table["output_proj.weight"] = copy(tgt if cfg.tie_embeddings != "none" else "generator.weight")
    table["output_proj.bias"] = copy("generator.bias")
    return table


def convert_opennmt(ckpt: dict[str, Any], *, source: str = "<checkpoint>") -> tuple[Any, ImportReport, list, list]:
    """Our Transformer from an OpenNMT-py checkpoint dict; also returns the (src, tgt) token lists."""
    opt = namespace_dict(ckpt.get("opt"))
    src_itos, tgt_itos = vocab_lists(ckpt.get("vocab"))
    report = ImportReport("opennmt", source)
    sd = {_fix_key(k): v for k, v in dict(ckpt["model"]).items()}
    if any(".a_2" in k or ".b_2" in k for k in ckpt["model"]):
        report.notes.append("old a_2/b_2 layer norms loaded as nn.LayerNorm, as OpenNMT-py's own loader does")
    gen = dict(ckpt.get("generator") or {})
    for k, v in gen.items():
        sd["generator." + k.removeprefix("0.")] = v
    if "encoder.layer_norm.weight" not in sd:
        raise ConversionError(f"{source}: missing key 'encoder.layer_norm.weight'; is this a Transformer checkpoint?")
    cfg = opennmt_config(opt, sd, src_itos, tgt_itos)
    ignore: dict[str, str] = {}
    for side in ("encoder", "decoder"):
        key = f"{side}.embeddings.make_embedding.pe.pe"
        if key in sd:
            sd[key] = sd[key].reshape(sd[key].size(0), -1)
            expected = sinusoidal_positions(sd[key].size(0), cfg.d_model, cfg.positions)
            ignore[key] = check_table(sd, key, expected, cfg.positions)
    for k in sd:
        if k.startswith("decoder.transformer_layers.") and k.endswith(".mask"):
            ignore[k] = "causal-mask buffer of OpenNMT-py 0.x (recomputed)"
    src = "encoder.embeddings.make_embedding.emb_luts.0.weight"
    tgt = src if cfg.tie_embeddings == "all" else "decoder.embeddings.make_embedding.emb_luts.0.weight"
    if cfg.tie_embeddings == "all":
        ignore.update(check_aliases(sd, src, ["decoder.embeddings.make_embedding.emb_luts.0.weight"]))
    if cfg.tie_embeddings != "none":
        ignore.update(check_aliases(sd, tgt, ["generator.weight"]))
    if cfg.bias and not any(k.endswith("linear_query.bias") for k in sd):
        report.notes.append("attention has no biases in the original (add_qkvbias=False): zero biases, same outputs")
    if cfg.bias and not any(k.endswith("w_1.bias") for k in sd):
        report.notes.append("feed-forward has no biases in the original (add_ffnbias=False): zero biases, same outputs")
    converted = convert(sd, opennmt_table(cfg, sd), target_state(cfg), ignore=ignore, report=report)
    return build_model(cfg, converted), report, src_itos, tgt_itos


def import_opennmt(source: str | Path, *, spm: str | Path | None = None) -> Imported:
    """Convert an OpenNMT-py `.pt` (a directory: the single *.pt in it) with its sentencepiece model(s).

    `spm` is the sentencepiece model (one shared, or a directory with source/target models);
    by default *.model files beside the checkpoint are used.
    """
    source = Path(source)
    file = source
    if source.is_dir():
        pts = sorted(source.glob("*.pt"))
        if len(pts) != 1:
            raise FileNotFoundError(f"{source} must hold exactly one *.pt checkpoint, found {[p.name for p in pts]}")
        file = pts[0]
    ckpt = load_opennmt_file(file)
    model, report, src_itos, tgt_itos = convert_opennmt(ckpt, source=str(file))
    for key in ("optim", "opt"):
        if ckpt.get(key) is not None:
            report.ignored[key] = "training state and options (read for the config), not weights"
    imported = Imported(
        model,
        report,
        generation={
            "append_eos": False,
            "beam": 5,
            # OpenNMT-py translate.py defaults: -length_penalty none -alpha 0; the WMT recipe used avg
            "length_penalty": {"kind": "none", "alpha": 0.0},
            "max_len": 250,
        },
    )

    toks = opennmt_tokenizers(file.parent if spm is None else Path(spm), src_itos, tgt_itos, model.cfg)
    if toks is None:
        report.notes.append("no sentencepiece *.model beside the checkpoint: imported without tokenizers (ids only)")
    else:
        imported.src_tokenizer, imported.tgt_tokenizer = toks
    return imported

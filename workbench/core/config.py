"""Typed, frozen configurations saved next to the weights.

`ModelConfig` covers what published encoder-decoder checkpoints differ in (positional-encoding
layout, norm placement, tying, biases, special ids), so importers only translate weights and
values: the model itself has no `if source == "marian"` branches.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, get_args, get_origin

Activation = Literal["relu", "gelu", "swish", "silu", "gelu_tanh"]
PositionKind = Literal["sinusoidal", "sinusoidal_halves", "sinusoidal_t2t", "learned", "none"]
Tying = Literal["none", "decoder", "all"]

C = TypeVar("C")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    src_vocab: int
    """Source vocabulary size (rows of the encoder embedding)."""
    tgt_vocab: int
    """Target vocabulary size (decoder embedding rows and output logits)."""
    d_model: int = 512
    """Width of the residual stream."""
    n_heads: int = 8
    """Attention heads in every attention block unless enc_heads/dec_heads say otherwise; d_model must
    divide evenly."""
    d_ff: int = 2048
    """Hidden width of the position-wise feed-forward network unless enc_d_ff/dec_d_ff say otherwise."""
    enc_heads: int | None = None
    """Heads of encoder self-attention; None means n_heads (HF Marian/FSMT, fairseq: encoder_attention_heads)."""
    dec_heads: int | None = None
    """Heads of decoder self- and cross-attention; None means n_heads (decoder_attention_heads)."""
    enc_d_ff: int | None = None
    """Encoder feed-forward width; None means d_ff (encoder_ffn_dim)."""
    dec_d_ff: int | None = None
    """Decoder feed-forward width; None means d_ff (decoder_ffn_dim)."""
    enc_layers: int = 6
    """Encoder depth."""
    dec_layers: int = 6
    """Decoder depth (may differ from the encoder's)."""
    dropout: float = 0.1
    """Residual dropout: on each sub-layer's output before it is added (the paper's P_drop)."""
    emb_dropout: float | None = None
    """Dropout on embeddings + positions; None means the same as `dropout` (the paper)."""
    attn_dropout: float = 0.0
    """Dropout on attention probabilities (fairseq's --attention-dropout)."""
    act_dropout: float = 0.0
    """Dropout after the feed-forward activation (fairseq's --activation-dropout)."""
    activation: Activation = "relu"
    """Feed-forward non-linearity; "swish" and "silu" are the same function."""
    norm_first: bool = False
    """False: post-norm as in the paper, x = LN(x + f(x)); True: pre-norm, x = x + f(LN(x))."""
    enc_final_norm: bool | None = None
    """Layer norm after the last encoder layer; None means "when norm_first" (the usual pairing)."""
    dec_final_norm: bool | None = None
    """Layer norm after the last decoder layer; None means "when norm_first"."""
    emb_norm: bool = False
    """Layer norm on the embedding sum before the first layer (BART's layernorm_embedding)."""
    layer_norm_eps: float = 1e-5
    """Epsilon of every layer norm (PyTorch/fairseq 1e-5; OpenNMT-py 1e-6)."""
    positions: PositionKind = "sinusoidal"
    """sinusoidal: interleaved sin/cos with the paper's frequencies; sinusoidal_halves: [sin | cos]
    halves with the paper's frequencies (HF Marian); sinusoidal_t2t: [sin | cos] halves with
    tensor2tensor's log(10000)/(d/2 - 1) spacing (fairseq, FSMT); learned: a trained table."""
    position_offset: int = 0
    """Index of the first real position (fairseq and FSMT start at padding_idx + 1 = 2)."""
    max_positions: int = 1024
    """Longest sequence the position table covers (without the offset)."""
    scale_embedding: bool = True
    """Multiply token embeddings by sqrt(d_model) (the paper, section 3.4)."""
    tie_embeddings: Tying = "decoder"
    """none; decoder: target embedding = output projection; all: source embedding too
    (needs one shared vocabulary)."""
    bias: bool = True
    """Bias on attention and feed-forward projections."""
    output_bias: bool = False
    """Bias on the output projection (Marian's final_logits_bias, OpenNMT's generator bias)."""
    pad_id: int = 0
    """Padding id in both vocabularies; its embedding row stays zero at initialisation."""
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int = 3
    decoder_start_id: int | None = None
    """First decoder input; None means bos_id (fairseq and FSMT use eos, Marian uses pad)."""

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("src_vocab", "tgt_vocab", "d_model", "n_heads", "d_ff", "max_positions",
                     "enc_heads", "dec_heads", "enc_d_ff", "dec_d_ff"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} ({value}) must be positive")
        for name in ("enc_layers", "dec_layers", "position_offset"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must not be negative")
        for name in ("n_heads", "enc_heads", "dec_heads"):
            heads = getattr(self, name)
            if heads is not None and self.d_model % heads:
                raise ValueError(f"d_model ({self.d_model}) must be divisible by {name} ({heads})")
        for name in ("dropout", "attn_dropout", "act_dropout", "emb_dropout"):
            p = getattr(self, name)
            if p is not None and not 0.0 <= p < 1.0:
                raise ValueError(f"{name} ({p}) must be in [0, 1)")
        if self.tie_embeddings == "all" and self.src_vocab != self.tgt_vocab:
            raise ValueError(
                f"tie_embeddings='all' needs one shared vocabulary, "
                f"but src_vocab ({self.src_vocab}) != tgt_vocab ({self.tgt_vocab})"
            )
        if self.positions.startswith("sinusoidal") and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        ids = {k: getattr(self, k) for k in ("pad_id", "bos_id", "eos_id", "unk_id", "decoder_start_id")}
        for k, v in ids.items():
            if v is not None and not 0 <= v < min(self.src_vocab, self.tgt_vocab):
                raise ValueError(f"{k} ({v}) is outside the vocabularies ({self.src_vocab}, {self.tgt_vocab})")

    # -- derived values -------------------------------------------------------------------
    @property
    def d_head(self) -> int:
        """Width of one head of n_heads; per stack see head_dim(stack)."""
        return self.d_model // self.n_heads

    def heads(self, stack: str) -> int:
        """Heads of `stack`: "enc"/"encoder"/"enc_self", or "dec"/"decoder"/"dec_self"/"cross"
        (decoder cross-attention has the decoder's heads, as in transformers and fairseq)."""
        return _per_stack(stack, self.enc_heads, self.dec_heads, self.n_heads)

    def head_dim(self, stack: str) -> int:
        """Width of one head in `stack` (d_model / heads(stack))."""
        return self.d_model // self.heads(stack)

    def ffn_dim(self, stack: str) -> int:
        """Feed-forward hidden width of `stack` ("enc"/"encoder" or "dec"/"decoder")."""
        return _per_stack(stack, self.enc_d_ff, self.dec_d_ff, self.d_ff)

    @property
    def shared_vocab(self) -> bool:
        return self.src_vocab == self.tgt_vocab

    @property
    def start_id(self) -> int:
        return self.bos_id if self.decoder_start_id is None else self.decoder_start_id

    @property
    def has_enc_final_norm(self) -> bool:
        return self.norm_first if self.enc_final_norm is None else self.enc_final_norm

    @property
    def has_dec_final_norm(self) -> bool:
        return self.norm_first if self.dec_final_norm is None else self.dec_final_norm

    @property
    def embedding_dropout(self) -> float:
        return self.dropout if self.emb_dropout is None else self.emb_dropout

    # -- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        return from_dict(cls, data)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        return from_dict(cls, json.loads(text))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


_ENC_NAMES = ("enc", "encoder", "enc_self")
_DEC_NAMES = ("dec", "decoder", "dec_self", "cross", "dec_cross")


def _per_stack(stack: str, enc: int | None, dec: int | None, default: int) -> int:
    # a hook path such as "dec.1.cross_attn" names its stack by the first part
    head = stack.split(".", 1)[0]
    if head in _ENC_NAMES:
        return default if enc is None else enc
    if head in _DEC_NAMES:
        return default if dec is None else dec
    raise ValueError(f"unknown stack {stack!r}; use one of {_ENC_NAMES + _DEC_NAMES}")


# ---------------------------------------------------------------------------- generic helpers


def config_keys(cls: type) -> set[str]:
    """Field names of a config class."""
    return {f.name for f in fields(cls)}  # type: ignore[arg-type]


def from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Build a config dataclass from plain data (a file's); unknown keys are an error, not silence.

    Keys that files written by older versions carry are read under their current names
    (`cls.FILE_KEYS`, old -> new); nothing else accepts them."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} expects a JSON object, got {type(data).__name__}")
    old_keys = getattr(cls, "FILE_KEYS", {})
    data = {old_keys.get(k, k) if old_keys.get(k, k) not in data else k: v for k, v in data.items()}
    known = config_keys(cls)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {unknown}; valid keys: {sorted(known)}")
    return cls(**data)


def override(cfg: C, args: list[str], prefix: str = "") -> C:
    """Apply minGPT-style `--key=value` overrides to a frozen config; the one override parser.

    `--prefix.key=value` is `--key=value` for this config. A key `--field.sub=value` where `field` is a dict
    sets one entry of it (`--model.d_model=128` on a TrainConfig). With a prefix given, other dotted keys are
    left to their own config (`--train.lr=2` when overriding a ModelConfig with prefix "model"). Values are parsed
    with `ast.literal_eval` (falling back to the raw string) and checked against the field's annotation;
    unknown keys raise with the list of valid ones.
    """
    names = config_keys(type(cfg))
    changes: dict[str, Any] = {}
    for arg in args:
        if not arg.startswith("--") or "=" not in arg:
            raise ValueError(f"override {arg!r} must look like --key=value")
        key, raw = arg[2:].split("=", 1)
        if prefix and key.startswith(prefix + "."):
            key = key[len(prefix) + 1 :]
        try:
            value: Any = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        head, dot, sub = key.partition(".")
        if dot and head in names and isinstance(getattr(cfg, head), dict):
            changes[head] = {**changes.get(head, getattr(cfg, head)), sub: value}
            continue
        if dot and prefix:
            continue  # another config's key
        if key not in names:
            valid = sorted(names)
            raise ValueError(f"unknown key {key!r} for {type(cfg).__name__}; valid keys: {valid}")
        changes[key] = value
    return dataclasses.replace(cfg, **changes)  # type: ignore[type-var]


def check_types(cfg: Any) -> None:
    """Reject values that do not fit the annotations (JSON and CLI input are untyped)."""
    hints = typing.get_type_hints(type(cfg))
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        expected = hints[f.name]
        if not _fits(value, expected):
            raise ValueError(f"{type(cfg).__name__}.{f.name} = {value!r} does not fit {_show(expected)}")
        # JSON gives ints for floats; normalise so round trips compare equal
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(cfg, f.name, float(value))


def _fits(value: Any, expected: Any) -> bool:
    origin = get_origin(expected)
    if origin is Literal:
        return value in get_args(expected)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in get_args(expected))
    if expected is type(None):
        return value is None
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is bool:
        return isinstance(value, bool)
    if expected is str:
        return isinstance(value, str)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, dict)
    return True


def _show(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", str(tp))


# ---------------------------------------------------------------------------- decoding

LengthPenaltyKind = Literal["gnmt", "average", "none"]
MAX_BEAM = 1024
"""The widest beam a DecodeConfig takes: its memory and time grow with beam × vocabulary per step (beam 99999 ran
for minutes on one word before this bound), and quality falls long before (Koehn & Knowles 2017: past ~50)."""


@dataclass(frozen=True, kw_only=True)
class DecodeConfig:
    """How to search for a translation; the defaults are fairseq-generate's."""

    FILE_KEYS: ClassVar[dict[str, str]] = {"batch_tokens": "max_tokens"}  # old keys in checkpoints' meta.json

    beam: int = 5
    """Beam size; 1 is greedy search (and gives exactly greedy's output)."""
    length_penalty: LengthPenaltyKind = "average"
    """Final-score normalisation: average = log p / len^alpha (fairseq --lenpen, HF length_penalty);
    gnmt = log p / ((5 + len) / 6)^alpha (Wu et al. 2016; Marian, OpenNMT, CTranslate2); none = log p."""
    alpha: float = 1.0
    """Exponent of the length penalty (0 turns either kind off)."""
    max_len_a: float = 0.0
    """Output length limit a * |src| + b (fairseq's --max-len-a/--max-len-b); |src| counts the EOS."""
    max_len_b: int = 200
    """See max_len_a."""
    max_len: int | None = None
    """Absolute limit on generated tokens (before EOS); the model's max_positions - 1 always applies."""
    min_len: int = 0
    """EOS is forbidden until this many tokens were generated (a shorter length limit still wins)."""
    no_repeat_ngram: int = 0
    """Forbid repeating any n-gram of this size within an output (0: off)."""
    n_best: int = 1
    """Hypotheses returned per sentence, best first (at most `beam`)."""
    max_tokens: int = 4096
    """Text API: sentences are sorted by length and batched up to this many source tokens, padding
    included (fairseq's --max-tokens, TrainConfig.max_tokens); one longer sentence forms its own batch."""

    def __post_init__(self) -> None:
        check_types(self)
        if not 1 <= self.beam <= MAX_BEAM:
            raise ValueError(f"beam ({self.beam}) must be between 1 and {MAX_BEAM}")
        if not 1 <= self.n_best <= self.beam:
            raise ValueError(f"n_best ({self.n_best}) must be between 1 and beam ({self.beam})")
        if not math.isfinite(self.alpha) or self.alpha < 0:
            raise ValueError(f"alpha ({self.alpha}) must be a finite number >= 0 (the length-penalty exponent)")
        if self.max_len_a < 0 or self.max_len_b < 0:
            raise ValueError(f"max_len_a ({self.max_len_a}) and max_len_b ({self.max_len_b}) must not be negative")
        if self.max_len is not None and self.max_len < 0:
            raise ValueError(f"max_len ({self.max_len}) must not be negative")
        for name in ("min_len", "no_repeat_ngram"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must not be negative")
        if self.max_len is not None and self.min_len > self.max_len:
            raise ValueError(f"min_len ({self.min_len}) is larger than max_len ({self.max_len})")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be positive")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecodeConfig:
        return from_dict(cls, data)

"""Typed, frozen configurations saved next to the weights.

`ModelConfig` covers what published encoder-decoder checkpoints differ in (positional-encoding
layout, norm placement, tying, biases, special ids), so importers only translate weights and
values: the model itself has no `if source == "marian"` branches.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import math
import types
import typing
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

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
        _check_types(self)
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


def renamed(**old_to_new: str):
    """Class decorator: old field names keep working for one release, with a one-line FutureWarning.

    The old name is accepted as a keyword (and so by from_dict, TOML/JSON files, `override` and
    `dataclasses.replace`) and read as an attribute; it never appears in `to_dict`.
    """

    def wrap(cls):
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, **kwargs):
            init(self, **_rename(cls, kwargs, stacklevel=3))

        cls.__init__ = __init__
        cls.RENAMED = dict(old_to_new)
        for old, new in old_to_new.items():
            setattr(cls, old, property(functools.partial(_read_renamed, old=old, new=new),
                                       doc=f"Deprecated name of {new}."))
        return cls

    return wrap


def _read_renamed(self, *, old: str, new: str):
    warnings.warn(f"{type(self).__name__}.{old} is now {new}; the old name goes away in the next release",
                  FutureWarning, stacklevel=2)
    return getattr(self, new)


def _rename(cls: type, data: dict[str, Any], *, stacklevel: int = 2) -> dict[str, Any]:
    renames = getattr(cls, "RENAMED", {})
    if not any(old in data for old in renames):
        return data
    data = dict(data)
    for old, new in renames.items():
        if old in data:
            if new in data:
                raise ValueError(f"{cls.__name__}: {old!r} and {new!r} are the same setting ({old!r} is its old "
                                 f"name); give only {new!r}")
            warnings.warn(f"{cls.__name__}: {old!r} is now {new!r}; the old name goes away in the next release",
                          FutureWarning, stacklevel=stacklevel + 1)
            data[new] = data.pop(old)
    return data


def replace(cfg: C, **changes: Any) -> C:
    """`dataclasses.replace` that also takes a config's deprecated field names (with their warning)."""
    return dataclasses.replace(cfg, **_rename(type(cfg), changes, stacklevel=2))  # type: ignore[type-var]


def config_keys(cls: type) -> set[str]:
    """Field names a config accepts, deprecated spellings included."""
    return {f.name for f in fields(cls)} | set(getattr(cls, "RENAMED", {}))  # type: ignore[arg-type]


def from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Build a config dataclass from plain data; unknown keys are an error, not silence."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} expects a JSON object, got {type(data).__name__}")
    known = config_keys(cls)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {unknown}; valid keys: {sorted(known)}")
    return cls(**data)


def override(cfg: C, args: list[str], prefix: str = "") -> C:
    """Apply minGPT-style `--key=value` (or `--prefix.key=value`) overrides to a frozen config.

    Values are parsed with `ast.literal_eval` (falling back to the raw string) and checked
    against the field's annotation; unknown keys raise with the list of valid ones.
    """
    names = config_keys(type(cfg))
    changes: dict[str, Any] = {}
    for arg in args:
        if not arg.startswith("--") or "=" not in arg:
            raise ValueError(f"override {arg!r} must look like --key=value")
        key, raw = arg[2:].split("=", 1)
        if prefix:
            if not key.startswith(prefix + "."):
                continue
            key = key[len(prefix) + 1 :]
        if key not in names:
            valid = sorted(f.name for f in fields(cfg))  # type: ignore[arg-type]
            raise ValueError(f"unknown key {key!r} for {type(cfg).__name__}; valid keys: {valid}")
        try:
            value: Any = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        changes[key] = value
    return replace(cfg, **changes)


def _check_types(cfg: Any) -> None:
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


@renamed(batch_tokens="max_tokens")
@dataclass(frozen=True, kw_only=True)
class DecodeConfig:
    """How to search for a translation; the defaults are fairseq-generate's."""

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
    included (fairseq's --max-tokens, TrainConfig.max_tokens); one longer sentence forms its own batch.
    Formerly `batch_tokens` (still accepted, with a warning)."""

    def __post_init__(self) -> None:
        _check_types(self)
        if self.beam < 1:
            raise ValueError(f"beam ({self.beam}) must be at least 1")
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


# ---------------------------------------------------------------------------- training

ScheduleKind = Literal["noam", "inverse_sqrt", "warmup_cosine", "constant"]
AmpKind = Literal["auto", "bf16", "off"]


@renamed(max_len="max_pair_len")
@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run: data, tokenizer, model preset, optimisation, checkpoints. Validated before any work."""

    # -- data
    dataset: str = "multi30k"
    """A named dataset (workbench.corpus.data.DATASETS: multi30k, wmt14_sample, tatoeba...), a named mixture
    (workbench.corpus.data.MIXTURES: general_de_en), "copy", or "files"."""
    src_lang: str = "de"
    tgt_lang: str = "en"
    data_root: str | None = None
    """Local root of the named datasets; None: $WORKBENCH_DATA, else ../shared/data, else the user cache."""
    train_files: list[str] | None = None
    """dataset="files": [source file, target file] of aligned plain text."""
    valid_files: list[str] | None = None
    """dataset="files": optional validation [source, target] files."""
    train_limit: int = 0
    """Use only the first N training pairs (0: all)."""
    valid_limit: int = 0
    """Score BLEU on the first N validation pairs (0: all); validation loss always uses all."""
    max_pair_len: int = 250
    """Length filter: drop training pairs whose source or target exceeds this many tokens (formerly
    `max_len`, still accepted with a warning; DecodeConfig.max_len is the generation limit)."""
    copy_vocab: int = 11
    """Copy task: ids 4..copy_vocab-1 (the Annotated Transformer used 11)."""
    copy_len: int = 10
    """Copy task: sequence length (tokens before EOS)."""
    copy_pairs: int = 20000
    """Copy task: number of training pairs per epoch."""
    # -- tokenizer
    vocab_size: int = 8000
    """Sentencepiece vocabulary size (each one when not shared)."""
    spm_type: Literal["unigram", "bpe"] = "bpe"
    shared_vocab: bool = True
    """One sentencepiece model for both languages (then tie_embeddings='all' is possible)."""
    byte_fallback: bool = True
    """Unseen characters become UTF-8 byte pieces instead of unk."""
    # -- model
    preset: str = "multi30k_small"
    """A workbench.core.presets name; vocab sizes come from the tokenizer."""
    model: dict = dataclasses.field(default_factory=dict)
    """ModelConfig overrides on top of the preset (CLI: --model.d_model=128)."""
    # -- optimisation
    max_tokens: int = 4096
    """Token budget per batch and side: batch size x longest padded source (and target) length."""
    accum: int = 1
    """Gradient accumulation: batches per optimiser step."""
    schedule: ScheduleKind = "inverse_sqrt"
    lr: float = 5e-4
    """Peak learning rate of inverse_sqrt, warmup_cosine and constant (noam's peak follows from noam_factor)."""
    noam_factor: float | None = None
    """schedule="noam": the factor of the paper's rate, factor * d_model^-0.5 * min(step^-0.5, step *
    warmup^-1.5). When unset, `lr` is read as the factor with a warning (the old behaviour)."""
    warmup: int = 4000
    min_lr: float = 0.0
    """warmup_cosine: final learning rate. With max_steps = 0 and max_minutes set, warmup_cosine decays over the
    *time* budget instead (the fraction of max_minutes spent, `schedule.budget_cosine`): the run ends at
    min_lr whatever the machine's speed, at the price of a step count (and so weights) that depend on it."""
    adam_betas: list[float] = dataclasses.field(default_factory=lambda: [0.9, 0.98])
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    """Decoupled (AdamW) weight decay; 0 is the paper's Adam."""
    label_smoothing: float = 0.1
    clip_norm: float = 0.0
    """Clip the global gradient norm to this value (0: off; the norm is still logged)."""
    max_steps: int = 0
    """Stop after this many optimiser steps (0: no limit)."""
    max_epochs: int = 0
    """Stop after this many epochs (0: no limit)."""
    max_minutes: float = 0.0
    """Stop after this much training time (0: no limit)."""
    seed: int = 1
    # -- runtime
    device: str = "auto"
    """auto: cuda when available, else cpu."""
    amp: AmpKind = "auto"
    """bf16 autocast: auto = on CUDA only."""
    compile: bool = False
    """torch.compile the model for training."""
    threads: int = 0
    """torch CPU threads (0: leave torch's default)."""
    # -- logging, validation, checkpoints
    out_dir: str = "runs/run"
    log_every: int = 50
    """Steps between log records (and the NaN/inf check)."""
    eval_every: int = 0
    """Steps between validations (0: at the end of every epoch)."""
    save_every: int = 0
    """Steps between checkpoints (0: at every validation)."""
    bleu: bool = True
    """Greedy-decode the validation set for BLEU/chrF at each validation."""
    keep_last: int = 5
    """Checkpoints kept besides the best (the paper averaged the last 5 or 20)."""
    best_metric: Literal["bleu", "valid_loss"] = "bleu"
    """Which validation metric picks the kept best checkpoint."""
    average_last: int = 0
    """At the end, also write the average of the last N checkpoints to out_dir/average (0: off)."""
    ema_decay: float = 0.0
    """Keep an exponential moving average of the weights, updated after every optimiser step with decay
    min(ema_decay, (1 + step) / (10 + step)) (the usual warm-up of the decay; 0.999 weighs roughly the last 1,000
    steps), saved in each checkpoint's training state (exact resume) and written to out_dir/ema at the end (0: off)."""

    def __post_init__(self) -> None:
        _check_types(self)
        for name in ("vocab_size", "max_tokens", "accum", "max_pair_len", "log_every", "copy_vocab", "copy_len",
                     "copy_pairs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be positive")
        for name in ("train_limit", "valid_limit", "warmup", "max_steps", "max_epochs", "eval_every",
                     "save_every", "keep_last", "average_last", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must not be negative")
        for name in ("lr", "max_minutes", "clip_norm", "weight_decay", "min_lr"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must not be negative")
        if self.lr == 0:
            raise ValueError("lr must be positive")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay ({self.ema_decay}) must be in [0, 1)")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing ({self.label_smoothing}) must be in [0, 1)")
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ValueError(f"adam_betas ({self.adam_betas}) must be two numbers in [0, 1)")
        if self.schedule == "noam" and self.warmup == 0:
            raise ValueError("schedule 'noam' needs warmup > 0")
        if self.noam_factor is not None and not (math.isfinite(self.noam_factor) and self.noam_factor > 0):
            raise ValueError(f"noam_factor ({self.noam_factor}) must be a positive number")
        if self.schedule == "noam" and self.noam_factor is None:
            warnings.warn(f"TrainConfig: schedule 'noam' reads lr ({self.lr}) as its factor; set noam_factor = "
                          f"{self.lr} instead (lr as noam's factor goes away in the next release)", FutureWarning,
                          stacklevel=4)
            object.__setattr__(self, "noam_factor", self.lr)
        if self.schedule == "warmup_cosine" and self.max_steps <= self.warmup and not (
                self.max_steps == 0 and self.max_minutes):
            raise ValueError(f"schedule 'warmup_cosine' needs max_steps ({self.max_steps}) > warmup ({self.warmup}), "
                             "or max_steps = 0 and max_minutes to decay over the time budget")
        if not (self.max_steps or self.max_epochs or self.max_minutes):
            raise ValueError("set at least one of max_steps, max_epochs, max_minutes: the run would never end")
        if self.dataset == "files" and (not self.train_files or len(self.train_files) != 2):
            raise ValueError(f"dataset='files' needs train_files = [source, target], got {self.train_files}")
        if self.valid_files is not None and len(self.valid_files) != 2:
            raise ValueError(f"valid_files must be [source, target], got {self.valid_files}")
        if self.copy_vocab < 5:
            raise ValueError(f"copy_vocab ({self.copy_vocab}) must leave room for tokens after the 4 specials")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        return from_dict(cls, data)

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        """A TOML or JSON file; a TOML [train] table (or the top level) holds the fields, [model] the overrides."""
        path = Path(path)
        text = path.read_text(encoding="utf-8")
        try:
            if path.suffix == ".json":
                data = json.loads(text)
            else:
                import tomllib

                data = tomllib.loads(text)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        flat = dict(data.get("train", {})) if "train" in data else {k: v for k, v in data.items() if k != "model"}
        if "model" in data:
            flat["model"] = dict(data["model"])
        try:
            return cls.from_dict(flat)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from None

"""`TrainConfig`: one training run, validated before any work; saved with its checkpoints."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from ..core.config import check_types, from_dict

ScheduleKind = Literal["noam", "inverse_sqrt", "warmup_cosine", "constant"]
AmpKind = Literal["auto", "bf16", "off"]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run: data, tokenizer, model preset, optimisation, checkpoints. Validated before any work."""

    FILE_KEYS: ClassVar[dict[str, str]] = {"max_len": "max_pair_len"}  # old keys in config files and checkpoints

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
    """Length filter: drop training pairs whose source or target exceeds this many tokens
    (DecodeConfig.max_len is the generation limit)."""
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
    warmup^-1.5); required with that schedule (files written before this field read `lr` as the factor)."""
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
    target_bleu: float = 0.0
    """Stop at the first validation whose greedy BLEU reaches this (0: off), the other limits still in force: time
    to quality on any machine, where a fixed budget is too long on a fast one and too short on a slow one. Needs
    `bleu` and validation text; set `eval_every` to how often to look (each look decodes `valid_limit` lines)."""
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
        check_types(self)
        for name in ("vocab_size", "max_tokens", "accum", "max_pair_len", "log_every", "copy_vocab", "copy_len",
                     "copy_pairs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be positive")
        for name in ("train_limit", "valid_limit", "warmup", "max_steps", "max_epochs", "eval_every",
                     "save_every", "keep_last", "average_last", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must not be negative")
        for name in ("lr", "max_minutes", "clip_norm", "weight_decay", "min_lr", "target_bleu"):
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
            raise ValueError("schedule 'noam' needs noam_factor (the factor of the paper's rate; 1.0 in the paper's "
                             "formula, 2.0 in the Annotated Transformer)")
        if self.schedule == "warmup_cosine" and self.max_steps <= self.warmup and not (
                self.max_steps == 0 and self.max_minutes):
            raise ValueError(f"schedule 'warmup_cosine' needs max_steps ({self.max_steps}) > warmup ({self.warmup}), "
                             "or max_steps = 0 and max_minutes to decay over the time budget")
        if self.target_bleu and not self.bleu:
            raise ValueError(f"target_bleu ({self.target_bleu}) needs bleu = true: the validations score no BLEU")
        if self.target_bleu > 100:
            raise ValueError(f"target_bleu ({self.target_bleu}) must be at most 100")
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
        if isinstance(data, dict) and data.get("schedule") == "noam" and data.get("noam_factor") is None:
            data = {**data, "noam_factor": data.get("lr", 5e-4)}  # files from before noam_factor: lr was the factor
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

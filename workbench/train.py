"""The training names notebooks and tests import; the trainer itself lives in `workbench.training`.

`workbench.training` holds one job per module (setup, distributed, run directory, loop); this
module re-exports it so `from workbench.train import Trainer` keeps working.
"""

from __future__ import annotations

import ast
import dataclasses

from .core.config import TrainConfig, override
from .training import Trainer, TrainingDiverged, model_config
from .training.trainer import _Accumulator

__all__ = ["Trainer", "TrainingDiverged", "_Accumulator", "model_config", "parse_overrides"]


# --------------------------------------------------- config overrides (`workbench train CONFIG --key=value`)


def parse_overrides(cfg: TrainConfig, args: list[str]) -> TrainConfig:
    """Apply `--key=value` / `--train.key=value` and `--model.key=value` overrides."""
    plain, model = [], dict(cfg.model)
    for arg in args:
        if not arg.startswith("--") or "=" not in arg:
            raise ValueError(f"override {arg!r} must look like --key=value or --model.key=value")
        key, raw = arg[2:].split("=", 1)
        if key.startswith("model."):
            try:
                model[key[6:]] = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                model[key[6:]] = raw
        else:
            plain.append("--" + key.removeprefix("train.") + "=" + raw)
    cfg = override(cfg, plain)
    return dataclasses.replace(cfg, model=model) if model != cfg.model else cfg

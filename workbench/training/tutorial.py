"""The tutorials' model: the shipped German→English checkpoint, or a tiny one trained on the spot.

Notebooks 01, 04 and 05 read German Multi30k. They use `checkpoints/multi30k-de-en` when it ships (outside
quick mode); otherwise they train the `tiny` preset on a slice of Multi30k into a temporary directory, which
takes seconds in quick mode (`WORKBENCH_QUICK=1`, what CI runs):

    CHECKPOINT, how = tutorial_checkpoint(quick=QUICK, steps=TRAIN_STEPS)
    print(how)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..checkpoint.shipped import available, shipped
from .config import TrainConfig
from .trainer import Trainer

SHIPPED = "multi30k-de-en"


def tiny_config(*, quick: bool, steps: int, out_dir: str | Path) -> TrainConfig:
    """The `tiny` preset on Multi30k de→en: a slice of it and a small vocabulary in quick mode."""
    return TrainConfig(
        dataset="multi30k", src_lang="de", tgt_lang="en", train_limit=2000 if quick else 29000,
        vocab_size=600 if quick else 4000, preset="tiny", model={"dropout": 0.1},
        max_tokens=1500 if quick else 3000, schedule="inverse_sqrt", lr=3e-3, warmup=20 if quick else 400,
        max_steps=steps, log_every=10 if quick else 100, valid_limit=20 if quick else 200,
        threads=1 if quick else 0, out_dir=str(out_dir),
    )


def tutorial_checkpoint(*, quick: bool, steps: int) -> tuple[Path, str]:
    """(checkpoint directory, one line saying which model it is): the shipped de→en model unless `quick` or
    it does not ship, else a tiny model trained for `steps` steps into a temporary directory."""
    if SHIPPED in available() and not quick:
        path = shipped(SHIPPED)
        return path, f"using the shipped checkpoint {path}"
    trainer = Trainer(tiny_config(quick=quick, steps=steps, out_dir=tempfile.mkdtemp(prefix="workbench-tour-"))).fit()
    return Path(trainer.out_dir), (f"no shipped checkpoint used: trained a tiny model for {trainer.step} steps into "
                                   "a temporary directory")

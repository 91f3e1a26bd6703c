"""Training: the `Trainer` and the pieces it is built from, one job per module.

    setup.py        config -> model config, LR schedule, optimiser, data and tokenizers
    distributed.py  torchrun process group, device choice
    run_dir.py      the run directory: which checkpoint to save, resume from, keep or prune
    validation.py   held-out loss and greedy BLEU/chrF of a model
    trainer.py      `Trainer`: the loop, divergence checks, validation and save decisions, exact-resume state

`workbench.train` re-exports the public names, so `from workbench.training import Trainer` keeps working.
"""

from .setup import model_config
from .trainer import Trainer, TrainingDiverged

__all__ = ["Trainer", "TrainingDiverged", "model_config"]

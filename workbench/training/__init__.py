"""Training: its config, the `Trainer` and the pieces it is built from, one job per module.

    config.py       `TrainConfig`: one run's settings, validated before any work, saved with its checkpoints
    setup.py        config -> model config, LR schedule, optimiser, data and tokenizers
    distributed.py  torchrun process group, device choice
    run_dir.py      the run directory: which checkpoint to save, resume from, keep or prune
    validation.py   held-out loss and greedy BLEU/chrF of a model
    trainer.py      `Trainer`: the loop, divergence checks, validation and save decisions, exact-resume state
    loss.py         label-smoothed cross-entropy (fused with the output layer), teacher-forced loss
    schedule.py     learning-rate schedules as pure `step -> lr` functions
    progress.py     the terminal line and the notebook's HTML progress block
    average.py      checkpoint averaging (`workbench average`)
    tutorial.py     the notebooks' model: the shipped one, or a tiny one trained on the spot

`from workbench.training import Trainer, TrainingDiverged, model_config`.
"""

from .setup import model_config
from .trainer import Trainer, TrainingDiverged

__all__ = ["Trainer", "TrainingDiverged", "model_config"]

"""The run directory's checkpoint policy: step_NNNNNNN names, `latest`/`best` pointers, resume point, pruning.

Every checkpoint the trainer writes has finite weights and losses (it checks before saving), so
`latest` always names a good one; a run directory written by an older version may hold
non-finite ones, which `load_resume_point` skips.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..checkpoint.format import BEST, LATEST, Checkpoint, load_checkpoint, read_pointer, save_checkpoint, write_pointer
from .average import average_checkpoints

_STEP = re.compile(r"^step_(\d+)$")


def step_name(step: int) -> str:
    return f"step_{step:07d}"


def step_dirs(run_dir: Path) -> list[Path]:
    """The run's step_* checkpoint directories, oldest first."""
    return sorted(p for p in run_dir.glob("step_*") if p.is_dir() and _STEP.match(p.name))


def save_step(run_dir: Path, step: int, *, best: bool, keep_last: int, **checkpoint: Any) -> Path:
    """Write run_dir/step_NNNNNNN, point `latest` (and `best`) at it, prune old ones."""
    name = step_name(step)
    path = save_checkpoint(run_dir / name, **checkpoint)
    write_pointer(run_dir, LATEST, name)
    if best:
        write_pointer(run_dir, BEST, name)
    prune(run_dir, keep_last, upto=step)
    return path


def prune(run_dir: Path, keep_last: int, upto: int | None = None) -> list[str]:
    """Delete all but the last `keep_last` step directories up to step `upto`; never what a pointer names.

    Directories after `upto` (an abandoned future: the run resumed from an earlier checkpoint) are
    left alone; the run replaces them as it reaches their steps.
    """
    keep = {p.name for p in (read_pointer(run_dir, LATEST), read_pointer(run_dir, BEST)) if p}
    steps = [p for p in step_dirs(run_dir) if upto is None or int(_STEP.match(p.name)[1]) <= upto]
    removed = []
    for p in steps[: max(0, len(steps) - keep_last)]:
        if p.name not in keep:
            # renamed away first: a kill inside rmtree leaves a hidden .old-* (clean_stale removes it),
            # never a half-deleted step_* that averaging or a resume could pick up
            doomed = Path(tempfile.mkdtemp(prefix=f".{p.name}.old-", dir=run_dir))
            os.rename(p, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            removed.append(p.name)
    return removed


def is_finite(ckpt: Checkpoint) -> bool:
    """Weights and (when loaded) optimiser state hold no NaN/inf."""
    tensors = list(ckpt.model.state_dict().values())
    if ckpt.train_state is not None:
        tensors += [t for t in _tensors(ckpt.train_state.get("optimizer")) if t.is_floating_point()]
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


def load_resume_point(run_dir: Path) -> tuple[Checkpoint, list[Path]]:
    """The checkpoint `latest` names, or when its weights are not finite the newest one whose are.

    Returns the checkpoint (with its training state) and the paths skipped as non-finite.
    """
    latest = read_pointer(run_dir, LATEST)
    candidates = ([latest] if latest is not None else []) + [p for p in reversed(step_dirs(run_dir)) if p != latest]
    skipped = []
    for path in candidates:
        if not path.is_dir():
            continue
        ckpt = load_checkpoint(path, with_train_state=True)
        if is_finite(ckpt):
            return ckpt, skipped
        skipped.append(path)
    names = ", ".join(p.name for p in skipped) or "none"
    raise ValueError(f"{run_dir}: no checkpoint with finite weights to resume from (non-finite: {names}); "
                     f"start over with --fresh or another out_dir")


def average_last(run_dir: Path, n: int) -> tuple[int, Path] | None:
    """Average the last `n` step checkpoints into run_dir/average; None when there are fewer than two."""
    steps = step_dirs(run_dir)[-n:]
    if len(steps) < 2:
        return None
    return len(steps), average_checkpoints(steps, run_dir / "average")


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []

"""The run directory's checkpoint policy: step_NNNNNNN names, `latest`/`best` pointers, pruning, averaging."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ..checkpoint import BEST, LATEST, read_pointer, save_checkpoint, write_pointer


def step_name(step: int) -> str:
    return f"step_{step:07d}"


def step_dirs(run_dir: Path) -> list[Path]:
    """The run's step_* checkpoint directories, oldest first."""
    return sorted(p for p in run_dir.glob("step_*") if p.is_dir())


def save_step(run_dir: Path, step: int, *, best: bool, keep_last: int, **checkpoint: Any) -> Path:
    """Write run_dir/step_NNNNNNN, point `latest` (and `best`) at it, prune old ones."""
    name = step_name(step)
    path = save_checkpoint(run_dir / name, **checkpoint)
    write_pointer(run_dir, LATEST, name)
    if best:
        write_pointer(run_dir, BEST, name)
    prune(run_dir, keep_last)
    return path


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the last `keep_last` step directories, never the ones `latest` or `best` name."""
    keep = {p.name for p in (read_pointer(run_dir, LATEST), read_pointer(run_dir, BEST)) if p}
    steps = step_dirs(run_dir)
    for p in steps[: max(0, len(steps) - keep_last)]:
        if p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)


def average_last(run_dir: Path, n: int) -> tuple[int, Path] | None:
    """Average the last `n` step checkpoints into run_dir/average; None when there are fewer than two."""
    from ..average import average_checkpoints  # average.py is the averaging job's home; imported when used

    steps = step_dirs(run_dir)[-n:]
    if len(steps) < 2:
        return None
    return len(steps), average_checkpoints(steps, run_dir / "average")

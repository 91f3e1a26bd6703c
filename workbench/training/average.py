"""Checkpoint averaging (the paper averaged the last 5 base / 20 big checkpoints) and `workbench average`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from ..checkpoint.format import CheckpointError, load_checkpoint, save_checkpoint


def average_checkpoints(paths: Sequence[str | Path], out: str | Path, *, dtype: torch.dtype | None = None) -> Path:
    """Write the element-wise mean of the checkpoints' weights (same config required) to `out`.

    Sums run in float64 so the result does not depend on the order; tokenizers, meta and the
    training log come from the last checkpoint (the usual "average of the last N" case).
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    paths = [Path(p) for p in paths]
    first = load_checkpoint(paths[0])
    sums = {k: v.double().clone() for k, v in first.model.state_dict().items() if v.is_floating_point()}
    last = first
    for path in paths[1:]:
        ck = load_checkpoint(path)
        if ck.config != first.config:
            raise CheckpointError(f"{path} has a different model config than {paths[0]}; cannot average")
        for k, v in ck.model.state_dict().items():
            if k in sums:
                sums[k] += v.double()
        last = ck
    state = last.model.state_dict()
    with torch.no_grad():
        for k, total in sums.items():
            state[k].copy_((total / len(paths)).to(state[k].dtype))
    meta = {k: v for k, v in last.meta.items() if k not in ("files", "created", "created_by", "format_version")}
    meta["averaged_from"] = [str(p) for p in paths]
    return save_checkpoint(out, last.model, src_tokenizer=last.src_tokenizer, tgt_tokenizer=last.tgt_tokenizer,
                           meta=meta, train_log=last.train_log, dtype=dtype)


def last_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """The last `n` step_* checkpoints of a run directory, oldest first."""
    steps = sorted(p for p in Path(run_dir).glob("step_*") if p.is_dir() and (p / "config.json").is_file())
    if not steps:
        raise FileNotFoundError(f"no step_* checkpoints in {run_dir}")
    return steps[-n:]

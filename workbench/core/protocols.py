"""The two call shapes every analysis shares, defined once: how long work reports progress, and what a metric is.

Feature, analysis, CLI and app code all take these (issue 37 point 6): a caller writes one callback that fits every
long-running function, and a metric written for patching fits circuits and attribution alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch


class Progress(Protocol):
    """A progress callback: `progress(done, total, what)` after each unit of work (`what`: an optional line for a
    person, such as the file just written or the checkpoint step just measured; "" when there is nothing to add).
    Callers that only count may ignore `what`; callees that have nothing to say call `progress(done, total)`."""

    def __call__(self, done: int, total: int, what: str = "") -> None: ...


Metric = Callable[[torch.Tensor], torch.Tensor]
"""A metric: logits (N, T, V) -> one score per row (N,), differentiable (patching, circuits, gradients)."""


def print_progress(done: int, total: int, what: str = "") -> None:
    """The command line's `Progress`: "[done/total] what", flushed."""
    print(f"[{done}/{total}] {what}".rstrip(), flush=True)

"""Learning-rate schedules as pure functions of the optimiser step.

Pure functions (not `LambdaLR` subclasses) so the views can plot them without an optimiser and the
trainer can log the exact value it used. Steps count optimiser updates from 1; step 0 (before the
first update) is defined and returns 0.0 for every warm-up schedule, which avoids the Annotated
Transformer's `if step == 0: step = 1` hack while still starting the run at zero.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable


def noam(step: int, *, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The paper's schedule (section 5.3): factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

    Rises linearly for `warmup` steps, peaks at factor * (d_model * warmup)^-0.5 at step == warmup,
    then decays as step^-0.5. Step 0 returns 0.0 (the linear branch's value there).
    """
    _check(step=step, d_model=d_model, warmup=warmup)
    if warmup <= 0 or d_model <= 0:
        raise ValueError(f"noam needs warmup > 0 and d_model > 0, got warmup={warmup}, d_model={d_model}")
    if step == 0:
        return 0.0
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt(step: int, *, peak_lr: float, warmup: int) -> float:
    """fairseq's inverse_sqrt: linear warm-up to `peak_lr`, then peak_lr * sqrt(warmup / step).

    With peak_lr = (d_model * warmup)^-0.5 this equals `noam` with factor 1.
    """
    _check(step=step, warmup=warmup)
    if warmup == 0:
        return peak_lr * (1.0 if step == 0 else step**-0.5)
    if step < warmup:
        return peak_lr * step / warmup
    return peak_lr * math.sqrt(warmup / step)


def warmup_cosine(step: int, *, peak_lr: float, warmup: int, total: int, min_lr: float = 0.0) -> float:
    """Linear warm-up to `peak_lr`, cosine decay to `min_lr` at `total`, `min_lr` after."""
    _check(step=step, warmup=warmup, total=total)
    if total <= warmup:
        raise ValueError(f"warmup_cosine needs total ({total}) > warmup ({warmup})")
    if step < warmup:
        return peak_lr * step / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)
    return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def budget_cosine(fraction: float) -> float:
    """½·(1 + cos(π·f)) for the spent fraction f of a budget, clamped to [0, 1]: 1 at the start, 0 at the end.

    The trainer multiplies a warmed-up constant rate by it when warmup_cosine runs over a time budget
    (max_steps = 0, max_minutes set), so the decay ends when the minutes do, on any machine.
    """
    f = min(1.0, max(0.0, float(fraction)))
    return 0.5 * (1.0 + math.cos(math.pi * f))


def constant(step: int, *, lr: float, warmup: int = 0) -> float:
    """`lr` throughout, after an optional linear warm-up."""
    _check(step=step, warmup=warmup)
    if warmup and step < warmup:
        return lr * step / warmup
    return lr


SCHEDULES: dict[str, Callable[..., float]] = {
    "noam": noam,
    "inverse_sqrt": inverse_sqrt,
    "warmup_cosine": warmup_cosine,
    "constant": constant,
}


def make_schedule(name: str, **kw) -> Callable[[int], float]:
    """`step -> lr` for a named schedule with its keyword arguments bound; bad names/arguments raise now."""
    try:
        fn = SCHEDULES[name]
    except KeyError:
        raise ValueError(f"unknown schedule {name!r}; known: {sorted(SCHEDULES)}") from None
    bound = functools.partial(fn, **kw)
    try:
        bound(0)  # surfaces missing/unknown keyword arguments at construction, not mid-run
    except TypeError as exc:
        raise ValueError(f"schedule {name!r}: {exc}") from None
    return bound


def _check(**values: int) -> None:
    for key, value in values.items():
        if value < 0:
            raise ValueError(f"{key} ({value}) must not be negative")

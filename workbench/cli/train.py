"""`workbench train CONFIG [--fresh] [--key=value ...]`: train (or resume) a run from a TOML/JSON config.

Under `torchrun --nproc_per_node N -m workbench.cli train CONFIG` every rank runs this; rank 0 logs and saves.
SIGTERM (`kill PID`, `docker stop`, a scheduler's preemption) stops a run as Ctrl-C does: the step it reached is
saved and the same command resumes it. That matters for runs started in the background (`... &`), where the shell
leaves SIGINT ignored.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from collections.abc import Iterator

import torch.distributed as dist

from ..core.config import override
from ..training import Trainer
from ..training.config import TrainConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a TOML or JSON training config (see configs/)")
    p.add_argument("--fresh", action="store_true", help="ignore a checkpoint already in out_dir (default: resume)")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="--key=value or --model.key=value")


def run(args: argparse.Namespace) -> int:
    fresh = args.fresh or "--fresh" in args.overrides  # REMAINDER also captures options after CONFIG
    cfg = override(TrainConfig.load(args.config), [a for a in args.overrides if a != "--fresh"], prefix="train")
    trainer = Trainer(cfg, resume=not fresh, progress="terminal")
    with _sigterm_as_interrupt():
        trainer.fit()
    if trainer.dist.world > 1:
        dist.destroy_process_group()
    return 130 if trainer.interrupted else 0


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While training, SIGTERM raises KeyboardInterrupt, so the trainer saves the step it reached and returns."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():  # signal handlers live on the main thread
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

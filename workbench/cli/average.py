"""`workbench average CKPT... --out DIR` or `workbench average --last N RUN_DIR --out DIR`: average weights."""

from __future__ import annotations

import argparse

from ..training.average import average_checkpoints, last_checkpoints


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoints", nargs="+", help="checkpoint directories, or one run directory with --last N")
    p.add_argument("--last", type=int, default=0, help="average the last N step_* checkpoints of a run directory")
    p.add_argument("--out", required=True, help="output checkpoint directory")


def run(args: argparse.Namespace) -> int:
    paths = args.checkpoints
    if args.last:
        if len(paths) != 1:
            raise ValueError("--last N takes exactly one run directory")
        paths = last_checkpoints(paths[0], args.last)
    out = average_checkpoints(paths, args.out)
    print(f"averaged {len(paths)} checkpoints into {out}")
    return 0

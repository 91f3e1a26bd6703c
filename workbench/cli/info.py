"""`workbench info`: print a config and its hook-point names (the discoverable scheme)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.config import ModelConfig
from ..core.model import Transformer
from ..core.presets import PRESETS, preset


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", help=f"a preset ({', '.join(PRESETS)}) or a checkpoint directory / config.json")
    p.add_argument("--hooks", default=None, metavar="GLOB", help="list hook points matching GLOB ('*' for all)")


def run(args: argparse.Namespace) -> int:
    path = Path(args.what)
    if args.what in PRESETS:
        cfg = preset(args.what)
    elif path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{args.what} is not a checkpoint directory: it has no config.json")
        cfg = ModelConfig.load(path / "config.json")
    elif path.is_file():
        cfg = ModelConfig.load(path)
    else:
        raise FileNotFoundError(f"{args.what!r} is neither a preset ({', '.join(PRESETS)}) nor an existing path")
    print(cfg.to_json())
    if args.hooks:
        model = Transformer(cfg) if cfg.d_model * cfg.src_vocab < 5e8 else None
        if model is None:
            raise ValueError("config too large to instantiate for listing hooks")
        for name in model.hook_names(args.hooks):
            print(name)
    return 0

"""The checkpoints and training configs that ship with the project, found through the package itself.

`checkpoints/` and `configs/` sit beside the `workbench` package in the source tree (an editable install,
`pip install -e .`, points there), so a notebook finds them wherever the notebook file sits:

    from workbench.checkpoint.shipped import shipped, shipped_config
    tm = workbench.load(shipped("multi30k-de-en"))        # not load("../checkpoints/multi30k-de-en")
    cfg = TrainConfig.load(shipped_config("copy_task"))   # configs/copy_task.toml
"""

from __future__ import annotations

from pathlib import Path

from .format import is_checkpoint

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = ROOT / "checkpoints"
"""The shipped checkpoints; `checkpoints/DEFAULT` names the app's default."""
CONFIGS = ROOT / "configs"
"""The shipped training configs (TOML)."""


def available() -> list[str]:
    """Names of the checkpoints that ship here (sorted); empty when none do (an install without the tree)."""
    if not CHECKPOINTS.is_dir():
        return []
    return sorted(p.name for p in CHECKPOINTS.iterdir() if p.is_dir() and is_checkpoint(p))


def shipped(name: str | None = None) -> Path:
    """The directory of the shipped checkpoint `name` (default: the one `checkpoints/DEFAULT` names)."""
    if name is None:
        marker = CHECKPOINTS / "DEFAULT"
        if not marker.is_file():
            raise FileNotFoundError(f"no default checkpoint: {marker} is missing")
        name = marker.read_text(encoding="utf-8").strip()
    path = CHECKPOINTS / name
    if not is_checkpoint(path):
        raise FileNotFoundError(f"no shipped checkpoint {name!r} in {CHECKPOINTS}; shipped: {available() or 'none'}")
    return path


def shipped_config(name: str) -> Path:
    """The shipped training config `name` ("copy_task" or "copy_task.toml" -> configs/copy_task.toml)."""
    path = CONFIGS / (name if name.endswith((".toml", ".json")) else f"{name}.toml")
    if not path.is_file():
        names = sorted(p.stem for p in CONFIGS.glob("*.toml")) if CONFIGS.is_dir() else []
        raise FileNotFoundError(f"no shipped config {name!r} in {CONFIGS}; shipped: {names or 'none'}")
    return path

"""The workbench checkpoint format: one directory, plain JSON plus safetensors, written atomically.

    run/step_0001000/
        config.json          ModelConfig
        model.safetensors    weights; tied tensors stored once (under their first state-dict name)
        tokenizer.json       {"src": spec, "tgt": spec | "shared"} + the tokenizer files it names
        meta.json            format version, creator, languages, generation defaults, file sizes
        train_log.jsonl      one JSON object per logged step / validation
        alignment.json       optional: the checkpoint's own word aligner (method, heads), see `save_alignment`
        train_state/         state.json + tensors.safetensors: optimiser, scheduler, step, RNG, data position

Nothing is ever unpickled: tensors come from safetensors, structure from JSON. A directory is
written under a temporary name beside the target, fsynced, then renamed, so a run killed at any
moment leaves either the previous checkpoint or the new one, never half of one. `meta.json`
records each file's size, so truncation is reported as such rather than as a cryptic parse error.
A run directory (the trainer's output) holds step_* checkpoints and a `latest` pointer file;
`load_checkpoint(run_dir)` follows it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..core.config import ModelConfig
from ..core.model import Transformer
from ..core.version import __version__
from .tokenizer import Tokenizer, load_tokenizer

FORMAT_VERSION = 1
CONFIG, WEIGHTS, TOKENIZER, META, LOG, STATE = (
    "config.json", "model.safetensors", "tokenizer.json", "meta.json", "train_log.jsonl", "train_state",
)
ALIGNMENT = "alignment.json"  # optional, written after training: not listed in meta.json's file sizes
LATEST, BEST = "latest", "best"  # pointer files in a run directory: the name of a checkpoint beside them
POINTERS = (LATEST, BEST)


class CheckpointError(ValueError):
    """A checkpoint directory is missing, truncated or inconsistent; the message names the file and key."""


@dataclass
class Checkpoint:
    path: Path
    config: ModelConfig
    model: Transformer
    src_tokenizer: Tokenizer | None = None
    tgt_tokenizer: Tokenizer | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    train_log: list[dict[str, Any]] = field(default_factory=list)
    train_state: dict[str, Any] | None = None
    # alignment.json: the default word aligner (workbench.analysis.alignment.word_align)
    alignment: dict[str, Any] | None = None


# ------------------------------------------------------------------------------------------- saving


def save_checkpoint(
    directory: str | Path,
    model: Transformer,
    *,
    src_tokenizer: Tokenizer | None = None,
    tgt_tokenizer: Tokenizer | None = None,
    meta: dict[str, Any] | None = None,
    train_log: list[dict[str, Any]] | None = None,
    train_state: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write a checkpoint directory atomically and return its path.

    `dtype` (torch.float16 / bfloat16) stores floating weights smaller; they load as float32.
    `train_state` is any nest of dicts/lists/tuples/scalars/strings/tensors (an optimiser's
    state_dict, RNG states, the data position).
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
    model = getattr(model, "module", model)  # DDP wrapper
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; a checkpoint is meant to be shared
        model.cfg.save(tmp / CONFIG)
        weights = _unique_tensors(model.state_dict())
        if dtype is not None:
            weights = {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}
        save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(tmp / WEIGHTS))
        if src_tokenizer is not None or tgt_tokenizer is not None:
            _save_tokenizers(tmp, src_tokenizer, tgt_tokenizer)
        with open(tmp / LOG, "w", encoding="utf-8") as fh:
            for record in train_log or []:
                fh.write(json.dumps(record, sort_keys=True) + "\n")
        if train_state is not None:
            (tmp / STATE).mkdir()
            structure, tensors = _split_tensors(train_state)
            save_file(tensors, str(tmp / STATE / "tensors.safetensors"))
            (tmp / STATE / "state.json").write_text(json.dumps(structure), encoding="utf-8")
        info = {
            "format_version": FORMAT_VERSION,
            "created_by": f"attention-workbench {_version()}",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **(meta or {}),
        }
        info["files"] = {
            str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()
        }
        (tmp / META).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        _fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # outside the try: once complete, tmp may be what a pointer names, so a failure must not delete it
    _replace_dir(tmp, directory)
    return directory


def write_pointer(run_dir: str | Path, name: str, target: str) -> None:
    """Atomically point `run_dir/name` (latest, best) at the checkpoint directory `target` beside it."""
    run_dir = Path(run_dir)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.tmp-", dir=run_dir)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(target + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, run_dir / name)
    _fsync(run_dir)


def read_pointer(run_dir: str | Path, name: str = LATEST) -> Path | None:
    pointer = Path(run_dir) / name
    if not pointer.is_file():
        return None
    return Path(run_dir) / pointer.read_text(encoding="utf-8").strip()


# ------------------------------------------------------------------------------------------ loading


def is_checkpoint(directory: str | Path) -> bool:
    """True for a checkpoint directory, or a run directory whose `latest` pointer names one."""
    directory = Path(directory)
    if (directory / CONFIG).is_file() and (directory / WEIGHTS).is_file():
        return True
    target = read_pointer(directory) if directory.is_dir() else None
    return target is not None and (target / CONFIG).is_file() and (target / WEIGHTS).is_file()


def load_checkpoint(
    directory: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    with_train_state: bool = False,
) -> Checkpoint:
    """Load strictly: any missing, extra, mis-shaped or truncated piece raises `CheckpointError`."""
    path = resolve_checkpoint(directory)
    meta = _read_json(path / META, required=False) or {}
    _check_sizes(path, meta)
    try:
        config = ModelConfig.from_json((path / CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path / CONFIG} is missing") from None
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{path / CONFIG}: {exc}") from None
    model = Transformer(config)
    load_weights(model, path / WEIGHTS)
    model.to(device=device, dtype=dtype).eval()
    src_tok, tgt_tok = _load_tokenizers(path)
    log = read_log(path / LOG)
    state = _load_train_state(path / STATE) if with_train_state else None
    alignment = _read_json(path / ALIGNMENT, required=False)
    if alignment is not None and not isinstance(alignment, dict):
        raise CheckpointError(f"{path / ALIGNMENT} must hold a JSON object")
    return Checkpoint(path, config, model, src_tok, tgt_tok, meta, log, state, alignment)


def save_alignment(directory: str | Path, alignment: dict[str, Any]) -> Path:
    """Write (or replace) a checkpoint's alignment.json atomically; the other files are untouched."""
    path = resolve_checkpoint(directory)
    fd, tmp = tempfile.mkstemp(prefix=f".{ALIGNMENT}.tmp-", dir=path)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(alignment, indent=2) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path / ALIGNMENT)
    _fsync(path)
    return path / ALIGNMENT


def resolve_checkpoint(directory: str | Path) -> Path:
    """The checkpoint directory itself, or the one a run directory's `latest` pointer names."""
    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    if not (path / CONFIG).exists():
        target = read_pointer(path)
        if target is None:
            raise CheckpointError(f"{path} has no {CONFIG} and no '{LATEST}' pointer: not a checkpoint")
        if not target.is_dir():
            raise CheckpointError(f"{path / LATEST} points at {target.name}, which does not exist")
        path = target
    return path


def load_weights(model: Transformer, file: str | Path) -> None:
    """Copy a model.safetensors into `model`, refusing missing, extra or mis-shaped tensors."""
    file = Path(file)
    try:
        tensors = load_file(str(file))
    except FileNotFoundError:
        raise CheckpointError(f"{file} is missing") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{file} is not a readable safetensors file (truncated or corrupted?): {exc}") from None
    expected = model.state_dict()
    unique = _unique_tensors(expected)
    missing = sorted(set(unique) - set(tensors))
    extra = sorted(set(tensors) - set(unique))
    if missing or extra:
        raise CheckpointError(f"{file}: missing tensors {missing[:8]}, unexpected tensors {extra[:8]}")
    for key in unique:
        tensor = tensors[key]
        if tuple(tensor.shape) != tuple(unique[key].shape):
            raise CheckpointError(
                f"{file}: tensor {key!r} has shape {tuple(tensor.shape)}, the config needs {tuple(unique[key].shape)}"
            )
    aliases = _aliases(expected)
    full = {name: tensors[aliases.get(name, name)] for name in expected}
    model.load_state_dict(full, strict=True)


# ----------------------------------------------------------------------------------------- helpers


def _unique_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop state-dict entries that share storage with an earlier one (tied embeddings)."""
    aliases = _aliases(state)
    return {k: v for k, v in state.items() if k not in aliases}


def _aliases(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """{name: first name with the same storage} for every later duplicate."""
    seen: dict[tuple, str] = {}
    out: dict[str, str] = {}
    for name, t in state.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if key in seen:
            out[name] = seen[key]
        else:
            seen[key] = name
    return out


def _save_tokenizers(tmp: Path, src: Tokenizer | None, tgt: Tokenizer | None) -> None:
    spec: dict[str, Any] = {}
    if src is not None and src is tgt:
        spec["src"] = src.save(tmp, "shared")
        spec["tgt"] = "shared"
    else:
        spec["src"] = None if src is None else src.save(tmp, "src")
        spec["tgt"] = None if tgt is None else tgt.save(tmp, "tgt")
    (tmp / TOKENIZER).write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")


def _load_tokenizers(path: Path) -> tuple[Tokenizer | None, Tokenizer | None]:
    spec = _read_json(path / TOKENIZER, required=False)
    if spec is None:
        return None, None
    if not isinstance(spec, dict) or set(spec) - {"src", "tgt"}:
        raise CheckpointError(f"{path / TOKENIZER} must be an object with keys 'src' and 'tgt', got {spec!r}")
    try:
        src = None if spec.get("src") is None else load_tokenizer(path, spec["src"])
        if spec.get("tgt") == "shared":
            tgt = src
        else:
            tgt = None if spec.get("tgt") is None else load_tokenizer(path, spec["tgt"])
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{path / TOKENIZER}: {exc}") from None
    return src, tgt


def _read_json(file: Path, *, required: bool) -> Any:
    if not file.exists():
        if required:
            raise CheckpointError(f"{file} is missing")
        return None
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{file} is not valid JSON (truncated?): {exc}") from None


def read_log(file: Path) -> list[dict[str, Any]]:
    """The records of a train_log.jsonl, oldest first ([] when there is none)."""
    if not file.exists():
        return []
    out = []
    for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError as exc:
                raise CheckpointError(f"{file} line {n} is not valid JSON: {exc}") from None
    return out


def _check_sizes(path: Path, meta: dict[str, Any]) -> None:
    for name, size in (meta.get("files") or {}).items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file} is missing (listed in {META})")
        actual = file.stat().st_size
        if actual != size:
            raise CheckpointError(f"{file} has {actual} bytes but {META} records {size}: truncated or corrupted")


def _split_tensors(obj: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """JSON-able structure with {"__tensor__": key} leaves, plus the tensors by key."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            key = str(len(tensors))
            tensors[key] = x.detach().cpu().contiguous().clone()
            return {"__tensor__": key}
        if isinstance(x, dict):
            if all(isinstance(k, str) for k in x) and "__tensor__" not in x and "__items__" not in x:
                return {k: walk(v) for k, v in x.items()}
            return {"__items__": [[walk(k), walk(v)] for k, v in x.items()]}
        if isinstance(x, tuple):
            return {"__tuple__": [walk(v) for v in x]}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise TypeError(f"train_state holds a {type(x).__name__}, which the checkpoint format cannot store")

    return walk(obj), tensors


def _join_tensors(structure: Any, tensors: dict[str, torch.Tensor]) -> Any:
    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            if "__tensor__" in x:
                return tensors[x["__tensor__"]]
            if "__items__" in x:
                return {walk(k): walk(v) for k, v in x["__items__"]}
            if "__tuple__" in x:
                return tuple(walk(v) for v in x["__tuple__"])
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return walk(structure)


def _load_train_state(state_dir: Path) -> dict[str, Any]:
    if not state_dir.is_dir():
        raise CheckpointError(f"{state_dir} is missing: this checkpoint cannot resume training")
    structure = _read_json(state_dir / "state.json", required=True)
    try:
        tensors = load_file(str(state_dir / "tensors.safetensors"))
    except FileNotFoundError:
        raise CheckpointError(f"{state_dir / 'tensors.safetensors'} is missing") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{state_dir / 'tensors.safetensors'} is not readable (truncated?): {exc}") from None
    try:
        return _join_tensors(structure, tensors)
    except KeyError as exc:
        raise CheckpointError(f"{state_dir / 'state.json'} names tensor {exc} which the file lacks") from None


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*"), key=lambda p: -len(p.parts)):
        _fsync(p)
    _fsync(root)


def _fsync(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_dir(tmp: Path, target: Path) -> None:
    """Install the complete directory `tmp` as `target` so that `latest`/`best` always name a complete one.

    rename(2) cannot replace a non-empty directory, so replacing takes two renames with a moment
    between them when `target` does not exist. Pointers naming `target` (or `tmp`, after a kill)
    are first moved to `tmp`, a hard-linked copy of `tmp` is renamed in as `target`, then the
    pointers move back: a kill at any moment leaves every pointer naming a complete checkpoint, and
    `clean_stale` finishes the job on the next run.
    """
    parent = target.parent
    to_target = [n for n in POINTERS if _pointer_name(parent, n) == target.name]
    to_tmp = [n for n in POINTERS if _pointer_name(parent, n) == tmp.name]
    if not target.exists() and not to_tmp:
        os.rename(tmp, target)
        _fsync(parent)
        return
    for name in to_target:
        write_pointer(parent, name, tmp.name)
    new = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-", dir=parent))
    os.rmdir(new)
    _link_tree(tmp, new)
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=parent))
        os.rename(target, old)  # rename(2) may replace an empty directory
    os.rename(new, target)
    _fsync(parent)
    for name in to_target + to_tmp:
        write_pointer(parent, name, target.name)
    for leftover in (old, tmp):
        if leftover is not None:
            shutil.rmtree(leftover, ignore_errors=True)


def _link_tree(src: Path, dst: Path) -> None:
    """A copy of `src` at `dst` whose files are hard links (checkpoint files are never modified in place)."""
    try:
        shutil.copytree(src, dst, copy_function=os.link)
    except OSError:  # a filesystem without hard links: copy the bytes
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
    _fsync_tree(dst)


_STALE = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|new|old)-[^/]*$")


def clean_stale(run_dir: str | Path) -> list[str]:
    """Finish or remove what a killed save left in `run_dir`; returns the names removed.

    A pointer naming a leftover temporary checkpoint gets it installed under its own name; a
    pointer naming a missing directory whose old copy survived (a kill inside an older version's
    replace) gets that copy back; every other `.NAME.tmp-*`, `.NAME.new-*`, `.NAME.old-*` goes.
    Run it only while no other process writes into `run_dir` (the trainer does, at start).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    for name in POINTERS:
        pointed = _pointer_name(run_dir, name)
        match = _STALE.match(pointed or "")
        if match and match["kind"] == "tmp" and _complete(run_dir / pointed):
            _replace_dir(run_dir / pointed, run_dir / match["name"])
        elif pointed and not (run_dir / pointed).exists():
            for old in sorted(run_dir.glob(f".{pointed}.old-*")):
                copy = old / pointed if (old / pointed).is_dir() else old
                if _complete(copy):
                    os.rename(copy, run_dir / pointed)
                    break
    keep = {_pointer_name(run_dir, n) for n in POINTERS}
    removed = []
    for p in sorted(run_dir.iterdir()):
        if _STALE.match(p.name) and p.name not in keep:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p.name)
    if removed:
        _fsync(run_dir)
    return removed


def _complete(path: Path) -> bool:
    # meta.json is written last, after the weights and config
    return path.is_dir() and all((path / f).is_file() for f in (CONFIG, WEIGHTS, META))


def _pointer_name(run_dir: Path, name: str) -> str | None:
    target = read_pointer(run_dir, name)
    return None if target is None else target.name


def _version() -> str:
    return __version__

"""Reading checkpoint files without running their code: weights-only torch.load with an explicit
allow-list, inert stand-ins for other libraries' pickled classes, safetensors, JSON.
"""

from __future__ import annotations

import argparse
import pickle
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..checkpoint.toolkit_tokenizers import read_json  # noqa: F401  (one JSON reader; the importers' own name for it)
from .errors import ConversionError, UnsafeCheckpointError


class StandIn:
    """Inert object for a class a checkpoint pickles but we never use (torchtext fields, meters).

    It only stores the pickled state; it has no behaviour, so building it cannot run code.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args = args

    def __setstate__(self, state: Any) -> None:
        self.__dict__["_state"] = state

    def state(self) -> dict[str, Any]:
        st = self.__dict__.get("_state")
        if isinstance(st, tuple) and len(st) == 2 and (st[0] is None or isinstance(st[0], dict)):
            st = {**(st[0] or {}), **(st[1] or {})}
        return st if isinstance(st, dict) else {}


def stand_in(full_name: str) -> tuple[type, str]:
    """A fresh StandIn subclass registered for exactly `full_name` ("module.Class")."""
    module, _, name = full_name.rpartition(".")
    cls = type(name, (StandIn,), {"__module__": "workbench.importers.standins", "_original": full_name})
    return cls, full_name


def _unk_index() -> int:
    return 0


def _plain_dict(*args: Any) -> dict:
    """Stand-in for collections.defaultdict(factory): PyTorch's restricted unpickler only fills plain
    dicts, and we only read the stored items (torchtext's stoi), never the default."""
    return {}


def torch_load(
    path: str | Path, *, stand_ins: Iterable[str] = (), allow: Iterable[Any] = (argparse.Namespace,)
) -> Any:
    """`torch.load(weights_only=True)` plus an explicit allow-list.

    `allow` lists harmless classes by object (argparse.Namespace); `stand_ins` lists the exact
    "module.Name" globals of other libraries that a checkpoint may reference (OpenNMT-py's
    torchtext fields, fairseq's meters): each is mapped to an inert StandIn. Any other global,
    os.system included, makes PyTorch's restricted unpickler refuse the file before it runs.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such checkpoint file: {path}")
    if path.stat().st_size == 0:
        raise ConversionError(f"{path} is empty")
    globals_: list[Any] = list(allow)
    for name in stand_ins:
        if name == "torchtext.vocab._default_unk_index":
            globals_.append((_unk_index, name))  # defaultdict factory: a function returning 0
        elif name == "collections.defaultdict":
            globals_.append((_plain_dict, name))
        else:
            globals_.append(stand_in(name))
    try:
        with torch.serialization.safe_globals(globals_), warnings.catch_warnings():
            # torch warns that its restricted unpickler may not know every instruction of a newer pickle protocol;
            # what it cannot read is refused below with the reason, so the warning only repeats it
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = _unpickler_reason(str(exc))
        raise UnsafeCheckpointError(
            f"refused to load {path}: its pickle asks for something outside the allow-list, and unpickling it "
            f"could run arbitrary code, so nothing from it was executed. ({reason})"
        ) from None
    except Exception as exc:  # garbage bytes surface as EOFError, BadZipFile, IndexError, RuntimeError, ...
        raise ConversionError(
            f"cannot read {path} as a PyTorch checkpoint: it is truncated or in another format ({exc})"
        ) from None


def _unpickler_reason(message: str) -> str:
    """The one informative line of PyTorch's long weights-only refusal (the global it refused)."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if "WeightsUnpickler error:" in line:
            rest = line.split("WeightsUnpickler error:", 1)[1].strip()
            return rest or (lines[i + 1] if i + 1 < len(lines) else line)
    return next((ln for ln in lines if ln.startswith(("Unsupported global", "Trying to", "Can only"))),
                lines[0] if lines else "no detail")


def read_state_dict(path: str | Path, **kwargs: Any) -> dict[str, torch.Tensor]:
    """Tensors from a .safetensors file (preferred: no pickle at all) or a weights-only torch file."""
    path = Path(path)
    if path.suffix == ".safetensors":
        if not path.is_file():
            raise FileNotFoundError(f"no such checkpoint file: {path}")
        try:
            return load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise ConversionError(f"cannot read {path} as safetensors: truncated or another format ({exc})") from None
    data = torch_load(path, **kwargs)
    if not isinstance(data, Mapping):
        raise ConversionError(f"{path} holds a {type(data).__name__}, not a state dict")
    return dict(data)


def namespace_dict(obj: Any) -> dict[str, Any]:
    """Training options as a dict, whether pickled as argparse.Namespace, a StandIn or a dict."""
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return dict(obj)
    if isinstance(obj, argparse.Namespace):
        return vars(obj)
    if isinstance(obj, StandIn):
        return obj.state()
    raise ConversionError(f"cannot read training options of type {type(obj).__name__}")

"""`Trace`: captured activations as plain data (tensors + tokens, no model reference).

Indexes by hook name (`trace["dec.1.cross_attn.hook_probs"]`), by glob (`trace.stack(...)`), and
by (block kind, layer, head) for attention (`trace.attention("cross", 1, head=3)`). Saved and
loaded with safetensors, so a trace can be shared without pickle.
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .heads import AttentionKind, hook_name

__all__ = ["Trace"]

# the old *_tokens keys of trace files written before the *_pieces keys (read on load)
_RENAMED_META = {"src_tokens": "src_pieces", "tgt_tokens": "tgt_pieces", "out_tokens": "out_pieces"}


_TOKEN_KEYS = ("__src__", "__tgt__")


class Trace(Mapping[str, torch.Tensor]):
    def __init__(
        self,
        tensors: Mapping[str, torch.Tensor],
        *,
        src: torch.Tensor | None = None,
        tgt: torch.Tensor | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self._tensors = dict(tensors)
        self.src = src  # (B, S) source ids, or None
        self.tgt = tgt  # (B, T) decoder input ids, or None
        self.meta = dict(meta or {})  # JSON-able extras: token strings (*_pieces), checkpoint name, ...

    # -- Mapping ------------------------------------------------------------------------------
    def __getitem__(self, key: str | tuple) -> torch.Tensor:
        if isinstance(key, tuple):
            return self.attention(*key)
        try:
            return self._tensors[key]
        except KeyError:
            close = difflib.get_close_matches(key, list(self._tensors), n=5, cutoff=0.5)
            hint = f"; closest: {close}" if close else f"; captured: {sorted(self._tensors)[:8]}"
            raise KeyError(f"{key!r} is not in this trace{hint}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in list(self._tensors.items())[:4])
        more = f", ... ({len(self)} tensors)" if len(self) > 4 else ""
        return f"Trace({shapes}{more})"

    # -- selection ----------------------------------------------------------------------------
    def names(self, pattern: str = "*") -> list[str]:
        """Captured names matching a glob, in layer order (enc.2 before enc.10)."""
        return sorted(fnmatch.filter(self._tensors, pattern), key=_natural_key)

    def stack(self, pattern: str) -> torch.Tensor:
        """Stack matches along a new leading dimension in layer order, e.g. (L, B, H, T, S)."""
        names = self.names(pattern)
        if not names:
            raise KeyError(f"no captured name matches {pattern!r}; captured: {sorted(self._tensors)[:8]}")
        return torch.stack([self._tensors[n] for n in names])

    def attention(self, kind: AttentionKind, layer: int, head: int | None = None) -> torch.Tensor:
        """Attention probabilities (B, H, Lq, Lk), or (B, Lq, Lk) for one head.

        A trace of chosen heads (`run_with_cache(heads=...)`) holds (B, k, Lq, Lk) per block, its heads listed in
        `meta["heads"]`; `head` is then the model's head index, and an uncaptured one raises KeyError."""
        name = hook_name(kind, layer, "hook_probs")  # hook_name refuses unknown kinds
        probs = self[name]
        if head is None:
            return probs
        held = self.meta.get("heads", {}).get(name)
        if held is not None:
            if head not in held:
                raise KeyError(f"head {head} of {name} was not captured; this trace holds heads {held} there")
            return probs[:, held.index(head)]
        if not -probs.size(1) <= head < probs.size(1):
            raise IndexError(f"head {head} out of range: this block has {probs.size(1)} heads")
        return probs[:, head]

    def layers(self, kind: AttentionKind) -> int:
        """How many layers of this kind have attention captured."""
        return len(self.names(hook_name(kind, "*", "hook_probs")))

    # -- moving and storing -------------------------------------------------------------------
    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Trace:
        """Move activations (and ids) to `device`; cast floating activations to `dtype`."""
        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype if dtype is not None and t.is_floating_point() else None)

        ids = [None if t is None else t.to(device) for t in (self.src, self.tgt)]
        return Trace({k: move(v) for k, v in self._tensors.items()}, src=ids[0], tgt=ids[1], meta=self.meta)

    def cpu(self) -> Trace:
        return Trace({k: v.detach().cpu() for k, v in self._tensors.items()},
                     src=None if self.src is None else self.src.cpu(),
                     tgt=None if self.tgt is None else self.tgt.cpu(), meta=self.meta)

    def detach(self) -> Trace:
        return Trace({k: v.detach() for k, v in self._tensors.items()}, src=self.src, tgt=self.tgt, meta=self.meta)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    def save(self, path: str | Path) -> None:
        tensors = {k: v.detach().contiguous().cpu() for k, v in self._tensors.items()}
        for key, ids in zip(_TOKEN_KEYS, (self.src, self.tgt)):
            if ids is not None:
                tensors[key] = ids.detach().contiguous().cpu()
        save_file(tensors, str(path), metadata={"workbench_trace": json.dumps(self.meta)})

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        if "workbench_trace" not in metadata:
            raise ValueError(f"{path} is a safetensors file but not a workbench trace")
        tensors = load_file(str(path))
        src, tgt = (tensors.pop(k, None) for k in _TOKEN_KEYS)
        meta = {_RENAMED_META.get(k, k): v for k, v in json.loads(metadata["workbench_trace"]).items()}  # older files
        return cls(tensors, src=src, tgt=tgt, meta=meta)


def _natural_key(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]

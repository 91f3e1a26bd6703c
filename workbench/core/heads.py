"""Attention kinds, their hook paths, and the one spelling of a head.

    KINDS                                  # ("enc_self", "dec_self", "cross")
    block_path("cross", 1)                 # "dec.1.cross_attn"
    hook_name("cross", 1, "hook_probs")    # "dec.1.cross_attn.hook_probs"
    kind_of("dec.1.cross_attn.hook_q")     # "cross"
    Head.parse("cross:1:0")                # Head(kind='cross', layer=1, head=0); also ("cross", 1, 0)
    str(Head("cross", 1, 0))               # "cross:1:0"

Every module that maps a kind to a path, or reads and writes a head, goes through here, so the
interventions, the trace, the analyses and the views cannot disagree about where a head lives.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

AttentionKind = Literal["enc_self", "dec_self", "cross"]
KINDS: tuple[AttentionKind, ...] = ("enc_self", "dec_self", "cross")
"""Encoder self-attention, decoder self-attention, decoder cross-attention; views list them in this order."""

_BLOCK = {"enc_self": ("enc", "self_attn"), "dec_self": ("dec", "self_attn"), "cross": ("dec", "cross_attn")}


def check_kind(kind: Any) -> AttentionKind:
    """`kind` itself when it is one of KINDS, else a ValueError naming the valid ones."""
    if kind not in _BLOCK:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return kind


def stack_of(kind: AttentionKind) -> str:
    """"enc" or "dec": the stack whose layers hold blocks of this kind."""
    return _BLOCK[check_kind(kind)][0]


def block_path(kind: AttentionKind, layer: int | str) -> str:
    """Module path of a block: ("cross", 1) -> "dec.1.cross_attn"; layer "*" gives the glob over layers."""
    stack, attn = _BLOCK[check_kind(kind)]
    return f"{stack}.{layer}.{attn}"


def hook_name(kind: AttentionKind, layer: int | str, leaf: str = "hook_probs") -> str:
    """Hook point of a block: ("enc_self", 0, "hook_q") -> "enc.0.self_attn.hook_q"."""
    return f"{block_path(kind, layer)}.{leaf}"


def kind_of(name: str) -> AttentionKind | None:
    """The attention kind a hook or module path belongs to, or None outside attention blocks."""
    parts = name.split(".")
    if len(parts) < 3:
        return None
    for kind, (stack, attn) in _BLOCK.items():
        if parts[0] == stack and parts[2] == attn:
            return kind
    return None


def n_layers(cfg: Any, kind: AttentionKind) -> int:
    """Layers holding a block of this kind in a model built from `cfg` (a ModelConfig)."""
    return cfg.enc_layers if stack_of(kind) == "enc" else cfg.dec_layers


def n_heads(cfg: Any, kind: AttentionKind) -> int:
    """Heads of this kind's blocks (stacks may differ: ModelConfig.heads)."""
    return cfg.heads(stack_of(kind))


def _is_integral(x: Any) -> bool:
    """An integer of any kind (numpy's from a DataFrame row included), not a bool and not a float."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass(frozen=True, order=True)
class Head:
    """One attention head, spelled "kind:layer:head" in text (CLI, URLs, the app) and unpackable as a tuple."""

    kind: AttentionKind
    layer: int
    head: int

    def __post_init__(self) -> None:
        check_kind(self.kind)
        for name in ("layer", "head"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"head {name} must be a non-negative int, got {value!r}")

    @classmethod
    def parse(cls, spec: Head | str | tuple | list | Mapping) -> Head:
        """A Head from "cross:1:0" (what every function prints), ("cross", 1, 0), a Head, a table row or dict with
        kind / layer / head_index, or the module-path spelling "dec.1.cross_attn.head.0" (older attributions);
        a ValueError naming the spelling otherwise."""
        if isinstance(spec, Head):
            return spec
        if isinstance(spec, str):
            text = spec.strip()
            parts = text.split(":")
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() and parts[0] in _BLOCK:
                return cls(parts[0], int(parts[1]), int(parts[2]))  # type: ignore[arg-type]
            dotted = text.split(".")
            if len(dotted) == 5 and dotted[3] == "head" and dotted[1].isdigit() and dotted[4].isdigit():
                kind = kind_of(text)
                if kind is not None:
                    return cls(kind, int(dotted[1]), int(dotted[4]))
            raise ValueError(f"head {spec!r} is not kind:layer:head with kind in {KINDS}")
        if isinstance(spec, Mapping) or hasattr(spec, "keys") and hasattr(spec, "__getitem__"):
            keys = set(spec.keys())
            index = "head_index" if "head_index" in keys else "head"
            if {"kind", "layer", index} <= keys:
                return cls.parse((spec["kind"], spec["layer"], spec[index]))
            raise ValueError(f"head {dict(spec)!r} lacks kind, layer and head_index")
        if isinstance(spec, (tuple, list)) and len(spec) == 3:
            kind, layer, head = spec
            layer, head = (int(x) if isinstance(x, str) and x.isdigit() or _is_integral(x) else x
                           for x in (layer, head))
            return cls(kind, layer, head)
        raise ValueError(f"head {spec!r} is not 'kind:layer:head' or a (kind, layer, head) tuple")

    def __str__(self) -> str:
        return f"{self.kind}:{self.layer}:{self.head}"

    @property
    def block(self) -> str:
        """Module path of the head's block ("dec.1.cross_attn")."""
        return block_path(self.kind, self.layer)

    def hook_name(self, leaf: str = "hook_context") -> str:
        """A hook point of the head's block; hook_context (B, H, L, Dh) is where head edits act."""
        return hook_name(self.kind, self.layer, leaf)

    def check(self, cfg: Any) -> Head:
        """self, or a ValueError when a model built from `cfg` has no such head."""
        depth, heads = n_layers(cfg, self.kind), n_heads(cfg, self.kind)
        if not (self.layer < depth and self.head < heads):
            raise ValueError(f"head {self} does not exist: this model has {depth} {self.kind} layers "
                             f"of {heads} heads")
        return self

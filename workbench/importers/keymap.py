"""Key-map tables: where each of our tensors comes from, checked key by key and shape by shape.

An importer is a table `{our key: Source(their keys, transform)}` built for one config. `convert`
checks that every key of our model has a source, that every source key exists, that every
transformed tensor has exactly our shape, and that no source key is left over unless the table
says why it may be (positional tables we recompute, version counters). Nothing is copied before
all of that has been checked, so a bad file fails with the key's name, not a half-loaded model.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..core.config import ModelConfig
from ..core.model import Transformer
from .errors import ConversionError
from .result import ImportReport

Transform = Callable[[list[torch.Tensor]], torch.Tensor]

ACTIVATIONS = {"swish": "swish", "silu": "silu", "relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh"}
"""Activation names the toolkits use -> ModelConfig.activation."""


# ------------------------------------------------------------------------ named transforms


@dataclass(frozen=True)
class Source:
    """Where one of our tensors comes from: source keys plus a named transform over them."""

    keys: tuple[str, ...]
    transform: Transform
    name: str = "copy"

    def describe(self) -> str:
        keys = ", ".join(self.keys)
        return keys if self.name == "copy" else f"{self.name}({keys})"


def copy(key: str) -> Source:
    return Source((key,), lambda ts: ts[0], "copy")


def chunk(key: str, index: int, parts: int = 3) -> Source:
    """Row block `index` of `parts`: fused q/k/v `in_proj_weight` (fairseq 2018, PyTorch MHA)."""
    return Source((key,), lambda ts: ts[0].chunk(parts, dim=0)[index], f"chunk{index}/{parts}")


def flatten(key: str) -> Source:
    """(1, V) -> (V,): Marian's final_logits_bias buffer is kept as a row vector."""
    return Source((key,), lambda ts: ts[0].reshape(-1), "flatten")


def transpose(key: str) -> Source:
    """(in, out) -> (out, in): for sources that store Linear weights as x @ W (TF/Marian-C++ style)."""
    return Source((key,), lambda ts: ts[0].t().contiguous(), "transpose")


# ------------------------------------------------------------------------------ convert


def convert(
    source: Mapping[str, torch.Tensor],
    table: Mapping[str, Source],
    target: Mapping[str, torch.Tensor],
    *,
    ignore: Mapping[str, str] | None = None,
    report: ImportReport,
) -> dict[str, torch.Tensor]:
    """Build our state dict from `source` through `table`, checking keys and shapes first.

    `target` is our model's state dict (for names and shapes); `ignore` maps source keys (or
    prefixes ending in '*') that may be left unused to the reason, which goes into the report.
    Raises ConversionError naming the first missing, extra or mis-shaped key.
    """
    ignore = dict(ignore or {})
    missing_rules = [k for k in target if k not in table]
    if missing_rules:
        raise ConversionError(f"{report.source_format} importer has no source for our key(s) {missing_rules}")
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for key, rule in table.items():
        if key not in target:
            raise ConversionError(f"{report.source_format} importer maps to {key!r}, which this config's model lacks")
        absent = [k for k in rule.keys if k not in source]
        if absent:
            raise ConversionError(
                f"{report.source}: missing key {absent[0]!r} (needed for our {key!r}); "
                f"the file has {len(source)} keys, e.g. {_closest(absent[0], source)}"
            )
        tensors = [source[k] for k in rule.keys]
        for k, t in zip(rule.keys, tensors):
            if not isinstance(t, torch.Tensor):
                raise ConversionError(f"{report.source}: {k!r} is a {type(t).__name__}, not a tensor")
        value = rule.transform(tensors)
        want = tuple(target[key].shape)
        if tuple(value.shape) != want:
            raise ConversionError(
                f"{report.source}: shape mismatch for our {key!r} from {rule.describe()}: "
                f"got {tuple(value.shape)}, expected {want}"
            )
        out[key] = value.to(target[key].dtype).contiguous()
        used.update(rule.keys)
        report.converted[key] = rule.describe()
    extra = []
    for k in source:
        if k in used:
            continue
        why = _ignored(k, ignore)
        if why is None:
            extra.append(k)
        else:
            report.ignored[k] = why
    if extra:
        raise ConversionError(
            f"{report.source}: unexpected key {extra[0]!r}"
            + (f" (and {len(extra) - 1} more: {extra[1:6]})" if len(extra) > 1 else "")
            + "; the file has weights this importer does not know how to place, so the converted model "
            "would not match the original"
        )
    return out


def _ignored(key: str, ignore: Mapping[str, str]) -> str | None:
    for pattern, why in ignore.items():
        if pattern.endswith("*") and key.startswith(pattern[:-1]) or key == pattern:
            return why
    return None


def _closest(key: str, keys: Iterable[str]) -> list[str]:
    return difflib.get_close_matches(key, list(keys), n=3, cutoff=0.5) or list(keys)[:3]


def layer_count(keys: Iterable[str], prefix: str) -> int:
    """Number of layers from keys like f"{prefix}{i}.<rest>" (0-based, contiguous)."""
    seen = set()
    for k in keys:
        if k.startswith(prefix):
            head = k[len(prefix) :].split(".", 1)[0]
            if head.isdigit():
                seen.add(int(head))
    if seen and seen != set(range(len(seen))):
        raise ConversionError(f"layers under {prefix!r} are not numbered 0..n-1: {sorted(seen)}")
    return len(seen)


# ------------------------------------------------------------------------- checks and sizes


def check_aliases(sd: Mapping[str, torch.Tensor], used: str, aliases: Iterable[str]) -> dict[str, str]:
    """Ignore-entries for keys that hold the same tensor as `used` (tied weights saved twice).

    A 'tied' copy that differs would mean the original does not really tie them: that is an error.
    """
    out = {}
    for key in aliases:
        if key == used or key not in sd:
            continue
        if sd[key].shape != sd[used].shape or not torch.equal(sd[key], sd[used]):
            raise ConversionError(f"{key!r} should be a tied copy of {used!r} but holds different values")
        out[key] = f"tied copy of {used}"
    return out


def first_present(sd: Mapping[str, Any], *keys: str) -> str:
    for k in keys:
        if k in sd:
            return k
    raise ConversionError(f"missing key {keys[0]!r} (also looked for {list(keys[1:])})")


def check_table(
    sd: Mapping[str, torch.Tensor], key: str, expected: torch.Tensor, what: str, start: int = 0
) -> str:
    """Verify a stored sinusoidal table equals the one our config computes; return an ignore reason.

    Rows before `start` are skipped (fairseq/FSMT keep a zero row at padding_idx there).
    """
    got = sd[key].float()
    n = min(got.size(0), expected.size(0))
    # 1e-3: tables built in float32 drift by ~1e-4 at position 5000 (sin of a large float32 angle);
    # a different layout or frequency differs by O(1)
    if got.shape[1:] != expected.shape[1:] or not torch.allclose(got[start:n], expected[start:n], atol=1e-3):
        raise ConversionError(f"{key!r} is not the {what} table our config computes; positions would differ")
    return f"fixed sinusoidal table, recomputed as {what} (checked equal)"


def per_stack(enc_heads: int, dec_heads: int, enc_ffn: int, dec_ffn: int) -> dict[str, Any]:
    """ModelConfig head/FFN fields for a file that gives each stack its own values (n_heads/d_ff are
    the encoder's; dec_heads/dec_d_ff are set only where the decoder differs)."""
    return {"n_heads": enc_heads, "d_ff": enc_ffn, "dec_heads": None if dec_heads == enc_heads else dec_heads,
            "dec_d_ff": None if dec_ffn == enc_ffn else dec_ffn}


# ----------------------------------------------------------------------------- our model


def build_model(cfg: ModelConfig, converted: dict[str, torch.Tensor]) -> Transformer:
    """A Transformer for `cfg` holding exactly the converted tensors (strict load), in eval mode."""
    model = Transformer(cfg)
    model.load_state_dict(converted, strict=True)
    return model.eval()


def target_state(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state-dict names and shapes for `cfg` (on the meta device: no memory, no init cost)."""
    with torch.device("meta"):
        return Transformer(cfg).state_dict()

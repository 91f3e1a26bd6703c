"""What every importer shares: safe file reading, key-map tables, named transforms, reports.

An importer is a table `{our key: Source(their keys, transform)}` built for one config. `convert`
checks that every key of our model has a source, that every source key exists, that every
transformed tensor has exactly our shape, and that no source key is left over unless the table
says why it may be (positional tables we recompute, version counters). Nothing is copied before
all of that has been checked, so a bad file fails with the key's name, not a half-loaded model.
"""

from __future__ import annotations

import argparse
import json
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

Transform = Callable[[list[torch.Tensor]], torch.Tensor]


class ConversionError(ValueError):
    """A source checkpoint that cannot be converted; the message names the file or key."""


class UnsafeCheckpointError(ConversionError):
    """The file's pickle asks for code we do not allow (it might run arbitrary commands)."""


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


# ---------------------------------------------------------------------------- the report


@dataclass
class ImportReport:
    """What was converted from where, what was ignored (and why), what is assumed."""

    source_format: str
    source: str
    converted: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source_format": self.source_format,
            "source": self.source,
            "converted": dict(self.converted),
            "ignored": dict(self.ignored),
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        lines = [f"imported {self.source_format} checkpoint {self.source}: {len(self.converted)} tensors converted"]
        transformed = {k: v for k, v in self.converted.items() if "(" in v}
        if transformed:
            lines.append(f"  {len(transformed)} through a transform, e.g. {next(iter(transformed.items()))}")
        for key, why in sorted(self.ignored.items()):
            lines.append(f"  ignored {key}: {why}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


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
    import difflib

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


# -------------------------------------------------------------------------- safe reading


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
        with torch.serialization.safe_globals(globals_):
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
        from safetensors import SafetensorError
        from safetensors.torch import load_file

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


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"expected {path.name} in {path.parent}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConversionError(f"{path} is not valid JSON: {exc}") from None


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


# ------------------------------------------------------------------------- the result


@dataclass
class Imported:
    """A converted model with its tokenizers, decoding defaults and conversion report."""

    model: Any  # workbench.model.Transformer
    report: ImportReport
    src_tokenizer: Any = None
    tgt_tokenizer: Any = None
    generation: dict[str, Any] = field(default_factory=dict)
    """append_eos plus DecodeConfig fields (beam, length_penalty {kind, alpha}, max_len...)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """More meta.json entries: languages, ids the original forbids, ..."""

    def meta(self) -> dict[str, Any]:
        return {
            "source_format": self.report.source_format,
            "generation": dict(self.generation),
            "import_report": self.report.to_dict(),
            **self.extra,
        }

    def save(self, directory: str | Path) -> Path:
        from ..checkpoint import save_checkpoint

        return save_checkpoint(
            directory, self.model, src_tokenizer=self.src_tokenizer, tgt_tokenizer=self.tgt_tokenizer, meta=self.meta()
        )


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


def fairseq_layers(enc: str, dec: str, n_enc: int, n_dec: int, bias: bool = True) -> dict[str, Source]:
    """Per-layer rules for the fairseq naming that FSMT, HF Marian and fairseq itself share.

    `enc`/`dec` are the layer prefixes, e.g. "model.encoder.layers." and "model.decoder.layers.".
    """
    table: dict[str, Source] = {}
    params = ("weight", "bias") if bias else ("weight",)

    def attn(ours: str, theirs: str) -> None:
        for p in ("q", "k", "v", "out"):
            for w in params:
                table[f"{ours}.{p}_proj.{w}"] = copy(f"{theirs}.{p}_proj.{w}")

    def norm(ours: str, theirs: str) -> None:
        for w in ("weight", "bias"):
            table[f"{ours}.{w}"] = copy(f"{theirs}.{w}")

    def ffn(ours: str, theirs: str) -> None:
        for w in params:
            table[f"{ours}.up_proj.{w}"] = copy(f"{theirs}.fc1.{w}")
            table[f"{ours}.down_proj.{w}"] = copy(f"{theirs}.fc2.{w}")

    for i in range(n_enc):
        attn(f"enc.{i}.self_attn", f"{enc}{i}.self_attn")
        norm(f"enc.{i}.self_attn_norm", f"{enc}{i}.self_attn_layer_norm")
        ffn(f"enc.{i}.ffn", f"{enc}{i}")
        norm(f"enc.{i}.ffn_norm", f"{enc}{i}.final_layer_norm")
    for j in range(n_dec):
        attn(f"dec.{j}.self_attn", f"{dec}{j}.self_attn")
        norm(f"dec.{j}.self_attn_norm", f"{dec}{j}.self_attn_layer_norm")
        attn(f"dec.{j}.cross_attn", f"{dec}{j}.encoder_attn")
        norm(f"dec.{j}.cross_attn_norm", f"{dec}{j}.encoder_attn_layer_norm")
        ffn(f"dec.{j}.ffn", f"{dec}{j}")
        norm(f"dec.{j}.ffn_norm", f"{dec}{j}.final_layer_norm")
    return table


def build_model(cfg: Any, converted: dict[str, torch.Tensor]) -> Any:
    """A Transformer for `cfg` holding exactly the converted tensors (strict load), in eval mode."""
    from ..model import Transformer

    model = Transformer(cfg)
    model.load_state_dict(converted, strict=True)
    return model.eval()


def target_state(cfg: Any) -> dict[str, torch.Tensor]:
    """Our state-dict names and shapes for `cfg` (on the meta device: no memory, no init cost)."""
    from ..model import Transformer

    with torch.device("meta"):
        return Transformer(cfg).state_dict()

"""The replacement model: the model's own modules, run with chosen parts frozen at a clean run's values.

    rm = ReplacementModel(model, src, tgt, freeze=FREEZABLE, dtype=torch.float64)
    logits = rm()                                   # the frozen model on the clean input: equals model(src, tgt)
    with rm.frozen():                               # the freezing hooks, for anything run inside the block
        out = rm.model(other_src, tgt)              # (same lengths) attention, norms and gates held at the clean run
    rm.clean[name]                                  # what the clean run wrote at hook point `name` (batch axis kept)

Freezing is done with the model's hook points, never by re-deriving the forward pass: `hook_probs` returns the clean
attention pattern (so nothing flows into queries and keys), each norm's `hook_scale` returns the clean divisor (the
norm is then affine: `LayerNorm.linear` + bias), and each FFN's `hook_hidden` returns its pre-activation times the
clean gate activation(pre) / pre (the ReLU mask for ReLU models). What is left is linear in the residual streams,
which is what attribution graphs (circuit-tracer's local replacement model, Ameisen et al. 2025), EAP circuits with
frozen norms and ALTI+ decompose. With `freeze=()` it is the model itself (in `dtype`).

fp64: `dtype=torch.float64` runs a float64 copy of the model (the caller's model is never converted), so
completeness checks hold to ~1e-12 instead of fp32's ~1e-6.

Per-head query, key and value inputs (`hook_q_input` / `hook_k_input` / `hook_v_input`, (B, L, H, D)) and each
sub-layer's write (`Sublayer.block.hook_out`) are ordinary hook points: an edge from any upstream node into a
head's query, key or value is read and edited there, inside `rm.frozen()` or not. How the blocks of a layer compose
(pre- or post-norm) is said once, by `_Layer.compose`, which the forward pass runs.

Dictionaries: `splices={site: dictionary}` (a hook point such as "hook_memory" or "dec.0.cross_attn.hook_out" for an
SAE, an FFN path such as "dec.1.ffn" for a transcoder, as `core.splice.attach` takes them) are attached to the model
inside `frozen(extra)` and `rm(extra=...)` when hooks are given, so `<site>.sae.hook_acts` / `hook_recons` /
`hook_error` can be read and edited in `extra`. `clean[...]` holds those points' clean values
(`rm.features[site].acts_name`), computed as the splice computes them (the dictionary in float32 on the site's
input), without listening to the splice during the clean run: a listened splice hands its site's output through
float32, which would round a float64 run. Freezing "features" (with
`freeze=(*FREEZABLE, "features")`) makes the local replacement model of circuit-tracer: each site's output becomes
its dictionary's reconstruction with the active set held at the clean run's (every active feature's activation
equals its pre-activation there, for TopK, BatchTopK, JumpReLU and ReLU alike, so it is linear in what the
dictionary reads), plus the clean error (y - reconstruction) as a constant, all in the replacement model's dtype. At
the clean input that is the site's clean output; the gradient then flows through the active features only, so an
attribution graph with feature nodes has one set of gradients for its nodes and edges.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from .hooks import HookPoint
from .layers import LayerNorm, Sublayer
from .model import evaluating
from .splice import SPLICE, Splice, _run_splice, attach, site_module

FREEZABLE = ("attention", "norms", "gates")
"""What can be frozen: attention patterns (`hook_probs`), layer-norm scales (`hook_scale`), FFN gates."""
FEATURES = "features"
"""Also freezable, with `splices`: each dictionary's active set and error (see the module docstring)."""


def _norms(model) -> list[Any]:
    """Every layer norm of the model, in module order (embedding norms, sub-layer norms, final norms)."""
    return [m for m in model.modules() if isinstance(m, LayerNorm)]


def capture_names(model, freeze: Iterable[str] = FREEZABLE) -> list[str]:
    """The hook points a clean run records for `freeze`: attention probabilities, norm scales, FFN pre-activations
    and activations."""
    names: list[str] = []
    for stack in ("enc", "dec"):
        for _, sub in model.stream(stack).sublayers():
            if sub.is_attention and "attention" in freeze:
                names.append(sub.block.hook_probs.name)
            if not sub.is_attention and "gates" in freeze:
                names += [sub.block.hook_pre.name, sub.block.hook_hidden.name]
    if "norms" in freeze:
        names += [norm.hook_scale.name for norm in _norms(model)]
    return names


def gate_of(pre: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """activation(pre) / pre, 0 where pre is 0: the factor a frozen FFN multiplies its pre-activation by."""
    nonzero = pre != 0
    return torch.where(nonzero, hidden / torch.where(nonzero, pre, torch.ones_like(pre)), torch.zeros_like(pre))


class ReplacementModel:
    """`model` with `freeze` ⊆ FREEZABLE held at the run on (`src`, `tgt`), in `dtype` (see the module docstring).

    `names` adds hook points to record in the clean run (`clean[name]`); `rm.model` is the module that runs (the
    caller's model, or its float64 copy)."""

    def __init__(self, model, src: torch.Tensor, tgt: torch.Tensor, *, freeze: Iterable[str] = FREEZABLE,
                 dtype: torch.dtype = torch.float32, names: Iterable[str] = (),
                 splices: Mapping[str, Any] | None = None) -> None:
        freeze = tuple(freeze)
        unknown = sorted(set(freeze) - {*FREEZABLE, FEATURES})
        if unknown:
            raise ValueError(f"cannot freeze {', '.join(unknown)}: choose from {', '.join((*FREEZABLE, FEATURES))}")
        if FEATURES in freeze and not splices:
            raise ValueError("freezing features needs dictionaries: pass splices={site: dictionary}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self.freeze = freeze
        self.dtype = dtype
        self.model = model if model.output_proj.weight.dtype == dtype else _copy_as(model, dtype)
        self.src, self.tgt = src.to(self.model.device), tgt.to(self.model.device)
        self.splices = dict(splices or {})
        self.features: dict[str, SiteFeatures] = {}
        site_names: list[str] = []
        for site in self.splices:
            module = site_module(self.model, site)
            io = (module.name, module.name) if isinstance(module, HookPoint) else (module.hook_in.name,
                                                                                   module.hook_out.name)
            site_names += io
        wanted = list(dict.fromkeys([*capture_names(self.model, freeze), *names, *site_names]))
        with evaluating(self.model), torch.no_grad():
            self.logits, trace = self.model.run_with_cache(self.src, self.tgt, names=wanted)
        self.clean: dict[str, torch.Tensor] = {name: trace[name] for name in wanted}
        if self.splices:
            with self._attached() as points:
                for site, dictionary in self.splices.items():
                    sf = SiteFeatures.of(site, site_module(self.model, site), dictionary, points[site], self.clean,
                                         dtype)
                    self.features[site] = sf
                    self.clean[sf.acts_name], self.clean[sf.error_name] = sf.acts, sf.error
        self._gates: dict[str, torch.Tensor] = {}
        self._spec: list[tuple[str, Any]] | None = None
        if "gates" in freeze:
            for _, sub in self.sublayers():
                if not sub.is_attention:
                    ffn = sub.block
                    self._gates[ffn.hook_hidden.name] = gate_of(self.clean[ffn.hook_pre.name],
                                                                self.clean[ffn.hook_hidden.name])

    # -- what the clean run fixed -----------------------------------------------------------------------------
    def sublayers(self, stack: str | None = None) -> list[tuple[int, Sublayer]]:
        """(layer, sub-layer) of one stack, or of the encoder then the decoder, in the order they write."""
        stacks = ("enc", "dec") if stack is None else (stack,)
        return [item for s in stacks for item in self.model.stream(s).sublayers()]

    def scale(self, norm) -> torch.Tensor:
        """The clean divisor of `norm`, (B, L, 1)."""
        return self.clean[norm.hook_scale.name]

    def probs(self, block) -> torch.Tensor:
        """The clean attention pattern of `block`, (B, H, Lq, Lk)."""
        return self.clean[block.hook_probs.name]

    def gate(self, ffn) -> torch.Tensor:
        """The clean gate of `ffn`, (B, L, F): its activation over its pre-activation."""
        return self._gates[ffn.hook_hidden.name]

    # -- running it ---------------------------------------------------------------------------------------------
    def hooks(self) -> list[tuple[str, Any]]:
        """(hook name, function) pairs that hold the frozen parts; a batch of any size reuses the clean values."""
        if self._spec is None:
            self._spec = self._freezing_hooks()
        return self._spec

    def _freezing_hooks(self) -> list[tuple[str, Any]]:
        spec: list[tuple[str, Any]] = []
        if FEATURES in self.freeze:
            for sf in self.features.values():
                spec += sf.hooks()

        def hold(value: torch.Tensor):
            def fn(x: torch.Tensor, hook: HookPoint) -> torch.Tensor:
                return value.expand_as(x) if value.shape != x.shape else value
            return fn

        for name, value in self.clean.items():
            if name.endswith((".hook_probs", ".hook_scale")):
                spec.append((name, hold(value)))
        for name, gate in self._gates.items():
            pre_name = name[: -len("hook_hidden")] + "hook_pre"
            seen: list[torch.Tensor] = []

            def keep(x: torch.Tensor, hook: HookPoint, seen=seen) -> None:
                seen.append(x)

            def gated(x: torch.Tensor, hook: HookPoint, seen=seen, gate=gate) -> torch.Tensor:
                return seen.pop() * (gate.expand_as(x) if gate.shape != x.shape else gate)

            spec += [(pre_name, keep), (name, gated)]
        return spec

    @contextlib.contextmanager
    def frozen(self, extra: Iterable[tuple[str, Any]] = ()) -> Iterator[None]:
        """Run the block with the frozen parts held (plus `extra` (name, function) hooks, after them)."""
        extra = list(extra)
        with evaluating(self.model), self._attached(bool(extra)), self.model.hooks([*self.hooks(), *extra]):
            yield

    @contextlib.contextmanager
    def _attached(self, attaching: bool = True) -> Iterator[dict[str, Any]]:
        """The dictionaries attached to `self.model` ({site: Splice}) when `attaching`. `frozen()` attaches them only
        when it is given hooks, which may listen at their points: attaching renames the model's hook points
        (8 ms a splice on the shipped model), and a graph runs the frozen model ~30 times."""
        with contextlib.ExitStack() as stack:
            yield {site: stack.enter_context(attach(self.model, site, d)) for site, d in self.splices.items()
                   if attaching}

    def __call__(self, src: torch.Tensor | None = None, tgt: torch.Tensor | None = None,
                 extra: Iterable[tuple[str, Any]] = ()) -> torch.Tensor:
        """Logits of the frozen model on (`src`, `tgt`) (default: the clean input), with `extra` hooks."""
        src = self.src if src is None else src.to(self.model.device)
        tgt = self.tgt if tgt is None else tgt.to(self.model.device)
        with self.frozen(extra):
            return self.model(src, tgt)


class SiteFeatures:
    """One dictionary's site in the replacement model: what it read and wrote in the clean run, its active set and
    activations (float32, as the splice computes them; `pre` in the model's dtype: on the active set it is the
    activation), its error, and its weights in the model's dtype."""

    def __init__(self, site: str, transcoder: bool, hook_in: str, hook_out: str, acts_name: str, error_name: str,
                 acts: torch.Tensor, error: torch.Tensor, active: torch.Tensor, pre: torch.Tensor,
                 residual: torch.Tensor, weights: dict[str, torch.Tensor | None]) -> None:
        self.site, self.transcoder, self.hook_in, self.hook_out = site, transcoder, hook_in, hook_out
        self.acts_name, self.error_name = acts_name, error_name
        self.acts, self.error = acts, error  # (B, L, d_sae), (B, L, d_out): float32, the splice's values
        self.active = active  # (B, L, d_sae) bool: the clean active set
        self.pre = pre  # (B, L, d_sae) model dtype: pre-activations at the clean input
        self.residual = residual  # (B, L, d_out) model dtype: y - reconstruction from the active set (the error)
        self.W_enc, self.b_enc, self.W_dec, self.b_dec = (weights[k] for k in ("W_enc", "b_enc", "W_dec", "b_dec"))
        self.W_skip = weights["W_skip"]

    @classmethod
    def of(cls, site: str, module, dictionary, splice, clean: dict[str, torch.Tensor], dtype: torch.dtype
           ) -> SiteFeatures:
        transcoder = not isinstance(module, HookPoint)
        hook_in, hook_out = (module.name, module.name) if not transcoder else (module.hook_in.name,
                                                                             module.hook_out.name)
        x, y = clean[hook_in], clean[hook_out]
        with torch.no_grad():
            xf = x.float()
            acts = dictionary.encode(xf)
            skip = getattr(dictionary, "skip", None)
            error = y.float() - (dictionary.decode(acts) + (skip(xf) if skip is not None else 0.0))
            weights = {k: (getattr(dictionary, k).detach().to(dtype) if getattr(dictionary, k, None) is not None
                           else None) for k in ("W_enc", "b_enc", "W_dec", "b_dec")}
            cfg = getattr(dictionary, "cfg", None)
            weights["W_skip"] = (dictionary.W_skip.detach().to(dtype) if cfg is not None and cfg.skip else None)
            out = cls(site, transcoder, hook_in, hook_out, splice.hook_acts.name, splice.hook_error.name, acts,
                      error, acts != 0, torch.zeros(0), torch.zeros(0), weights)
            out.pre = out.pre_activations(x)
            out.residual = y - out.reconstruct(x, out.pre * out.active)
        return out

    def pre_activations(self, x: torch.Tensor) -> torch.Tensor:
        """(…, d_sae): what each feature's activation is, on the active set, as a linear function of `x`."""
        return (x if self.transcoder else x - self.b_dec) @ self.W_enc + self.b_enc

    def reconstruct(self, x: torch.Tensor, acts: torch.Tensor) -> torch.Tensor:
        out = acts @ self.W_dec + self.b_dec
        return out if self.W_skip is None else out + x @ self.W_skip.T

    def replaced(self, x: torch.Tensor) -> torch.Tensor:
        """The site's output in the replacement model: the active features (linear in `x`) decoded, plus the clean
        error."""
        active = self.active if self.active.shape[:-1] == x.shape[:-1] else self.active.expand(*x.shape[:-1], -1)
        residual = self.residual if self.residual.shape == x.shape else self.residual.expand(*x.shape[:-1], -1)
        return self.reconstruct(x, self.pre_activations(x) * active) + residual

    def hooks(self) -> list[tuple[str, Any]]:
        """Hooks that replace the site's output by `replaced` (a transcoder: from the FFN's input)."""
        if not self.transcoder:
            return [(self.hook_in, lambda x, hook: self.replaced(x))]
        seen: list[torch.Tensor] = []

        def keep(x: torch.Tensor, hook: HookPoint) -> None:
            seen.append(x)

        def out(y: torch.Tensor, hook: HookPoint) -> torch.Tensor:
            return self.replaced(seen.pop())

        return [(self.hook_in, keep), (self.hook_out, out)]


def _drop_splices(twin) -> None:
    """Remove the dictionary splices a copy took from its model (a copy made while the app had a dictionary spliced
    would otherwise hold its own copy of that dictionary, and refuse the original at that site)."""
    dropped = False
    for module in twin.modules():
        sae = module._modules.get(SPLICE)
        if isinstance(sae, Splice):
            del module._modules[SPLICE]
            for key, hook in list(module._forward_hooks.items()):
                if hook is _run_splice:
                    del module._forward_hooks[key]
            dropped = True
    if dropped:
        twin.refresh_hook_points()


_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TWINS_LOCK = threading.Lock()


def _copy_as(model, dtype: torch.dtype):
    """A copy of `model` in `dtype`, kept while the model lives and its parameters are unchanged (an in-place
    update, such as an optimizer step or `load_state_dict`, bumps a parameter's version and makes a new copy):
    copying the shipped model to float64 took 0.13 s per graph."""
    versions = tuple((p.data_ptr(), p._version) for p in model.parameters())
    with _TWINS_LOCK:
        cached = _TWINS.get(model, {}).get(dtype)
        if cached is not None and cached[0] == versions:
            return cached[1]
    twin = copy.deepcopy(model).to(dtype)
    twin.requires_grad_(False)  # analyses take gradients with respect to activations, never the weights
    _drop_splices(twin)
    with _TWINS_LOCK:
        _TWINS.setdefault(model, {})[dtype] = (versions, twin)
    return twin

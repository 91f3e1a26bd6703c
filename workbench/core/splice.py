"""Dictionary splices: a sparse dictionary's activations, reconstruction and error as hook points of the model.

    with attach(model, "hook_memory", sae) as s:           # model.hook_memory.sae is `s`, a Splice
        with model.hooks({s.hook_acts.name: clamp_12}):    # "hook_memory.sae.hook_acts", (B, S, d_sae)
            logits = model(src, tgt_in)
    with attach(model, "dec.1.ffn", transcoder): ...       # a transcoder: the FFN's input -> its output
    model.hooks(steering_hooks(model, {"hook_memory": {12: 5.0}}))   # clamp feature 12 to 5 at every position

(`workbench.features.splice(model, dictionary)` does the same, reading the site from the dictionary's config.)

A site is a hook point, which an SAE reads and rewrites, or a block with an input and an output (an FFN:
"dec.1.ffn"), whose input a transcoder reads and whose output it rewrites. The splice is a child module named
`sae` of that module, so its hook points are part of the module tree, named as every other one, and reached by
every way in: the workbench's `model.hooks`, plain `register_forward_hook`, nnsight, in teacher forcing and in
every step of greedy and beam search (decoder sites run per step on the new position; encoder sites once):

    <site>.sae.hook_acts    (B, L, d_sae)  the features, f = encode(x)
    <site>.sae.hook_recons  (B, L, d_out)  the reconstruction decode(f) + skip(x), plus the decoded feature edit
    <site>.sae.hook_error   (B, L, d_out)  the error y - reconstruction, from the clean features

What the site outputs, with y its clean output (a hook point's tensor; an FFN's output) and x what the dictionary
reads (y itself for an SAE; the FFN's input for a transcoder):

    out = y + (f' - f) W_dec + (r' - r) + (e' - e)

where f', r', e' are what the hooks left (r: the reconstruction plus the decoded feature edit, as hook_recons saw
it). In exact arithmetic that is r' + e', SAELens's error term (`use_error_term`: the spliced model computes the
clean model's function while features stay readable and editable). It is written as y plus the edits so that a
site nobody edits returns y itself, bit for bit, not the rounding of r + (y - r): an edit that changes nothing
(adding 0 to a feature) adds exact zeros, so steering by 0 gives bit-identical translations. Zeroing the error
gives the reconstruction within float rounding. The dictionary runs in float32 whatever the model's dtype; the
output is cast back.

When none of the three hook points is listened to (in this context, or by a plain PyTorch hook), the splice is
the identity and runs no dictionary work. That is why a splice on the app's shared model is safe between
sessions: another session's forward passes are unchanged, and edits are call-scoped hooks like any other. The
splice itself still changes the shared module tree, so `attach` counts its users: sessions attaching the same
dictionary at the same site share one splice, the last `detach` removes it, and a different dictionary at a
spliced site is an error. Prefer the context-manager form.

Speed: with no hook at its points a splice costs nothing. A steer (`steering_hooks`) declares the features it
edits (`edits_features`), so the splice encodes only those (no (B, L, d_sae) array, copy or comparison; the dense
encoder only on rows where one of them may be positive), equal to the dense path within float rounding; on CPU the
dense path runs over row blocks that stay in cache and decodes only the feature columns an edit changed.

How it is wired: the splice runs as a forward hook registered on the site's module (first among its forward
hooks), so the workbench's `HookPoint` fast path is untouched (a point with no splice is still one integer test),
and an FFN's input and output reach the transcoder without a stash. Call-scoped hooks on the site's own hook
point run before the splice (they edit what the dictionary reads); plain forward hooks on it see the spliced
output.
"""

from __future__ import annotations

import difflib
import operator
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from .hooks import HookFn, HookPoint, marked, name_hook_points, observed

SPLICE = "sae"
"""The child module's name: `<site>.sae.hook_acts`, as SAELens's `HookedSAETransformer` names the spliced SAE's."""


class Dictionary(Protocol):
    """What a splice needs: SAELens's inference surface (`workbench.features.SparseDictionary` is one)."""

    W_dec: torch.Tensor  # (d_sae, d_out): linear decoder, so a feature edit decodes to (f' - f) W_dec

    def encode(self, x: torch.Tensor) -> torch.Tensor: ...  # (..., d_in) -> (..., d_sae)

    def decode(self, feats: torch.Tensor) -> torch.Tensor: ...  # (..., d_sae) -> (..., d_out)

    # optional: encode_features(x, features) -> (..., len(features)), encode(x)[..., features] within float
    # rounding (0 where encode gives 0), cheaper than the dense features: lets a steer that declares its features
    # skip most of the encoder


class Splice(nn.Module):
    """A dictionary at a site (see the module docstring). The dictionary is held, not registered as a child: its
    weights stay out of the model's `state_dict` and `parameters()` (saving or training the model ignores it)."""

    def __init__(self, dictionary: Dictionary, *, reads_input: bool) -> None:
        super().__init__()
        self._dictionary = (dictionary,)  # a tuple, so nn.Module does not register it
        self.reads_input = reads_input  # True: a transcoder, reading the block's input
        self.users = 0
        self.hook_acts = HookPoint()  # (B, L, d_sae)
        self.hook_recons = HookPoint()  # (B, L, d_out)
        self.hook_error = HookPoint()  # (B, L, d_out)
        self._handle: Any = None

    @property
    def dictionary(self) -> Dictionary:
        return self._dictionary[0]

    @property
    def d_sae(self) -> int:
        return int(self.dictionary.W_dec.shape[0])

    def listening(self) -> bool:
        """True when a hook (call-scoped or plain) listens at one of the splice's points, or at the splice."""
        return (self.hook_acts.is_active() or self.hook_recons.is_active() or self.hook_error.is_active()
                or observed(self))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The site's output given what the dictionary reads (`x`) and the site's clean output (`y`)."""
        acts_on, recons_on, error_on = (self.hook_acts.is_active(), self.hook_recons.is_active(),
                                        self.hook_error.is_active())
        if not (acts_on or recons_on or error_on):
            return y
        d = self.dictionary
        xf, yf = x.float(), y.float()
        if acts_on and not (recons_on or error_on):
            features = _declared(self.hook_acts.listeners(), self.d_sae)
            encode_features = getattr(d, "encode_features", None)
            if features is not None and encode_features is not None:
                features = features.to(xf.device)
                # every listener declared the few features it edits (`edits_features`): only those are encoded
                some = encode_features(xf, features)
                edited = self.hook_acts(some.clone())
                return _plus(y, yf, _decoded_change(d.W_dec.index_select(0, features), edited, some, self.d_sae))
        feats = _blocked(d.encode, xf, self.d_sae)  # (B, L, d_sae)
        delta: torch.Tensor | None = None
        if acts_on:
            edited = self.hook_acts(feats.clone())  # a copy: an in-place edit must not touch the clean features
            delta = _decoded_change(d.W_dec, edited, feats, self.d_sae)
        if recons_on or error_on:
            skip = getattr(d, "skip", None)
            recons = d.decode(feats) + (skip(xf) if skip is not None else 0.0)
            if recons_on:
                seen = recons if delta is None else recons + delta
                change = self.hook_recons(seen.clone()) - seen
                delta = change if delta is None else delta + change
            if error_on:
                error = yf - recons
                change = self.hook_error(error.clone()) - error
                delta = change if delta is None else delta + change
        return _plus(y, yf, delta)

    def extra_repr(self) -> str:
        kind = "transcoder" if self.reads_input else "sae"
        return f"{kind}, d_sae={self.d_sae}, users={self.users}"


_CHUNK = 1 << 19  # rows x d_sae per block (2 MiB of float32): a block's (rows, d_sae) intermediates stay in cache


def _blocks(n: int, d_sae: int) -> range:
    return range(0, n, max(1, _CHUNK // d_sae))


def _blocked(encode: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, d_sae: int) -> torch.Tensor:
    """encode(x) over blocks of rows on CPU: an 8192-wide TopK's pre-activations, selection and scatter then run
    in cache rather than through (rows, d_sae) arrays in memory; one call on an accelerator."""
    rows = x.reshape(-1, x.size(-1))
    if x.device.type != "cpu" or rows.size(0) * d_sae <= _CHUNK:
        return encode(x)
    out = torch.cat([encode(rows[i : i + _CHUNK // d_sae]) for i in _blocks(rows.size(0), d_sae)])
    return out.view(*x.shape[:-1], out.size(-1))


def _decoded_change(w_dec: torch.Tensor, edited: torch.Tensor, feats: torch.Tensor, d_sae: int) -> torch.Tensor:
    """(edited - feats) @ w_dec: exact zeros where nothing was edited, so an unedited site adds exactly 0. On CPU,
    over the row blocks of `_blocked`, only the feature columns that changed in a block are decoded (steering edits
    a few); the host-side test is free there, and would be a sync on an accelerator, where the dense product is
    cheap."""
    if edited.device.type != "cpu":
        return (edited - feats) @ w_dec
    e, f = edited.reshape(-1, edited.size(-1)), feats.reshape(-1, feats.size(-1))
    step = max(1, _CHUNK // d_sae)
    out = []
    for i in range(0, f.size(0), step):
        change = e[i : i + step] - f[i : i + step]
        cols = change.ne(0).any(0).nonzero()[:, 0]
        out.append(change.index_select(1, cols) @ w_dec.index_select(0, cols))
    return torch.cat(out).view(*feats.shape[:-1], w_dec.size(1))


def edits_features(fn: HookFn, features: Iterable[int]) -> HookFn:
    """`fn` marked as reading and editing only these features of a splice's `hook_acts`.

    When every function listening at `hook_acts` carries the same mark, no plain PyTorch hook listens there and
    neither the reconstruction nor the error is listened to, the splice encodes only those features (if its
    dictionary offers `encode_features`) and hands the functions a (B, L, len(features)) tensor, the features in
    ascending order; otherwise the whole (B, L, d_sae) tensor, as to any hook. The values are the same within
    float rounding of the pre-activations (the narrow path computes them with products of other shapes), exactly
    0 where the dense features are, and an edit of zero adds exact zeros either way (tested: the same tokens, logits
    within 1e-5). The narrow path skips the dense (B, L, d_sae) features, their copy and their comparison, and most
    of the encoder (`steering_hooks` marks its functions so)."""
    return marked(fn, "features", features)


def _declared(fns: tuple[HookFn, ...] | None, d_sae: int) -> torch.Tensor | None:
    """The features every listener declared (all the same), as an index tensor; None when one did not."""
    if not fns:
        return None
    first = getattr(fns[0], "features", None)
    if first is None or len(first) >= d_sae or any(getattr(fn, "features", None) != first for fn in fns[1:]):
        return None
    return torch.tensor(first)


def _plus(y: torch.Tensor, yf: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """y plus the edits' change: added in float32 for half types (then rounded once), in y's own precision
    otherwise, so a float64 model keeps its digits (and y itself, bit for bit, when nothing changed)."""
    if y.dtype in (torch.float16, torch.bfloat16):
        return (yf + delta).to(y.dtype)
    return y + delta.to(y.dtype)


def _run_splice(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
    sae = module._modules.get(SPLICE)
    if sae is None or not sae.listening():
        return None
    return sae(args[0] if sae.reads_input else output, output)


_LOCK = threading.Lock()


@dataclass
class Spliced:
    """What `attach` returns: the splice (`.splice`), as a context manager that detaches it at the end, or kept
    until `remove()` (a permanent splice)."""

    model: nn.Module
    site: str
    splice: Splice
    _removed: bool = False

    def __enter__(self) -> Splice:
        return self.splice

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        """Give this user's splice back (idempotent); the last user's removal detaches it."""
        if not self._removed:
            self._removed = True
            detach(self.model, self.site)


def site_module(model: nn.Module, site: str) -> nn.Module:
    """The module at a site's path: a hook point ("hook_memory") or a block with an input and output ("dec.1.ffn")."""
    try:
        module = model.get_submodule(site) if site else None
    except AttributeError:
        module = None
    if module is None or not (isinstance(module, HookPoint) or hasattr(module, "hook_out")):
        names = [n for n, m in model.named_modules() if isinstance(m, HookPoint) or n.endswith(".ffn")]
        close = difflib.get_close_matches(site, names, n=5, cutoff=0.5)
        raise ValueError(f"no site {site!r} in the model (a hook point or an FFN path such as 'dec.1.ffn')"
                         + (f"; closest: {close}" if close else ""))
    return module


def attach(model: nn.Module, site: str, dictionary: Dictionary) -> Spliced:
    """Splice `dictionary` in at `site` (see the module docstring); the same dictionary attached twice is shared."""
    module = site_module(model, site)
    reads_input = not isinstance(module, HookPoint)
    param = next(model.parameters(), None)
    if param is not None and dictionary.W_dec.device != param.device:
        raise ValueError(f"the dictionary is on {dictionary.W_dec.device}, the model on {param.device}; move it first "
                         f"(SparseDictionary.load(..., device=...) or .to(device))")
    with _LOCK:
        existing = module._modules.get(SPLICE)
        if existing is not None and existing.dictionary is not dictionary:
            raise ValueError(f"{site} already carries another dictionary ({existing.extra_repr()}); remove that "
                             "splice first")
        if existing is None:
            existing = Splice(dictionary, reads_input=reads_input)
            module.add_module(SPLICE, existing)
            existing._handle = module.register_forward_hook(_run_splice, prepend=True)
            _rename(model)
        existing.users += 1
    return Spliced(model, site, existing)


def detach(model: nn.Module, site: str) -> None:
    """Remove one user of the splice at `site`; the last one takes it out of the model."""
    module = site_module(model, site)
    with _LOCK:
        existing = module._modules.get(SPLICE)
        if existing is None:
            raise ValueError(f"no dictionary is spliced at {site}")
        existing.users -= 1
        if existing.users > 0:
            return
        existing._handle.remove()
        del module._modules[SPLICE]
        _rename(model)


def splice_at(model: nn.Module, site: str) -> Splice | None:
    """The splice at `site`, or None."""
    return site_module(model, site)._modules.get(SPLICE)


def _rename(model: nn.Module) -> None:
    refresh = getattr(model, "refresh_hook_points", None)
    if refresh is not None:
        refresh()
    else:
        name_hook_points(model)


# ---------------------------------------------------------------------------- steering


@dataclass(frozen=True)
class FeatureEdit:
    """One feature's edit at every position: clamp (set the activation to `value`) or add `value` to it."""

    value: float
    add: bool = False

    @classmethod
    def parse(cls, spec: float | int | str | FeatureEdit) -> FeatureEdit:
        """A number clamps; a string with a sign adds ("+5", "-2.5"); "=5" or "=-2" clamps (to a negative, too).

        Clamping is what Templeton et al. (2024) steer with; adding is activation addition (Turner et al. 2023)
        in the dictionary's basis: value x the feature's decoder direction, at every position."""
        if isinstance(spec, FeatureEdit):
            return spec
        if isinstance(spec, bool):
            raise ValueError(f"a feature edit is a number or a string like '+5', got {spec!r}")
        if isinstance(spec, (int, float)):
            return cls(float(spec))
        text = str(spec).strip()
        add = text[:1] in "+-" and text[:1] != ""
        body = text[1:] if text.startswith("=") else text
        try:
            value = float(body)
        except ValueError:
            raise ValueError(f"feature edit {spec!r}: give a number to clamp to (5, '=5', '=-2') or a signed "
                             "number to add ('+5', '-2')") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"feature edit {spec!r} is not a finite number")
        return cls(value, add)

    def __str__(self) -> str:
        return f"{self.value:+g}" if self.add else (f"={self.value:g}" if self.value < 0 else f"{self.value:g}")


Steer = Mapping[str, Mapping[int, float | int | str | FeatureEdit]]


def parse_steer(steer: Steer) -> dict[str, dict[int, FeatureEdit]]:
    """{site: {feature: FeatureEdit}} from {site: {feature: 5.0 | "+5" | FeatureEdit}}; bad entries raise."""
    if not isinstance(steer, Mapping):
        raise ValueError(f"steer must map a site to {{feature: value}}, got {type(steer).__name__}")
    out: dict[str, dict[int, FeatureEdit]] = {}
    for site, edits in steer.items():
        if not isinstance(edits, Mapping):
            raise ValueError(f"steer[{site!r}] must map feature ids to values, got {type(edits).__name__}")
        parsed: dict[int, FeatureEdit] = {}
        for feature, value in edits.items():
            try:
                if isinstance(feature, (bool, str)):
                    raise TypeError
                index = operator.index(feature)  # an int, or a numpy / 0-d torch integer
            except TypeError:
                raise ValueError(f"steer[{site!r}]: feature ids are ints, got {feature!r}") from None
            parsed[index] = FeatureEdit.parse(value)
        out[site] = parsed
    return out


def steering_hooks(model: nn.Module, steer: Steer) -> list[tuple[str, HookFn]]:
    """Hooks on `<site>.sae.hook_acts` that clamp or add features at every position, for `model.hooks(...)`.

    Each site needs a dictionary spliced there (`workbench.features.splice`); features are checked against its
    width. The hook edits the features the splice hands it, in teacher forcing and at every search step; it
    declares them (`edits_features`), so the splice encodes only those: the same output bit for bit as the same
    edit written as a hook that declares them too, and within float rounding of an undeclared hook (which gets the
    dense features)."""
    hooks: list[tuple[str, HookFn]] = []
    for site, edits in parse_steer(steer).items():
        sae = splice_at(model, site)
        if sae is None:
            raise ValueError(f"steering {site!r} needs a dictionary spliced there: "
                             "`with workbench.features.splice(model, SparseDictionary.load(DIR)):` (or the "
                             "CLI's --dictionary DIR)")
        bad = [f for f in edits if not 0 <= f < sae.d_sae]
        if bad:
            raise ValueError(f"{site}: features {bad} are out of range; its dictionary has {sae.d_sae} "
                             f"(0..{sae.d_sae - 1})")
        if edits:
            hooks.append((sae.hook_acts.name, _steer_fn(edits)))
    return hooks


def _steer_fn(edits: dict[int, FeatureEdit]) -> HookFn:
    features = sorted(edits)
    clamp = [(i, f, edits[f].value) for i, f in enumerate(features) if not edits[f].add]
    add = [(i, f, edits[f].value) for i, f in enumerate(features) if edits[f].add]

    def steer(acts: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        # handed the declared features (ascending) or, when another listener wants them all, every feature
        narrow = acts.size(-1) == len(features)  # all d_sae features steered: position i is feature i anyway
        for group, assign in ((clamp, True), (add, False)):
            if group:
                idx = torch.tensor([i if narrow else f for i, f, _ in group], device=acts.device)
                vals = torch.tensor([v for _, _, v in group], dtype=acts.dtype, device=acts.device)
                if assign:
                    acts[..., idx] = vals
                else:
                    acts[..., idx] += vals
        return acts

    steer.__name__ = "steer_" + "_".join(f"{f}{e}" for f, e in edits.items())
    return edits_features(steer, features)

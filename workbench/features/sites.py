"""Where a dictionary sits in an encoder-decoder model: its hook(s), its side, and how to splice it in.

    site = resolve_site(model, "hook_memory")              # an SAE on the encoder output
    site = resolve_site(model, "dec.3.ffn")                # a transcoder: the FFN's input -> its output
    x, y = site_rows(model, batch, site)                   # (N, d_in), (N, d_out) or None: real tokens only
    with model.hooks(splice_hooks(site, dictionary)):      # the dictionary's reconstruction replaces the site
        logits = model(src, tgt_in)
    with splice(model, dictionary) as sae:                 # its features as hook points: sae.hook_acts.name is
        ...                                                # "hook_memory.sae.hook_acts" (see core.splice)

Encoder-side sites (`enc.*`, `hook_src_*`, `hook_memory`) have one row per real source token; decoder-side
ones one row per teacher-forced decoder position (the start token and each reference token).
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from typing import Literal

import torch

from ..core.masks import real_positions
from ..core.model import Transformer
from ..core.splice import Spliced, attach, detach
from ..corpus.data import Batch
from .dictionary import SparseDictionary

Side = Literal["src", "tgt"]
_FFN = re.compile(r"^(enc|dec)\.(\d+)\.ffn$")
_SRC_TOP = ("hook_src_tok", "hook_src_pos", "hook_src_embed", "hook_memory")


@dataclass(frozen=True)
class Site:
    name: str
    """The site's name: a hook name (autoencoder) or an FFN's module path such as "dec.3.ffn" (transcoder)."""
    hook_in: str
    hook_out: str | None = None
    """Transcoders: the hook the dictionary predicts (the FFN's output)."""

    @property
    def transcoder(self) -> bool:
        return self.hook_out is not None

    @property
    def side(self) -> Side:
        return "src" if self.hook_in.startswith("enc.") or self.hook_in in _SRC_TOP else "tgt"

    @property
    def hooks(self) -> list[str]:
        return [self.hook_in] + ([self.hook_out] if self.hook_out else [])


def ffn_input_hook(model: Transformer, stack: str, layer: int) -> str:
    """The hook holding an FFN's input: post-norm, the stream after the previous sub-layer's norm; pre-norm,
    the FFN norm's output (`Sublayer.hook_block_in`)."""
    return model.stream(stack).layers[layer].sublayer("ffn").hook_block_in.name


def resolve_site(model: Transformer, spec: str) -> Site:
    """A hook name (SAE) or "enc.N.ffn" / "dec.N.ffn" (transcoder); unknown names raise with the closest ones."""
    m = _FFN.match(spec)
    if m:
        stack, layer = m[1], int(m[2])
        n = len(model.enc if stack == "enc" else model.dec)
        if layer >= n:
            raise ValueError(f"{spec}: the model's {stack} stack has {n} layers (0..{n - 1})")
        return Site(spec, ffn_input_hook(model, stack, layer), model.stream(stack).layers[layer].ffn.hook_out.name)
    model.hook_names(spec)  # KeyError naming the closest hook points
    if any(c in spec for c in "*?["):
        raise ValueError(f"a site is one hook point, not a pattern: {spec!r}")
    return Site(spec, spec)


def site_of(dictionary: SparseDictionary) -> Site:
    cfg = dictionary.cfg
    if cfg.transcoder:
        return Site(cfg.hook_name_out.rsplit(".hook_out", 1)[0], cfg.hook_name, cfg.hook_name_out)
    return Site(cfg.hook_name, cfg.hook_name)


class _Spliceable:
    """What a splice holds for a `SparseDictionary`: its inference surface plus `encode_features`, the activations
    of a few features without the dense (..., d_sae) array (a steer's narrow path, `core.splice.edits_features`)."""

    def __init__(self, d: SparseDictionary) -> None:
        self.d, self.cfg = d, d.cfg
        self.encode, self.decode, self.skip = d.encode, d.decode, d.skip

    @property
    def W_dec(self) -> torch.Tensor:  # noqa: N802 (SAELens's name)
        return self.d.W_dec

    def encode_features(self, x: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """encode(x)[..., features] without the dense features: each feature's pre-activation alone, and the dense
        pre-activations (for TopK's selection) only on rows where one of them may be positive; elsewhere ReLU
        makes it exactly 0, as in `encode`. Values equal encode's within float rounding (a matrix product of
        another shape), and 0 exactly where encode gives 0: hook_memory's features are positive on about 2 % of
        tokens, so a steer skips nearly all of the 8192-wide encoder."""
        d, cfg = self.d, self.cfg
        shape, x = x.shape, x.reshape(-1, x.size(-1))
        sae_in = x if cfg.transcoder else x - d.b_dec
        w, b = d.W_enc.index_select(1, features), d.b_enc.index_select(0, features)
        guess = torch.addmm(b, sae_in, w)  # (N, n)
        if cfg.architecture == "relu":
            return guess.relu().view(*shape[:-1], -1)
        out = torch.zeros_like(guess)
        # a row is a candidate unless every chosen pre-activation is negative by far more than float rounding
        bound = 1e-4 * torch.addmm(b.abs(), sae_in.abs(), w.abs())
        rows = (guess > -bound).any(-1).nonzero()[:, 0]
        if rows.numel():
            pre = d.pre_activations(x.index_select(0, rows))  # (m, d_sae), as encode computes them
            top = pre.topk(cfg.k, dim=-1, sorted=False).indices  # encode's own selection
            member = (top.unsqueeze(1) == features.unsqueeze(-1)).any(-1)  # (m, n)
            chosen = pre.index_select(1, features)
            out.index_copy_(0, rows, torch.where(member, chosen.relu(), torch.zeros_like(chosen)))
        return out.view(*shape[:-1], -1)


_SPLICEABLE: weakref.WeakKeyDictionary[SparseDictionary, _Spliceable] = weakref.WeakKeyDictionary()


def splice(model: Transformer, dictionary: SparseDictionary) -> Spliced:
    """Splice `dictionary` in at its site (from its config), as `core.splice.attach`: its activations,
    reconstruction and error become hook points `<site>.sae.hook_acts` / `.hook_recons` / `.hook_error`, readable and
    editable by `model.hooks`, `register_forward_hook` and nnsight, while the model's outputs stay bit-identical
    until something edits them.

    `with splice(model, d) as sae:` removes it at the end of the block (prefer this on a model other threads use:
    the module tree is shared, though an unedited splice changes no output); `splice(model, d)` alone keeps it
    until `unsplice(model, d)`. The dictionary is moved to the model's device."""
    site = site_of(dictionary)
    resolve_site(model, site.name)  # an unknown site or layer raises with the closest names
    cfg = dictionary.cfg
    if cfg.d_in != model.cfg.d_model or cfg.out_dim != model.cfg.d_model:
        raise ValueError(f"the dictionary for {site.name} maps {cfg.d_in} -> {cfg.out_dim}, but the model's width "
                         f"is {model.cfg.d_model}: it belongs to another model")
    dictionary.to(model.device)
    if dictionary not in _SPLICEABLE:  # one per dictionary, so splicing it twice shares the splice
        _SPLICEABLE[dictionary] = _Spliceable(dictionary)
    return attach(model, site.name, _SPLICEABLE[dictionary])


def unsplice(model: Transformer, dictionary_or_site: SparseDictionary | str) -> None:
    """Remove a splice made by `splice(model, d)` (by the dictionary or its site's name)."""
    name = dictionary_or_site if isinstance(dictionary_or_site, str) else site_of(dictionary_or_site).name
    detach(model, name)


class _Stop(Exception):
    """Raised by a hook once every wanted activation is captured: the rest of the forward pass is skipped."""


@torch.no_grad()
def capture_site(model: Transformer, src: torch.Tensor, tgt_in: torch.Tensor, site: Site, *,
                 extra: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """{hook: (B, L, d)} for the site's hooks (and `extra` ones on its side, such as a transcoder's FFN
    `hook_hidden`), running the model only as far as they lie."""
    got: dict[str, torch.Tensor] = {}
    wanted = [*site.hooks, *extra]

    def keep(x: torch.Tensor, hook) -> None:
        if x.dim() != 3:
            raise ValueError(f"{hook.name} has shape {tuple(x.shape)}; a dictionary reads (batch, length, d) "
                             "activations (per-head tensors: use the block's hook_out)")
        got[hook.name] = x.detach()
        if len(got) == len(wanted):
            raise _Stop

    with model.hooks([(n, keep) for n in wanted]):
        try:
            if site.side == "src":
                model.encode(src)
            else:
                model(src, tgt_in, project=False)
        except _Stop:
            pass
    missing = [n for n in wanted if n not in got]
    if missing:
        raise ValueError(f"{missing} did not run in a teacher-forced forward pass")
    return got


def site_mask(batch: Batch, site: Site, pad_id: int) -> torch.Tensor:
    """(B, L) True on real positions of the site's side. Decoder position 0 is real even when the start id is the
    padding id (Marian's convention): `core.masks.real_positions` decides, as everywhere else."""
    return real_positions(batch.src if site.side == "src" else batch.tgt_in, pad_id, decoder=site.side != "src")


def site_rows(model: Transformer, batch: Batch, site: Site, *, extra: tuple[str, ...] = ()
              ) -> tuple[torch.Tensor, torch.Tensor | None] | tuple[torch.Tensor, torch.Tensor | None, dict]:
    """The site's activations at real positions, row-major over (sentence, position); with `extra` hook names,
    a third item {name: rows} of those."""
    acts = capture_site(model, batch.src.to(model.device), batch.tgt_in.to(model.device), site, extra=extra)
    mask = site_mask(batch, site, model.cfg.pad_id).to(model.device)
    x = acts[site.hook_in][mask].float()
    y = acts[site.hook_out][mask].float() if site.hook_out else None
    if extra:
        return x, y, {n: acts[n][mask].float() for n in extra}
    return x, y


def ablation_hooks(site: Site, value: torch.Tensor | None = None) -> list[tuple[str, object]]:
    """Hooks that replace the site's activation (a transcoder's: the FFN's output) by `value` (d,) at every
    position: the mean activation for mean ablation, zero when None."""
    if value is None:
        return splice_hooks(site, None)
    return [(site.hook_out or site.hook_in, lambda x, hook: value.to(x.device, x.dtype).expand_as(x).clone())]


def splice_hooks(site: Site, dictionary: SparseDictionary | None, *, error: bool = False) -> list[tuple[str, object]]:
    """Hooks that put the dictionary's reconstruction where the site's activation was.

    `dictionary` is anything that maps the site's input rows to its output (a `SparseDictionary`, or a baseline
    of `features.baselines`). `dictionary=None` zero-ablates the site instead (the baseline of "CE recovered").
    `error=True` adds the reconstruction error back, which leaves the model's output unchanged while the features
    stay readable (and editable through hooks on the dictionary).
    """
    if dictionary is None:
        return [(site.hook_out or site.hook_in, lambda x, hook: torch.zeros_like(x))]
    if not site.transcoder:
        def replace(x: torch.Tensor, hook) -> torch.Tensor:
            out = dictionary(x.float())
            return (out + (x.float() - out) if error else out).to(x.dtype)
        return [(site.hook_in, replace)]
    stash: dict[str, torch.Tensor] = {}

    def read(x: torch.Tensor, hook) -> None:
        stash["x"] = x

    def write(y: torch.Tensor, hook) -> torch.Tensor:
        out = dictionary(stash.pop("x").float())
        return (out + (y.float() - out) if error else out).to(y.dtype)
    return [(site.hook_in, read), (site.hook_out, write)]

"""The residual stream as a sum of components, and direct logit attribution (DLA) to each of them.

    comps = decompose_resid(model, src, tgt)            # decoder stream read by the output layer
    comps.values.sum(0) == comps.target                  # (B, T, D), to fp32 tolerance (tested)
    dla = direct_logit_attribution(model, src, tgt, position=3, token=tok)
    dla.frame()                                          # component, stack, kind, layer, head, value
    dla.values.sum() == dla.logit                        # exact (tested)
    src_dla = source_attribution(model, src, tgt, position=3, token=tok)   # (L, H, S) cross heads

Components of a stream: the token and position embeddings, each attention head's output as written
into the stream (`hook_result`) and each block's shared output bias, each FFN output, and every layer
norm's bias. A layer norm is affine once its scale sqrt(var + eps) is fixed, so each norm along the way
(post-norm layers, the final norm) is applied to every component with the scale the clean run had
("frozen"): the parts then sum to the real activation exactly, for pre-norm and post-norm models alike.
What the scale-freezing does *not* give is counterfactual meaning: removing a component in a real run
changes the scales. For the final norm of a pre-norm model that is the only approximation (TransformerLens's
`apply_ln_to_stack`); a post-norm model freezes one norm per sub-layer after the component, so a
component's DLA there is its effect along the linear path with every later norm held at the clean scale,
and every later sub-layer's own reaction to it counted in that sub-layer's term, not in its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.heads import kind_of

STACKS = ("enc", "dec")


@dataclass
class Components:
    """Parts of one stream at one point, in the residual basis; `values.sum(0)` is the stream there."""

    labels: list[str]  # "tgt_tok", "dec.1.cross_attn.head.2", "dec.1.cross_attn.bias", "dec.1.ffn", ...
    info: list[dict[str, Any]]  # per label: stack, kind, layer, head (None where it does not apply)
    values: torch.Tensor  # (N, B, L, D) float64
    target: torch.Tensor  # (B, L, D) the real activation they sum to
    point: str  # the hook name whose value `target` is

    def index(self, label: str) -> int:
        if label not in self.labels:
            raise KeyError(f"no component {label!r}; e.g. {self.labels[:4]}")
        return self.labels.index(label)


@dataclass
class LogitAttribution:
    """Direct logit attribution of one position's logit (or logit difference) to every component."""

    labels: list[str]
    info: list[dict[str, Any]]
    values: torch.Tensor  # (N,) float64; sums to `logit`
    logit: float  # the model's real logit (or logit difference) at that position
    position: int
    token: int
    baseline_token: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def frame(self):
        """A pandas DataFrame: component, stack, kind, layer, head, value (model order)."""
        import pandas as pd  # optional: only the tabular view needs it

        rows = [{"component": lab, **inf, "value": float(v)}
                for lab, inf, v in zip(self.labels, self.info, self.values)]
        return pd.DataFrame(rows)

    def top(self, k: int = 10) -> list[tuple[str, float]]:
        order = self.values.abs().argsort(descending=True)[:k]
        return [(self.labels[i], float(self.values[i])) for i in order.tolist()]


# ------------------------------------------------------------------------------------------ the stream


def _capture_names(model, stack: str, layers: int) -> list[str]:
    cfg = model.cfg
    side = "src" if stack == "enc" else "tgt"
    names = [f"hook_{side}_tok", f"hook_{side}_pos"]
    if cfg.emb_norm:
        names.append(f"{side}_emb_norm.hook_scale")
    blocks = ["self_attn"] if stack == "enc" else ["self_attn", "cross_attn"]
    for i in range(layers):
        for b in blocks:
            names.append(f"{stack}.{i}.{b}.hook_result")
            if not cfg.norm_first:
                names.append(f"{stack}.{i}.{b}_norm.hook_scale")
        names.append(f"{stack}.{i}.ffn.hook_out")
        if not cfg.norm_first:
            names.append(f"{stack}.{i}.ffn_norm.hook_scale")
    final = model.enc_norm if stack == "enc" else model.dec_norm
    if final is not None and layers == len(getattr(model, stack)):
        names.append(f"{stack}_norm.hook_scale")
    return names


def _events(model, stack: str, layers: int, trace) -> list[tuple]:
    """The stream in order: ("write", label, info, (B, L, D) or per-head (B, H, L, D)) and
    ("norm", path, module, scale)."""
    cfg = model.cfg
    side = "src" if stack == "enc" else "tgt"
    embed = {"stack": stack, "kind": "embed", "layer": None, "head": None}
    ev: list[tuple] = [("write", f"{side}_{x}", embed, trace[f"hook_{side}_{x}"]) for x in ("tok", "pos")]
    if cfg.emb_norm:
        norm = f"{side}_emb_norm"
        ev.append(("norm", norm, getattr(model, norm), trace[f"{norm}.hook_scale"]))
    blocks = ["self_attn"] if stack == "enc" else ["self_attn", "cross_attn"]
    for i in range(layers):
        layer = getattr(model, stack)[i]
        for b in blocks:
            kind = kind_of(f"{stack}.{i}.{b}")
            attn = getattr(layer, b)
            ev.append(("write", f"{stack}.{i}.{b}.head", {"stack": stack, "kind": kind, "layer": i, "head": "*"},
                       trace[f"{stack}.{i}.{b}.hook_result"]))
            if attn.out_proj.bias is not None:
                ev.append(("write", f"{stack}.{i}.{b}.bias", {"stack": stack, "kind": kind + "_bias", "layer": i,
                                                              "head": None}, attn.out_proj.bias.detach()))
            if not cfg.norm_first:
                ev.append(("norm", f"{stack}.{i}.{b}_norm", getattr(layer, f"{b}_norm"),
                           trace[f"{stack}.{i}.{b}_norm.hook_scale"]))
        ev.append(("write", f"{stack}.{i}.ffn", {"stack": stack, "kind": "ffn", "layer": i, "head": None},
                   trace[f"{stack}.{i}.ffn.hook_out"]))
        if not cfg.norm_first:
            ev.append(("norm", f"{stack}.{i}.ffn_norm", layer.ffn_norm, trace[f"{stack}.{i}.ffn_norm.hook_scale"]))
    final = model.enc_norm if stack == "enc" else model.dec_norm
    if final is not None and layers == len(getattr(model, stack)):
        ev.append(("norm", f"{stack}_norm", final, trace[f"{stack}_norm.hook_scale"]))
    return ev


def frozen_norm(x: torch.Tensor, norm, scale: torch.Tensor) -> torch.Tensor:
    """The norm's linear part with a fixed scale: (x - mean(x)) / scale * weight (no bias), float64."""
    x = x.double()
    return (x - x.mean(-1, keepdim=True)) / scale.double() * norm.weight.detach().double()


def _point(model, stack: str, layers: int) -> str:
    if layers == len(getattr(model, stack)):
        return "hook_memory" if stack == "enc" else "hook_dec_out"
    return f"{stack}.{layers - 1}.hook_resid_ffn" if layers else f"hook_{'src' if stack == 'enc' else 'tgt'}_embed"


def _check(model, src, tgt, stack, layer):
    if stack not in STACKS:
        raise ValueError(f"stack must be one of {STACKS}, got {stack!r}")
    if src.dim() != 2 or tgt.dim() != 2 or src.size(0) != tgt.size(0):
        raise ValueError(f"need src (B, S) and tgt (B, T) with the same batch; got {tuple(src.shape)}, "
                         f"{tuple(tgt.shape)}")
    depth = len(getattr(model, stack))
    if layer is None:
        return depth
    if not -depth <= layer < depth:
        raise ValueError(f"layer {layer} out of range: the {stack} stack has {depth} layers")
    return layer % depth + 1


def decompose_resid(model, src: torch.Tensor, tgt: torch.Tensor, *, stack: str = "dec", layer: int | None = None,
                    split_heads: bool = True) -> Components:
    """Components of the `stack` stream after `layer` (None: the stack's output, after its final norm).

    The encoder's components are the encoder's own (its output is what cross-attention reads); the decoder's
    cross-attention heads are components of the decoder stream (see `source_attribution` for where they read).
    """
    layers = _check(model, src, tgt, stack, layer)
    names = _capture_names(model, stack, layers)
    point = _point(model, stack, layers)
    was = model.training
    model.eval()  # dropout would make the parts not sum to anything reproducible
    try:
        with torch.no_grad():
            _, trace = model.run_with_cache(src, tgt, names=[*names, point])
    finally:
        model.train(was)
    shape = trace[point].shape
    labels: list[str] = []
    info: list[dict] = []
    parts: list[torch.Tensor] = []
    for ev in _events(model, stack, layers, trace):
        if ev[0] == "norm":
            _, path, norm, scale = ev
            parts = [frozen_norm(p, norm, scale) for p in parts]
            labels.append(f"{path}.bias")
            info.append({"stack": stack, "kind": "norm_bias", "layer": _layer_of(path), "head": None})
            parts.append(norm.bias.detach().double().expand(shape))
            continue
        _, label, inf, x = ev
        if inf["head"] == "*":
            if split_heads:
                for h in range(x.size(1)):
                    labels.append(f"{label}.{h}")
                    info.append({**inf, "head": h})
                    parts.append(x[:, h].double())
            else:
                labels.append(label.removesuffix(".head") + ".heads")
                info.append({**inf, "head": None})
                parts.append(x.double().sum(1))
        else:
            labels.append(label)
            info.append(inf)
            parts.append(x.double().expand(shape))
    return Components(labels, info, torch.stack(parts), trace[point], point)


def _layer_of(path: str) -> int | None:
    parts = path.split(".")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


# ---------------------------------------------------------------------------- direct logit attribution


def _one(ids, name: str) -> torch.Tensor:
    t = torch.as_tensor(ids, dtype=torch.long)
    t = t.view(1, -1) if t.dim() == 1 else t
    if t.dim() != 2 or t.size(0) != 1:
        raise ValueError(f"{name} must be one sentence, (L,) or (1, L); got shape {tuple(t.shape)}")
    return t


def logit_direction(model, token: int, baseline_token: int | None = None) -> tuple[torch.Tensor, float]:
    """The unembedding direction of `token` (minus `baseline_token`'s) and the output bias term."""
    vocab = model.output_proj.weight.size(0)
    for t in (token, baseline_token):
        if t is not None and not 0 <= int(t) < vocab:
            raise ValueError(f"token {t} out of range: the target vocabulary has {vocab} entries")
    w = model.output_proj.weight.detach().double()
    b = None if model.output_proj.bias is None else model.output_proj.bias.detach()
    d = w[int(token)].clone()
    bias = 0.0 if b is None else float(b[int(token)])
    if baseline_token is not None:
        d -= w[int(baseline_token)]
        bias -= 0.0 if b is None else float(b[int(baseline_token)])
    return d, bias


def direct_logit_attribution(model, src, tgt, position: int, token: int, *, baseline_token: int | None = None,
                             split_heads: bool = True) -> LogitAttribution:
    """Each decoder component's share of the logit of `token` at decoder position `position` (the token
    predicted *after* reading tgt[position]); with `baseline_token`, of the logit difference token - baseline.
    `src`, `tgt`: one sentence (ids, (L,) or (1, L)). The values sum to the real logit exactly."""
    src, tgt = _one(src, "src").to(model.device), _one(tgt, "tgt").to(model.device)
    if not -tgt.size(1) <= position < tgt.size(1):
        raise ValueError(f"position {position} out of range for a target prefix of {tgt.size(1)} tokens")
    position %= tgt.size(1)
    comps = decompose_resid(model, src, tgt, stack="dec", split_heads=split_heads)
    direction, bias = logit_direction(model, token, baseline_token)
    values = comps.values[:, 0, position] @ direction  # (N,)
    labels, info = list(comps.labels), list(comps.info)
    if model.output_proj.bias is not None:
        labels.append("output_bias")
        info.append({"stack": "dec", "kind": "output_bias", "layer": None, "head": None})
        values = torch.cat([values, values.new_tensor([bias])])
    with torch.no_grad():
        logits = model.output_proj(comps.target[0, position]).double()
    logit = float(logits[int(token)] - (0 if baseline_token is None else logits[int(baseline_token)]))
    return LogitAttribution(labels, info, values.cpu(), logit, position, int(token), baseline_token)


def source_attribution(model, src, tgt, position: int, token: int, *, baseline_token: int | None = None,
                       kind: str = "cross") -> torch.Tensor:
    """(L, H, K): each head's direct logit attribution split over the keys it read (source positions for
    cross-attention, target-prefix positions for decoder self-attention). A head writes
    sum_k p[k] (v_k W_O,h) (v includes its bias; the p sum to 1), so summing over keys gives the head's
    DLA exactly. This is which source tokens each head moved into this output, as far as the logit sees."""
    if kind not in ("cross", "dec_self"):
        raise ValueError(f"kind must be 'cross' or 'dec_self' (heads that write into the decoder stream), got {kind!r}")
    src, tgt = _one(src, "src").to(model.device), _one(tgt, "tgt").to(model.device)
    if not -tgt.size(1) <= position < tgt.size(1):
        raise ValueError(f"position {position} out of range for a target prefix of {tgt.size(1)} tokens")
    position %= tgt.size(1)
    block = "cross_attn" if kind == "cross" else "self_attn"
    layers = len(model.dec)
    names = _capture_names(model, "dec", layers)
    names += [f"dec.{i}.{block}.hook_{x}" for i in range(layers) for x in ("probs", "v")]
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            _, trace = model.run_with_cache(src, tgt, names=names)
    finally:
        model.train(was)
    events = _events(model, "dec", layers, trace)
    direction, _ = logit_direction(model, token, baseline_token)
    out = []
    for i in range(layers):
        attn = getattr(model.dec[i], block)
        probs = trace[f"dec.{i}.{block}.hook_probs"][0, :, position].double()  # (H, K)
        v = trace[f"dec.{i}.{block}.hook_v"][0].double()  # (H, K, Dh)
        per_key = probs[..., None] * torch.einsum("hkd,hde->hke", v, attn.head_weights().detach().double())
        start = next(n for n, ev in enumerate(events) if ev[0] == "write" and ev[1] == f"dec.{i}.{block}.head")
        for ev in events[start + 1:]:
            if ev[0] == "norm":
                per_key = frozen_norm(per_key, ev[2], ev[3][0, position])
        out.append(per_key @ direction)
    return torch.stack(out).cpu()  # (L, H, K)

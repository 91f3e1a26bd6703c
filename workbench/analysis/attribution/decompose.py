"""The residual stream as a sum of components, and direct logit attribution (DLA) to each of them.

    comps = decompose_resid(model, src, tgt)            # decoder stream read by the output layer
    comps.values.sum(0) == comps.target                  # (B, T, D), to fp32 tolerance (tested)
    dla = direct_logit_attribution(model, src, tgt, position=3, token=tok)
    dla.frame()                                          # component, stack, kind, layer, head_index, value
    dla.values.sum() == dla.logit                        # exact (tested)
    src_dla = source_attribution(model, src, tgt, position=3, token=tok)   # (L, H, S) cross heads

Components of a stream: the token and position embeddings, each attention head's output as written
into the stream (`hook_result`) and each block's shared output bias, each FFN output, and every layer
norm's bias. A layer norm is affine once its scale sqrt(var + eps) is fixed, so each norm along the way
(post-norm layers, the final norm) is applied to every component with the scale the clean run had
("frozen"): the parts then sum to the real activation exactly, for pre-norm and post-norm models alike. The
components are rows carried through the layers' own `compose` (`walk`: the norm modules held by hooks, each block's
write taken from the clean run, a replacement model's), so where the norms sit is said once, in core.
What the scale-freezing does *not* give is counterfactual meaning: removing a component in a real run
changes the scales. For the final norm of a pre-norm model that is the only approximation (TransformerLens's
`apply_ln_to_stack`); a post-norm model freezes one norm per sub-layer after the component, so a
component's DLA there is its effect along the linear path with every later norm held at the clean scale,
and every later sub-layer's own reaction to it counted in that sub-layer's term, not in its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ...core.heads import Head, kind_of
from ...core.hooks import HookPoint, path_of
from ...core.layers import Sublayer
from ...core.model import evaluating
from ...core.replacement import ReplacementModel

STACKS = ("enc", "dec")


@dataclass
class Components:
    """Parts of one stream at one point, in the residual basis; `values.sum(0)` is the stream there."""

    labels: list[str]  # "tgt_tok", "cross:1:2" (a head, as `Head` spells it), "dec.1.cross_attn.bias", "dec.1.ffn", ...
    info: list[dict[str, Any]]  # per label: stack, kind, layer, head_index (None where it does not apply)
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
        """A pandas DataFrame: component, stack, kind, layer, head_index, value (model order); a head's component
        is its `Head` spelling ("cross:1:2"), so `Head.parse(row.component)` gives it back."""
        import pandas as pd  # optional: only the tabular view needs it

        rows = [{"component": lab, **inf, "value": float(v)}
                for lab, inf, v in zip(self.labels, self.info, self.values)]
        return pd.DataFrame(rows)

    def top(self, k: int = 10) -> list[tuple[str, float]]:
        order = self.values.abs().argsort(descending=True)[:k]
        return [(self.labels[i], float(self.values[i])) for i in order.tolist()]


# ------------------------------------------------------------------------------------------ the stream


def _capture_names(model, stack: str, layers: int) -> list[str]:
    stream = model.stream(stack)
    names = [stream.hook_tok.name, stream.hook_pos.name]
    if stream.emb_norm is not None:
        names.append(stream.emb_norm.hook_scale.name)
    for _, sub in stream.sublayers(layers):
        names.append((sub.block.hook_result if sub.is_attention else sub.block.hook_out).name)
        if sub.norm_on_stream:
            names.append(sub.norm.hook_scale.name)
    if stream.final_norm is not None and layers == len(stream.layers):
        names.append(stream.final_norm.hook_scale.name)
    return names


def _events(model, stack: str, layers: int, trace) -> list[tuple]:
    """The stream's parts in the order they are written: ("write", label, info, (B, L, D) or per-head (B, H, L, D))
    and ("norm", path, module, scale) for each norm that maps the stream (`Sublayer.norm_on_stream`). The rows of
    `stream_components` (and qk_attribution's labels); the arithmetic is `walk`'s, through the layers' `compose`."""
    stream = model.stream(stack)
    embed = {"stack": stack, "kind": "embed", "layer": None, "head_index": None}
    ev: list[tuple] = [("write", f"{stream.side}_{x}", embed, trace[point.name])
                       for x, point in (("tok", stream.hook_tok), ("pos", stream.hook_pos))]
    if stream.emb_norm is not None:
        norm = stream.emb_norm
        ev.append(("norm", path_of(norm), norm, trace[norm.hook_scale.name]))
    for i, sub in stream.sublayers(layers):
        path = path_of(sub.block)
        if sub.is_attention:
            kind = kind_of(path)
            ev.append(("write", path, {"stack": stack, "kind": kind, "layer": i, "head_index": "*"},
                       trace[sub.block.hook_result.name]))
            if sub.block.out_proj.bias is not None:
                ev.append(("write", f"{path}.bias", {"stack": stack, "kind": kind + "_bias", "layer": i,
                                                     "head_index": None}, sub.block.out_proj.bias.detach()))
        else:
            ev.append(("write", path, {"stack": stack, "kind": "ffn", "layer": i, "head_index": None},
                       trace[sub.block.hook_out.name]))
        if sub.norm_on_stream:
            ev.append(("norm", path_of(sub.norm), sub.norm, trace[sub.norm.hook_scale.name]))
    if stream.final_norm is not None and layers == len(stream.layers):
        ev.append(("norm", path_of(stream.final_norm), stream.final_norm, trace[stream.final_norm.hook_scale.name]))
    return ev


def frozen_norm(x: torch.Tensor, norm, scale: torch.Tensor) -> torch.Tensor:
    """The norm's linear part with a fixed scale, float64: `LayerNorm.linear` (no bias)."""
    with torch.no_grad():
        return norm.linear(x.double(), scale.double())


class _Stop(Exception):
    """Raised by a walk's hook where the walk ends, carrying the rows there."""

    def __init__(self, rows: torch.Tensor) -> None:
        super().__init__()
        self.rows = rows


def _unbias_by(bias_rows: Mapping[int, int], n_rows: int, like: torch.Tensor):
    """`unbias(norm)`: a hook taking the bias a norm added to every row back off, but for the norm's own row
    `bias_rows[id(norm)]` (off every row where it has none); `n_rows` rows at most, `like`'s dtype and device."""
    def unbias(norm):
        bias = norm.bias.detach().to(like.dtype)
        if id(norm) not in bias_rows:
            return lambda x, hook: x - bias
        keep = torch.ones(n_rows, 1, 1, 1, dtype=like.dtype, device=like.device)
        keep[bias_rows[id(norm)]] = 0
        return lambda x, hook: x - keep[: x.size(0)] * bias
    return unbias


def _walk_hooks(stream, n: int, first: int | None, clean: Mapping[str, torch.Tensor], unbias, unit: torch.Tensor
                ) -> list:
    """The hooks that make `walk`'s layers linear: every norm's scale held at its clean value (`unit` where the
    clean run has none) and its bias kept on its own row, over the first `n` layers and the outside norms, or
    over layer `first` alone."""
    def hold(value: torch.Tensor):
        return lambda x, hook: value.to(x.dtype).expand_as(x)

    if first is None:
        subs, outside = [sub for _, sub in stream.sublayers(n)], [stream.emb_norm, stream.final_norm]
    else:
        subs, outside = stream.layers[first].sublayers(), []
    spec = [(norm.hook_scale.name, hold(clean[norm.hook_scale.name] if norm.hook_scale.name in clean else unit))
            for norm in [*(sub.norm for sub in subs), *outside] if norm is not None]
    return spec + [(sub.hook_norm.name, unbias(sub.norm)) for sub in subs]


def walk(model, stack: str, clean: Mapping[str, torch.Tensor], rows: torch.Tensor,
         write: Callable[[int, Sublayer], torch.Tensor | None], *, layers: int | None = None,
         bias_rows: Mapping[int, int] | None = None, start: Sublayer | None = None,
         stop: HookPoint | None = None, alive: list[int] | None = None) -> torch.Tensor:
    """Carry `rows` (N, B, L, D), parts of the `stack` stream, through its layers' own `compose` (the forward pass's
    definition of how the blocks compose, pre- or post-norm), every layer norm held at its clean scale
    (`clean[norm.hook_scale.name]`, (B, L, 1): the norm is then linear) with its bias on row `bias_rows[id(norm)]`
    alone (on no row where none is given). Each sub-layer adds `write(layer, sub)` (rows, or None for nothing): what
    the clean run's block wrote, split into rows; the block itself does not run.

    The rows start as the embedding's parts (the embedding norm, if any, applied here) and end after the stack's
    final norm when the walk covers every layer; or, with `start`, as the stream that sub-layer reads, in its layer
    only. `stop`: end at that hook point, with the stream there. A norm whose scale the clean run did not record (a
    pre-norm block's input norm: only its block reads it, and the write comes from the clean run) runs at scale 1.
    `alive[i]`: how many rows exist through layer i (the last entry: through the final norm); the rows grow to it
    before each layer (a row that a later block writes is zero until then: carrying it would only cost time)."""
    stream = model.stream(stack)
    n = len(stream.layers) if layers is None else layers
    bias_rows = bias_rows or {}
    unbias = _unbias_by(bias_rows, len(rows) if alive is None else alive[-1], rows)
    first = None  # with `start`: its layer, the one walked
    if start is not None:
        (first,) = [i for i, sub in stream.sublayers(n) if sub is start]
    spec = _walk_hooks(stream, n, first, clean, unbias, rows.new_ones(()))
    if start is not None:
        spec.append((start.hook_resid_before.name, lambda x, hook: rows))
    if stop is not None:
        def end(x, hook):
            raise _Stop(x)
        spec.append((stop.name, end))

    def norm_rows(norm, x):  # a norm outside the layers (embedding, final): the module, frozen, then its bias
        return unbias(norm)(norm(x), None)

    def grow(x: torch.Tensor, i: int) -> torch.Tensor:
        if alive is None or alive[i] <= x.size(0):
            return x
        return torch.cat([x, x.new_zeros(alive[i] - x.size(0), *x.shape[1:])])

    def block_of(i: int):
        def block(sub: Sublayer, h: torch.Tensor) -> torch.Tensor:
            out = write(i, sub)
            return rows.new_zeros(()) if out is None else out
        return block

    with evaluating(model), torch.no_grad(), model.hooks(spec):
        try:
            if start is not None:
                return stream.layers[first].compose(torch.zeros_like(rows), block_of(first))
            x = rows if stream.emb_norm is None else norm_rows(stream.emb_norm, rows)
            for i in range(n):
                x = stream.layers[i].compose(grow(x, i), block_of(i))
            x = grow(x, n)
            return x if stream.final_norm is None or n < len(stream.layers) else norm_rows(stream.final_norm, x)
        except _Stop as stopped:
            return stopped.rows


def _point(model, stack: str, layers: int) -> str:
    return model.stream(stack).resid(layers).name


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
    point = _point(model, stack, layers)
    rm = ReplacementModel(model, src, tgt, freeze=(), names=[*_capture_names(model, stack, layers), point])
    labels, info, values = stream_components(rm.model, rm.clean, stack, layers, split_heads=split_heads)
    return Components(labels, info, values, rm.clean[point], point)


def _component_rows(events: list, stack: str, split_heads: bool) -> tuple[list[str], list[dict[str, Any]], list,
                                                                        dict[str, list[int]], dict[int, int]]:
    """`stream_components`' rows from its events, in order: (labels, info, parts, at, bias_rows). `parts[n]`: row
    n's write, (B, L, D) or broadcastable, None for a norm's bias; `at`: a block's path (its heads, or its write) or
    "<path>.bias" -> its rows; `bias_rows`: id(norm) -> its bias row."""
    labels: list[str] = []
    info: list[dict] = []
    parts: list[torch.Tensor | None] = []
    at: dict[str, list[int]] = {}
    bias_rows: dict[int, int] = {}
    for ev in events:
        if ev[0] == "norm":
            _, path, norm, _ = ev
            bias_rows[id(norm)] = len(labels)
            labels.append(f"{path}.bias")
            info.append({"stack": stack, "kind": "norm_bias", "layer": _layer_of(path), "head_index": None})
            parts.append(None)
            continue
        _, label, inf, x = ev
        first = len(labels)
        if inf["head_index"] == "*":
            if split_heads:
                for h in range(x.size(1)):
                    labels.append(str(Head(inf["kind"], inf["layer"], h)))  # the one spelling: "cross:1:2"
                    info.append({**inf, "head_index": h})
                    parts.append(x[:, h].double())
            else:
                labels.append(f"{label}.heads")
                info.append({**inf, "head_index": None})
                parts.append(x.double().sum(1))
        else:
            labels.append(label)
            info.append(inf)
            parts.append(x.double())
        at[label] = list(range(first, len(labels)))
    return labels, info, parts, at, bias_rows


def stream_components(model, trace, stack: str, layers: int, *, split_heads: bool = True, before: str | None = None
                      ) -> tuple[list[str], list[dict[str, Any]], torch.Tensor]:
    """The components of the `stack` stream after its first `layers` layers, from a trace holding
    `_capture_names(model, stack, layers)`: (labels, info, values (N, B, L, D) float64). `before` (a block
    path such as "dec.2.cross_attn") stops where that block would write: the stream that block reads
    (pre-norm: before its input norm).

    One row per component, carried through the layers by `walk` (the layers' own `compose`, norms frozen): the
    embeddings start the rows, each block's write fills its rows, each norm's bias fills its own."""
    stream = model.stream(stack)
    tok = trace[stream.hook_tok.name]
    events = _events(model, stack, layers, trace)
    if before is not None:
        stop = [n for n, ev in enumerate(events) if ev[0] == "write" and ev[1] == before]
        if not stop:
            raise ValueError(f"no block {before!r} in the first {layers} layers of the {stack} stack")
        events = events[: stop[0]]
    labels, info, parts, at, bias_rows = _component_rows(events, stack, split_heads)
    first = next((n for n, inf in enumerate(info) if inf["layer"] is not None), len(labels))
    alive = []  # rows through layer i: the embeddings' and every row of the layers up to i (their norms' biases too)
    for i in range(layers):
        alive.append(max([alive[-1] if alive else first, *(n + 1 for n, inf in enumerate(info) if inf["layer"] == i)]))
    alive.append(len(labels))
    rows = torch.zeros(first, *tok.shape, dtype=torch.float64, device=tok.device)
    for n in range(2):  # the token and position embeddings start the stream (and the embedding norm's bias row)
        rows[n] = parts[n]

    def write(i: int, sub: Sublayer) -> torch.Tensor | None:
        path = path_of(sub.block)
        mine = [*at.get(path, ()), *at.get(f"{path}.bias", ())]
        if not mine:
            return None
        out = torch.zeros(alive[i], *tok.shape, dtype=torch.float64, device=tok.device)
        for n in mine:
            out[n] = parts[n]
        return out

    stop = None if before is None else next(sub for _, sub in stream.sublayers(layers)
                                            if path_of(sub.block) == before).hook_resid_before
    values = walk(model, stack, trace, rows, write, layers=layers, bias_rows=bias_rows, stop=stop, alive=alive)
    return labels, info, values


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


@dataclass
class LogitAttributions:
    """Direct logit attribution over a batch: every sentence, every position at once (TransformerLens's
    `cache.logit_attrs`). values[n, b, t] is component n's share of logit(tokens[b, t]) (minus
    baseline_tokens[b, t]'s) at decoder position t of sentence b; summed over n it is `logits[b, t]`."""

    labels: list[str]
    info: list[dict[str, Any]]
    values: torch.Tensor  # (N, B, T) float64
    logits: torch.Tensor  # (B, T) float64: the model's real logit (difference)
    tokens: torch.Tensor  # (B, T)
    baseline_tokens: torch.Tensor | None = None

    def at(self, sentence: int, position: int) -> LogitAttribution:
        """One (sentence, position) as the single-position `LogitAttribution`."""
        base = None if self.baseline_tokens is None else int(self.baseline_tokens[sentence, position])
        return LogitAttribution(self.labels, self.info, self.values[:, sentence, position],
                                float(self.logits[sentence, position]), position,
                                int(self.tokens[sentence, position]), base)


def logit_attributions(model, src: torch.Tensor, tgt: torch.Tensor, tokens: torch.Tensor, *,
                       baseline_tokens: torch.Tensor | None = None, split_heads: bool = True) -> LogitAttributions:
    """Direct logit attribution of `tokens` (B, T) at every decoder position of a padded batch (src (B, S),
    tgt (B, T), e.g. `tm.encode_batch(...)`'s src/tgt_in/tgt_out): one forward, every sentence and position.
    Padded positions get values too; mask them with the batch's lengths."""
    if src.dim() != 2 or tgt.dim() != 2 or tokens.shape != tgt.shape:
        raise ValueError(f"need src (B, S), tgt (B, T) and tokens (B, T); got {tuple(src.shape)}, "
                         f"{tuple(tgt.shape)}, {tuple(tokens.shape)}")
    if baseline_tokens is not None and baseline_tokens.shape != tokens.shape:
        raise ValueError(f"baseline_tokens {tuple(baseline_tokens.shape)} must match tokens {tuple(tokens.shape)}")
    src, tgt = src.to(model.device), tgt.to(model.device)
    tokens = tokens.to(model.device)
    vocab = model.output_proj.weight.size(0)
    for t in (tokens, baseline_tokens):
        if t is not None and (int(t.min()) < 0 or int(t.max()) >= vocab):
            raise ValueError(f"tokens out of range: the target vocabulary has {vocab} entries")
    comps = decompose_resid(model, src, tgt, stack="dec", split_heads=split_heads)
    w = model.output_proj.weight.detach().double()
    b = None if model.output_proj.bias is None else model.output_proj.bias.detach().double()
    direction = w[tokens]  # (B, T, D)
    bias = None if b is None else b[tokens]
    if baseline_tokens is not None:
        baseline_tokens = baseline_tokens.to(model.device)
        direction = direction - w[baseline_tokens]
        bias = None if b is None else bias - b[baseline_tokens]
    values = torch.einsum("nbtd,btd->nbt", comps.values, direction)
    labels, info = list(comps.labels), list(comps.info)
    if bias is not None:
        labels.append("output_bias")
        info.append({"stack": "dec", "kind": "output_bias", "layer": None, "head_index": None})
        values = torch.cat([values, bias[None]])
    with torch.no_grad():
        logits = model.output_proj(comps.target).double()  # (B, T, V)
    logit = logits.gather(-1, tokens[..., None])[..., 0]
    if baseline_tokens is not None:
        logit = logit - logits.gather(-1, baseline_tokens[..., None])[..., 0]
    return LogitAttributions(labels, info, values.cpu(), logit.cpu(), tokens.cpu(),
                             None if baseline_tokens is None else baseline_tokens.cpu())


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
        info.append({"stack": "dec", "kind": "output_bias", "layer": None, "head_index": None})
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
    attns = [getattr(layer, block) for layer in model.dec]
    names = _capture_names(model, "dec", len(model.dec))
    names += [point.name for a in attns for point in (a.hook_probs, a.hook_v)]
    clean = ReplacementModel(model, src, tgt, freeze=(), names=names).clean
    direction, _ = logit_direction(model, token, baseline_token)
    pieces = []  # per layer (H, K, D): what each head moved from each key into `position`
    for attn in attns:
        probs = clean[attn.hook_probs.name][0, :, position].double()  # (H, K)
        v = clean[attn.hook_v.name][0].double()  # (H, K, Dh)
        pieces.append(probs[..., None] * torch.einsum("hkd,hde->hke", v, attn.head_weights().detach().double()))
    H, K, D = pieces[0].shape
    rows = torch.zeros(len(attns) * H * K, 1, 1, D, dtype=torch.float64, device=direction.device)

    def write(i: int, sub: Sublayer) -> torch.Tensor | None:  # each piece on its own row, through every later norm
        if sub.block is not attns[i]:
            return None
        out = torch.zeros_like(rows)
        out[i * H * K:(i + 1) * H * K, 0, 0] = pieces[i].reshape(H * K, D)
        return out

    at = {name: value[:, position:position + 1] for name, value in clean.items() if name.endswith(".hook_scale")}
    out = walk(model, "dec", at, rows, write)  # no bias rows: the norms' biases are not what a key moved
    return (out[:, 0, 0] @ direction).view(len(attns), H, K).cpu()  # (L, H, K)

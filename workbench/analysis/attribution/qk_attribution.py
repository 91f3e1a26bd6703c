"""Why a head attends, term by term: the QK attribution of one attention edge, cross-attention first (issue 36,
point 4; Kamath et al. 2025, "Tracing attention computation: attention QK attribution").

    qk = qk_attribution(model, src, tgt, layer=0, head=2, t=3, s=5)   # decoder position t reading source piece s
    qk.score, qk.total                  # the model's own hook_scores there, and the sum of every term (tested 1e-5)
    qk.frame()                          # query_side, key_side, value, kinds, positions: sorted by |value|
    qk.top(10)                          # [(query side, key side, value)]
    qk.key_totals()                     # each key-side part summed over the query side, by |value|
    dicts = [SparseDictionary.load(d) for d in ("features/hook_memory", "features/dec.1.ffn")]
    qk = qk_attribution(model, src, tgt, layer=2, head=0, t=3, s=5, dictionaries=dicts)   # feature by feature
    qk = qk_attribution(model, src, tgt, layer=1, head=3, t=4, s=2, kind="dec_self")       # self-attention too

The pre-softmax score of head h of decoder layer l's cross-attention at (t, s) is
    score = (W_Q x_t + b_Q) · (W_K m_s + b_K) / √d_h,
x_t what the block reads at t (post-norm: the stream after the self-attention norm; pre-norm: the block's input
norm of the stream), m_s the encoder memory at s (`hook_memory`, after the encoder's final norm if any). Both are
sums of parts, every layer norm on the way frozen at the scale the clean run had (`decompose.stream_components`:
token and position embeddings, each head, each FFN, each block's output bias and norm bias), so
    score = Σ_a Σ_k (W_Q x_a) · (W_K m_k) / √d_h
with b_Q one more part of the query side and b_K one more of the key side: the frame holds every pair, the
query-bias × key-part and query-part × key-bias terms and b_Q · b_K. Nothing is approximated; the terms sum to the
score to float rounding (the parts are float64, the model's score float32).

Parts, and how far back "where it came from" goes (one hop):
- embeddings and FFNs are parts at their own position (`from` = t on the query side, s on the key side). An FFN
  at s reads the stream at s, which earlier heads have mixed: its part is position s's, not the word's.
- with `by_position` (default) each attention head's write at p is split by the key p' it read:
  Σ_p' probs[p, p'] (v_p' W_O^h), v with its bias, each piece through the same frozen norms. "enc_self:3:2 <- 4"
  is what encoder head 3:2 moved from source position 4 into position s; "cross:0:1 <- 4" (query side) what an
  earlier cross-attention head moved from source position 4 into the decoder stream at t. The value at p' is the
  stream at p', itself mixed: one hop, not a path to the embedding.
- `dictionaries` (sparse autoencoders and transcoders, `features.dictionary`) replace the parts they cover with
  their features at that position, each feature a_f W_dec[f] through the same frozen norms, plus the decoder bias,
  the skip term (skip transcoders) and the error (what the dictionary misses; exact by construction):
  an SAE on `hook_memory` replaces the whole key side; an SAE on an attention block's `hook_out` replaces that
  block's heads and output bias; a transcoder on an FFN ("dec.1.ffn", "enc.2.ffn") replaces that FFN. A dictionary
  at a site that does not reach this edge (a decoder layer at or above `layer`) is listed in `meta["unused"]`.

Self-attention (`kind="enc_self"` or `"dec_self"`): the same split, queries and keys both reading the stream before
the block (`score_split.block_input`), at positions t and s (decoder: s <= t); dictionaries on that stack's blocks
expand both sides, a memory SAE does not reach it.

Decoders that start with the pad id (Marian) are fine: nothing here masks query positions, nor the decoder's key 0;
a source key must be a real token (not padding).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ...core.heads import Head, check_kind, stack_of
from ...core.hooks import path_of
from ...core.model import evaluating
from ...features.dictionary import SparseDictionary
from ...features.sites import Site, site_of
from .decompose import _capture_names, _events, _one, frozen_norm, stream_components
from .score_split import block_input, split_hooks

QUERY_BIAS, KEY_BIAS = "b_Q", "b_K"
_BLOCK_OF_KIND = {"enc_self": "self_attn", "dec_self": "self_attn", "cross": "cross_attn"}


@dataclass
class QKAttribution:
    """One attention edge's pre-softmax score as query part × key part terms (`meta["kind"]`: which attention)."""

    layer: int
    head: int
    t: int  # query position (cross, dec_self: decoder; enc_self: source)
    s: int  # key position (cross, enc_self: source; dec_self: decoder)
    query_labels: list[str]
    query_info: list[dict[str, Any]]
    key_labels: list[str]
    key_info: list[dict[str, Any]]
    terms: torch.Tensor  # (A, K) float64: query part a × key part k, biases included
    score: float  # the model's hook_scores at (head, t, s)
    probability: float  # the model's hook_probs there
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> float:
        """The sum of every term: the score, to float rounding."""
        return float(self.terms.sum())

    def _order(self, k: int | None) -> torch.Tensor:
        flat = self.terms.flatten()
        order = flat.abs().argsort(descending=True)
        return order if k is None else order[:k]

    def top(self, k: int = 10) -> list[tuple[str, str, float]]:
        """The k largest terms by |value|: (query side, key side, value)."""
        n = self.terms.size(1)
        return [(self.query_labels[i // n], self.key_labels[i % n], float(self.terms.flatten()[i]))
                for i in self._order(k).tolist()]

    def frame(self, k: int | None = None):
        """A pandas DataFrame, one row per term (the k largest with `k`), sorted by |value|: query_side, key_side,
        value, query_kind, key_kind, query_from / key_from (the position a part carries: see the module doc; None
        for biases), query_feature / key_feature (a dictionary feature's id, else None)."""
        import pandas as pd  # optional: only the tabular view needs it

        n = self.terms.size(1)
        flat = self.terms.flatten()
        rows = []
        for i in self._order(k).tolist():
            a, b = divmod(i, n)
            qi, ki = self.query_info[a], self.key_info[b]
            rows.append({"query_side": self.query_labels[a], "key_side": self.key_labels[b], "value": float(flat[i]),
                         "query_kind": qi["kind"], "key_kind": ki["kind"], "query_from": qi.get("from"),
                         "key_from": ki.get("from"), "query_feature": qi.get("feature"),
                         "key_feature": ki.get("feature")})
        ints = {c: "Int64" for c in ("query_from", "key_from", "query_feature", "key_feature")}
        return pd.DataFrame(rows, columns=["query_side", "key_side", "value", "query_kind", "key_kind", *ints]
                            ).astype(ints)

    def query_totals(self) -> list[tuple[str, float]]:
        """Each query-side part's share of the score (its terms summed over the key side), by |value|."""
        return _ranked(self.query_labels, self.terms.sum(1))

    def key_totals(self) -> list[tuple[str, float]]:
        """Each key-side part's share of the score (its terms summed over the query side), by |value|."""
        return _ranked(self.key_labels, self.terms.sum(0))


def _ranked(labels: list[str], values: torch.Tensor) -> list[tuple[str, float]]:
    return [(labels[i], float(values[i])) for i in values.abs().argsort(descending=True).tolist()]


# ---------------------------------------------------------------------------------------------- dictionaries


@dataclass(frozen=True)
class _Cover:
    """What one dictionary replaces: the whole key side (memory), an attention block's heads and bias, or an FFN."""

    dictionary: SparseDictionary
    site: Site
    what: str  # "memory", "attention" or "ffn"
    stack: str | None = None
    path: str | None = None  # the block's module path


def _covers(model, dictionaries: Iterable[SparseDictionary]) -> list[_Cover]:
    out = []
    blocks = {}
    for stack in ("enc", "dec"):
        for _, sub in model.stream(stack).sublayers():
            blocks[sub.block.hook_out.name] = (stack, sub)
    for d in dictionaries:
        site = site_of(d)
        if site.hook_in == model.hook_memory.name and not site.transcoder:
            out.append(_Cover(d, site, "memory"))
            continue
        if site.transcoder and site.hook_out in blocks and not blocks[site.hook_out][1].is_attention:
            stack, sub = blocks[site.hook_out]
            out.append(_Cover(d, site, "ffn", stack, path_of(sub.block)))
            continue
        if not site.transcoder and site.hook_in in blocks and blocks[site.hook_in][1].is_attention:
            stack, sub = blocks[site.hook_in]
            out.append(_Cover(d, site, "attention", stack, path_of(sub.block)))
            continue
        raise ValueError(f"a dictionary at {site.name!r} does not write one part of an attention score; QK attribution "
                         "takes SAEs on hook_memory or on an attention block's hook_out, and FFN transcoders")
    if len({c.site.name for c in out}) < len(out):
        raise ValueError(f"two dictionaries at one site: {[c.site.name for c in out]}")
    return out


def qk_dictionaries(model, dictionaries: Iterable[SparseDictionary]) -> list[SparseDictionary]:
    """The dictionaries QK attribution can expand (module doc), the first of each site: what a caller holding a
    checkpoint's whole `features/` folder passes on."""
    out, sites = [], set()
    for d in dictionaries:
        try:
            (cover,) = _covers(model, [d])
        except ValueError:
            continue
        if cover.site.name not in sites:
            sites.add(cover.site.name)
            out.append(d)
    return out


def _feature_parts(cover: _Cover, trace, position: int, dev: torch.device) -> tuple[list[str], list[dict],
                                                                                    torch.Tensor]:
    """The dictionary's raw writes at `position`: each active feature a_f W_dec[f], b_dec, the skip term, the error;
    they sum to the site's real value there exactly (float64, on `dev`)."""
    d, site = cover.dictionary, cover.site
    x = trace[site.hook_in][0, position]
    y = (trace[site.hook_out] if site.transcoder else trace[site.hook_in])[0, position].double().to(dev)
    with torch.no_grad():
        acts = d.encode(x.to(d.W_enc.device, d.W_enc.dtype)).double().to(dev)
        skip = d.skip(x.to(d.W_enc.device, d.W_enc.dtype))
    active = acts.nonzero().flatten()
    w_dec = d.W_dec.detach().double().to(dev)
    feats = acts[active, None] * w_dec[active]  # (F, D)
    layer = _layer(site.name)
    base = {"stack": "enc" if site.side == "src" else "dec", "layer": layer, "head_index": None, "site": site.name,
            "from": position}
    labels = [f"{site.name} f{int(f)}" for f in active.tolist()]
    info = [{**base, "kind": "feature", "feature": int(f), "activation": float(acts[f])} for f in active.tolist()]
    parts = [feats, d.b_dec.detach().double().to(dev)[None]]
    labels.append(f"{site.name} b_dec")
    info.append({**base, "kind": "dict_bias"})
    if isinstance(skip, torch.Tensor):
        parts.append(skip.detach().double().to(dev)[None])
        labels.append(f"{site.name} skip")
        info.append({**base, "kind": "dict_skip"})
    recon = torch.cat(parts).sum(0)
    parts.append((y - recon)[None])
    labels.append(f"{site.name} error")
    info.append({**base, "kind": "dict_error"})
    return labels, info, torch.cat(parts)


def _layer(name: str) -> int | None:
    p = name.split(".")
    return int(p[1]) if len(p) > 1 and p[1].isdigit() else None


# ------------------------------------------------------------------------------------------------- the parts


def _norms_after(events: list[tuple], path: str, position: int) -> list[tuple[Any, torch.Tensor]]:
    """The frozen norms (module, scale at `position`) that a write of block `path` passes through, in order."""
    start = next(n for n, ev in enumerate(events) if ev[0] == "write" and ev[1] == path)
    return [(ev[2], ev[3][0, position]) for ev in events[start + 1:] if ev[0] == "norm"]


def _through(x: torch.Tensor, chain: list[tuple[Any, torch.Tensor]]) -> torch.Tensor:
    for norm, scale in chain:
        x = frozen_norm(x, norm, scale.to(x.device))
    return x


def _writer(model, info: dict[str, Any]):
    kind = info["kind"]
    name = "ffn" if kind == "ffn" else _BLOCK_OF_KIND.get(kind.removesuffix("_bias"))
    return model.stream(info["stack"]).layers[info["layer"]].sublayer(name).block


def _expand(model, trace, labels, info, parts, *, position: int, events: list[tuple], covers: list[_Cover],
            by_position: bool) -> tuple[list[str], list[dict], torch.Tensor]:
    """The parts of one side at one position (parts (N, D), every norm applied), with heads split by the key they
    read and the blocks a dictionary covers replaced by its features; the result sums to the same vector."""
    by_path = {c.path: c for c in covers if c.what != "memory"}
    out_l: list[str] = []
    out_i: list[dict] = []
    out_p: list[torch.Tensor] = []
    done: set[str] = set()
    for label, inf, part in zip(labels, info, parts):
        kind = inf["kind"]
        if kind in ("embed", "ffn"):
            inf = {**inf, "from": position}
        block = _writer(model, inf) if kind in ("ffn", *_BLOCK_OF_KIND, *(k + "_bias" for k in _BLOCK_OF_KIND)) \
            else None
        path = None if block is None else path_of(block)
        if path in by_path:  # the dictionary's features stand for this block's whole write
            if path not in done:
                done.add(path)
                f_l, f_i, f_p = _feature_parts(by_path[path], trace, position, parts.device)
                out_l += f_l
                out_i += f_i
                out_p.append(_through(f_p, _norms_after(events, path, position)))
            continue
        if by_position and kind in _BLOCK_OF_KIND and isinstance(inf["head_index"], int):
            if path not in done:  # every head of the block at once: one pass through the frozen norms
                done.add(path)
                dev = parts.device
                probs = trace[block.hook_probs.name][0, :, position].double().to(dev)  # (H, K)
                v = trace[block.hook_v.name][0].double().to(dev)  # (H, K, Dh)
                w_o = block.head_weights().detach().double().to(dev)  # (H, Dh, D)
                raw = probs[..., None] * torch.einsum("hkd,hde->hke", v, w_o)  # (H, K, D)
                keep = probs.nonzero()  # (n, 2) (head, key); masked keys (causal, padding) carry exactly nothing
                out_p.append(_through(raw[keep[:, 0], keep[:, 1]], _norms_after(events, path, position)))
                side = "dec" if kind == "dec_self" else "enc"
                for (h, p), w in zip(keep.tolist(), probs[keep[:, 0], keep[:, 1]].tolist()):
                    out_l.append(f"{Head(kind, inf['layer'], h)} <- {p}")
                    out_i.append({**inf, "head_index": h, "from": p, "from_side": side, "weight": w})
            continue
        out_l.append(label)
        out_i.append(inf)
        out_p.append(part[None])
    return out_l, out_i, torch.cat(out_p)


# ---------------------------------------------------------------------------------------------- the analysis


def _block(model, kind: str, layer: int):
    """The attention block of `kind` ("cross", "enc_self", "dec_self") at `layer`, and its stack."""
    stack = stack_of(check_kind(kind))
    layers = model.stream(stack).layers
    if not 0 <= layer < len(layers):
        raise ValueError(f"layer {layer} out of range: the {stack} stack has {len(layers)} layers")
    return layers[layer].sublayer(_BLOCK_OF_KIND[kind]), stack


def qk_hooks(model, layer: int, dictionaries: Sequence[SparseDictionary] = (), by_position: bool = True,
             kind: str = "cross") -> list[str]:
    """The hook points one forward must capture for `qk_attributions` of `kind` at `layer`."""
    sub, stack = _block(model, kind, layer)
    if kind == "cross":
        names = split_hooks(model, layer)
        reads = (("enc", len(model.enc)), ("dec", layer + 1))
    else:
        names = [*_capture_names(model, stack, layer + 1), sub.block.hook_scores.name]
        names += [] if sub.norm_on_stream else [sub.norm.hook_scale.name]
        reads = ((stack, layer + 1),)
    names.append(sub.block.hook_probs.name)
    if by_position:
        for st, layers in reads:
            for _, other in model.stream(st).sublayers(layers):
                if other.is_attention and other.block is not sub.block:
                    names += [other.block.hook_probs.name, other.block.hook_v.name]
    for d in dictionaries:
        names += site_of(d).hooks
    return list(dict.fromkeys(names))


def _check_edge(model, src, tgt, kind, layer, head, t, s) -> tuple[int, int]:
    sub, stack = _block(model, kind, layer)
    heads = sub.block.n_heads
    if not 0 <= head < heads:
        raise ValueError(f"head {head} out of range: {path_of(sub.block)} has {heads} heads")
    q_len = src.size(1) if kind == "enc_self" else tgt.size(1)
    k_len = tgt.size(1) if kind == "dec_self" else src.size(1)
    if not -q_len <= t < q_len:
        raise ValueError(f"t={t} out of range for {q_len} query positions")
    if not -k_len <= s < k_len:
        raise ValueError(f"s={s} out of range for {k_len} key positions")
    t, s = t % q_len, s % k_len
    if kind == "dec_self" and s > t:
        raise ValueError(f"key {s} is after query {t}: decoder self-attention is causal, the score is masked")
    if kind != "dec_self" and int(src[0, s]) == model.cfg.pad_id:
        raise ValueError(f"source position {s} is padding: its score is the mask value, not a dot product")
    return t, s


def _reads(model, trace, kind: str, layer: int) -> tuple[tuple, tuple]:
    """((query labels, info, parts (N, B, Lq, D), events), (the same for the keys)) of the block: what it reads, as
    components, and the stream events up to it (with its pre-norm input norm), for splitting them further."""
    sub, stack = _block(model, kind, layer)
    events = _events(model, stack, layer + 1, trace)
    stop = next(n for n, ev in enumerate(events) if ev[0] == "write" and ev[1] == path_of(sub.block))
    events = events[:stop]
    if not sub.norm_on_stream:  # pre-norm: the block reads its input norm of the stream
        events.append(("norm", path_of(sub.norm), sub.norm, trace[sub.norm.hook_scale.name]))
    query = (*block_input(model, trace, stack, layer, sub.name), events)
    if kind != "cross":  # self-attention: queries and keys read the same stream
        return query, query
    return query, (*stream_components(model, trace, "enc", len(model.enc)),
                   _events(model, "enc", len(model.enc), trace))


@torch.no_grad()
def qk_attributions(model, src, tgt, edges: Iterable[tuple[int, int, int, int]], *, kind: str = "cross",
                    dictionaries: Sequence[SparseDictionary] | None = None, by_position: bool = True,
                    trace=None) -> list[QKAttribution]:
    """`qk_attribution` of many edges (layer, head, t, s) of one kind in one sentence, from one forward pass (or
    `trace`, holding `qk_hooks(model, layer, ..., kind=kind)` for every layer asked)."""
    src, tgt = _one(src, "src").to(model.device), _one(tgt, "tgt").to(model.device)
    edges = [tuple(int(x) for x in e) for e in edges]
    covers = _covers(model, dictionaries or ())
    if trace is None:
        names = []
        for layer in sorted({e[0] for e in edges}):
            names += qk_hooks(model, layer, [c.dictionary for c in covers], by_position, kind)
        with evaluating(model):  # dropout would make the parts sum to nothing reproducible
            _, trace = model.run_with_cache(src, tgt, names=list(dict.fromkeys(names)))
    memory = next((c for c in covers if c.what == "memory"), None) if kind == "cross" else None
    dev = model.device  # the parts are float64 on the model's device (its weights and norms are there); terms on CPU
    inputs: dict[int, tuple] = {}  # per layer: what its block reads, as components
    sides: dict[tuple, tuple] = {}  # the expanded parts of one side at one position (shared by many edges)
    out = []
    for layer, head, t, s in edges:
        t, s = _check_edge(model, src, tgt, kind, layer, head, t, s)
        if layer not in inputs:
            inputs[layer] = _reads(model, trace, kind, layer)
        (q_labels, q_info, q_parts, q_events), (k_labels, k_info, k_parts, k_events) = inputs[layer]
        sub, stack = _block(model, kind, layer)
        attn = sub.block
        q_stack, k_stack = stack, "enc" if kind == "cross" else stack
        reach = [c for c in covers if c.what != "memory"
                 and any(ev[0] == "write" and ev[1] == c.path
                         for ev in (q_events if c.stack == q_stack else k_events if c.stack == k_stack else ()))]
        # the key side of a cross-attention block is the memory: the same for every layer
        q_key, k_key = ("q", layer, t), ("k", s) if kind == "cross" else ("k", layer, s)
        if q_key not in sides:
            sides[q_key] = _expand(model, trace, q_labels, q_info, q_parts[:, 0, t].to(dev), position=t,
                                   events=q_events, covers=[c for c in reach if c.stack == q_stack],
                                   by_position=by_position)
        if k_key not in sides:
            sides[k_key] = _feature_parts(memory, trace, s, dev) if memory is not None else _expand(
                model, trace, k_labels, k_info, k_parts[:, 0, s].to(dev), position=s, events=k_events,
                covers=[c for c in reach if c.stack == k_stack], by_position=by_position)
        (ql, qi, qp), (kl, ki, kp) = sides[q_key], sides[k_key]
        terms = _qk_terms(attn, head, qp, kp, dev)
        bias_info = {"stack": None, "kind": "qk_bias", "layer": layer, "head_index": head, "from": None}
        unused = [c.site.name for c in covers if c not in reach and c is not memory]
        out.append(QKAttribution(
            layer, head, t, s, [*ql, QUERY_BIAS], [*qi, {**bias_info, "stack": q_stack}], [*kl, KEY_BIAS],
            [*ki, {**bias_info, "stack": k_stack}], terms,
            float(trace[attn.hook_scores.name][0, head, t, s]), float(trace[attn.hook_probs.name][0, head, t, s]),
            {"kind": kind, "by_position": by_position,
             "dictionaries": [c.site.name for c in covers if c.site.name not in unused], "unused": unused}))
    return out


def _qk_terms(attn, head: int, qp: torch.Tensor, kp: torch.Tensor, dev) -> torch.Tensor:
    """(A + 1, K + 1) on the CPU: each query part's query against each key part's key, for one head, scaled as the
    score is (the last row and column: the projections' biases)."""
    h, dh = attn.n_heads, attn.d_head
    w_q = attn.q_proj.weight.detach().double().to(dev).view(h, dh, -1)[head]  # (Dh, D)
    w_k = attn.k_proj.weight.detach().double().to(dev).view(h, dh, -1)[head]
    zero = torch.zeros(dh, dtype=torch.float64, device=dev)
    b_q = zero if attn.q_proj.bias is None else attn.q_proj.bias.detach().double().to(dev).view(h, dh)[head]
    b_k = zero if attn.k_proj.bias is None else attn.k_proj.bias.detach().double().to(dev).view(h, dh)[head]
    q = torch.cat([qp @ w_q.T, b_q[None]])  # (A + 1, Dh)
    k = torch.cat([kp @ w_k.T, b_k[None]])  # (K + 1, Dh)
    return (q @ k.T / math.sqrt(dh)).cpu()

def qk_attribution(model, src, tgt, *, layer: int, head: int, t: int, s: int, kind: str = "cross",
                   dictionaries: Sequence[SparseDictionary] | None = None, by_position: bool = True,
                   trace=None) -> QKAttribution:
    """The pre-softmax score of head `head` of the `kind` attention block ("cross", the default; "enc_self",
    "dec_self") at `layer`, at query position `t` and key position `s`, as query part × key part terms (module
    doc). `src`: one source (S,) or (1, S); `tgt`: its decoder input (start token first) (T,) or (1, T)."""
    return qk_attributions(model, src, tgt, [(layer, head, t, s)], kind=kind, dictionaries=dictionaries,
                           by_position=by_position, trace=trace)[0]


# ------------------------------------------------------------------------------- does a head attend to the word?

OWN = ("source token at s", "heads reading s", "FFN at s")
"""Key-side parts that carry the source piece at s itself (at one hop): its token embedding, what encoder heads
moved from s into s, the FFNs at s. The other categories: "position at s", "other positions" (what heads moved from
elsewhere), "biases", and with a memory dictionary "word feature" (a feature whose top corpus contexts are mostly
this very piece), "other feature", "dictionary error"."""
GROUPS = ("alignment head, argmax", "same head, random source piece", "other cross heads, argmax")
OFF_GOLD = "alignment head, argmax off gold"
"""With gold alignments: the head's argmax edges that gold does not link (GROUPS[0] then holds the linked ones)."""
READINGS = ("top pair", "key total", "key total, biases aside", "contrast")
"""Which key-side part of an edge is "the top one": the key side of the single largest term; the key part whose
terms summed over the query side are largest; the same without the bias parts (b_K, norm and block biases, a
dictionary's b_dec), which are (nearly) the same at every source piece and so hardly decide between them; and
("contrast", with `own_word_check(contrast=True)`) the key part that raises s most above the row's other pieces:
its summed share at s minus its mean share at the other pieces (EOS excluded; a part absent at a piece counts 0),
the softmax's own view, in which parts equal at every piece cancel."""


def key_category(info: dict[str, Any], label: str, s: int, word_feature: bool | None = None) -> str:
    """Which kind of key-side part this is, relative to the key position s (see `OWN`)."""
    kind = info["kind"]
    if kind == "embed":
        return "source token at s" if label.endswith("_tok") else "position at s"
    if kind == "ffn":
        return "FFN at s"
    if kind in _BLOCK_OF_KIND and isinstance(info.get("head_index"), int):
        if info.get("from") is None:
            return "heads, unsplit"
        return "heads reading s" if info["from"] == s else "other positions"
    if kind == "feature":
        return "word feature" if word_feature else "other feature"
    if kind == "dict_error":
        return "dictionary error"
    return "biases"


def feature_piece(stats, feature: int, side: str = "src") -> tuple[int | None, float]:
    """The piece a feature's top corpus contexts (`features.stats.FeatureStats`) fall on most, and the share of
    them it takes: (piece id, share), (None, 0.0) for a feature with no contexts."""
    sentences = stats.sentences_src if side == "src" else stats.sentences_tgt
    pieces = [sentences[sent][pos] for _, sent, pos in stats.contexts(int(feature)) if pos < len(sentences[sent])]
    if not pieces:
        return None, 0.0
    best = max(set(pieces), key=pieces.count)
    return best, pieces.count(best) / len(stats.contexts(int(feature)))


def word_features(stats, piece: int, features: Iterable[int], *, share: float = 0.5) -> set[int]:
    """The features among `features` whose top corpus contexts (a source-side dictionary's stats) fall on source
    piece `piece` at least `share` of the time."""
    out = set()
    for f in features:
        top, frac = feature_piece(stats, f)
        if top == piece and frac >= share:
            out.add(int(f))
    return out


@dataclass
class OwnWordCheck:
    """How often the top key-side part of an edge is the source piece's own, for a head's argmax edges against
    two controls: the same head at a random other source piece, and other cross-attention heads' argmax edges."""

    layer: int
    head: int
    counts: dict[str, dict[str, dict[str, int]]]  # reading -> group -> key category -> edges (READINGS)
    edges: dict[str, int]
    feature_chance: float | None = None  # mean share of the active memory features at s that are word features
    sentences: int = 0

    def share(self, group: str, categories: Sequence[str] = OWN, reading: str = "top pair") -> float:
        counts = self.counts[reading][group]
        return sum(counts.get(c, 0) for c in categories) / max(self.edges[group], 1)

    def frame(self):
        """group, reading (READINGS), category, edges, share."""
        import pandas as pd  # optional: only the tabular view needs it

        rows = []
        for reading, table in self.counts.items():
            for group, counts in table.items():
                for cat, n in sorted(counts.items(), key=lambda kv: -kv[1]):
                    rows.append({"group": group, "reading": reading, "category": cat, "edges": n,
                                 "share": n / max(self.edges[group], 1)})
        return pd.DataFrame(rows)


def _contrast_top(row: list[QKAttribution], s: int) -> tuple[str, dict[str, Any]]:
    """The key part that raises piece s most above the row's other pieces: its summed share at s minus its mean
    share at the others (absent: 0), with its info (from s, or from a piece that has it)."""
    labels = list(dict.fromkeys(lab for qk in row for lab in qk.key_labels))
    index = {lab: i for i, lab in enumerate(labels)}
    totals = torch.zeros(len(row), len(labels), dtype=torch.float64)  # (pieces, parts)
    for p, qk in enumerate(row):
        totals[p, [index[lab] for lab in qk.key_labels]] = qk.terms.sum(0)
    gain = totals[s] - (totals.sum(0) - totals[s]) / max(len(row) - 1, 1)
    label = labels[int(gain.argmax())]
    for qk in (row[s], *row):  # the piece's own info where it has the part
        if label in qk.key_labels:
            return label, qk.key_info[qk.key_labels.index(label)]
    raise AssertionError(label)


@torch.no_grad()
def own_word_check(model, sentences: Iterable[tuple], *, layer: int, head: int,
                   dictionary: SparseDictionary | None = None, stats=None, seed: int = 0,
                   contrast: bool = True) -> OwnWordCheck:
    """For each decoder position of each (source ids, decoder input ids) sentence where head (`layer`, `head`)'s
    argmax is a source piece (not the source's last piece, EOS), the QK attribution of that edge, of the same row at
    a random other piece, and of a random other cross head's argmax edge at the same row; counted by the category of
    the top key-side part (`key_category`). With a `dictionary` on `hook_memory` and its `stats`, the key side is its
    features, a feature counting as the word's own when `word_features` says so. `contrast` adds the "contrast"
    reading (READINGS), at the cost of attributing every piece of each row asked. A sentence given as (source ids,
    decoder input ids, gold) with `gold` a set of (decoder row, source piece) edges that gold alignments link: the
    head's argmax edges outside it are counted apart, as `OFF_GOLD`."""
    g = torch.Generator().manual_seed(seed)
    others = [(lay, h) for lay in range(len(model.dec)) for h in range(model.dec[lay].cross_attn.n_heads)
              if (lay, h) != (layer, head)]
    dicts = [dictionary] if dictionary is not None else []
    names = list(dict.fromkeys(n for lay in range(len(model.dec)) for n in qk_hooks(model, lay, dicts)))
    counts = {reading: {grp: {} for grp in (*GROUPS, OFF_GOLD)} for reading in READINGS}
    edges = dict.fromkeys((*GROUPS, OFF_GOLD), 0)
    chance: list[float] = []
    n_sent = 0
    with evaluating(model):
        for src_ids, tgt_ids, *gold in sentences:
            gold = gold[0] if gold else None
            src = torch.tensor([list(src_ids)], device=model.device)
            tgt = torch.tensor([list(tgt_ids)], device=model.device)
            _, trace = model.run_with_cache(src, tgt, names=names)
            n_sent += 1
            probs = {(lay, h): trace[model.dec[lay].cross_attn.hook_probs.name][0, h].cpu()
                     for lay, h in [(layer, head), *others]}
            asked = _asked_edges(probs, layer, head, others, src.size(1), tgt.size(1), gold, g)
            if not asked:
                continue
            rows: dict[tuple[int, int, int], list[QKAttribution]] = {}
            S = src.size(1)
            if contrast:  # every non-EOS piece of each row asked, in one call (each side expanded once per position)
                wanted = list(dict.fromkeys(e[:3] for _, e in asked))
                flat = qk_attributions(model, src, tgt, [(*row, p) for row in wanted for p in range(S - 1)],
                                       dictionaries=dicts, trace=trace)
                rows = {row: flat[i * (S - 1):(i + 1) * (S - 1)] for i, row in enumerate(wanted)}
                results = [rows[e[:3]][e[3]] for _, e in asked]
            else:
                results = qk_attributions(model, src, tgt, [e for _, e in asked], dictionaries=dicts, trace=trace)
            for (group, (lay, h, t, s)), qk in zip(asked, results):
                piece = int(src[0, s])
                feats = [i["feature"] for i in qk.key_info if i["kind"] == "feature"]
                own = word_features(stats, piece, feats) if stats is not None else set()
                if group == GROUPS[0] and feats:
                    chance.append(len(own) / len(feats))
                cats = _edge_categories(qk, s, own, rows[lay, h, t] if contrast else None)
                for reading, c in zip(READINGS, cats):
                    counts[reading][group][c] = counts[reading][group].get(c, 0) + 1
                edges[group] += 1
    if not edges[OFF_GOLD]:  # no gold given (or every argmax linked): no such group
        edges.pop(OFF_GOLD)
        for table in counts.values():
            table.pop(OFF_GOLD)
    return OwnWordCheck(layer, head, counts, edges, sum(chance) / len(chance) if chance else None, n_sent)


def _asked_edges(probs: dict, layer: int, head: int, others: list[tuple[int, int]], S: int, T: int, gold,
                 g: torch.Generator) -> list[tuple[str, tuple[int, int, int, int]]]:
    """`own_word_check`'s edges of one sentence, three per decoder row where the head's argmax is a source piece
    (not EOS): (group, (layer, head, row, piece)) for that edge (or OFF_GOLD when gold does not link it), a random
    other piece of the row, and a random other cross head's argmax edge; drawn from `g` in that order."""
    asked: list[tuple[str, tuple[int, int, int, int]]] = []
    for t in range(T):
        s = int(probs[layer, head][t].argmax())
        if s == S - 1 or S < 3:  # the row rests on EOS: the head is not aligning here
            continue
        r = int(torch.randint(S - 2, (1,), generator=g))
        r = r + 1 if r >= s else r  # a uniform other piece, EOS excluded
        lay, h = others[int(torch.randint(len(others), (1,), generator=g))]
        o = int(probs[lay, h][t, :-1].argmax())
        first = GROUPS[0] if gold is None or (t, s) in gold else OFF_GOLD
        asked += [(first, (layer, head, t, s)), (GROUPS[1], (layer, head, t, r)), (GROUPS[2], (lay, h, t, o))]
    return asked


def _edge_categories(qk: QKAttribution, s: int, own: set, row: list[QKAttribution] | None) -> list[str]:
    """The key-side category of one edge's top part under each reading (READINGS; "contrast" only with the row's
    attributions at every piece, `row`)."""
    def cat(k: int) -> str:
        inf = qk.key_info[k]
        return key_category(inf, qk.key_labels[k], s, inf.get("feature") in own)

    sums = qk.terms.sum(0)
    varying = torch.tensor([key_category(i, lab, s) != "biases" for i, lab in zip(qk.key_info, qk.key_labels)])
    picks = (int(qk.terms.abs().flatten().argmax()) % qk.terms.size(1), int(sums.abs().argmax()),
             int(sums.abs().masked_fill(~varying, -1).argmax()))
    cats = [cat(k) for k in picks]
    if row is not None:
        label, info = _contrast_top(row, s)
        cats.append(key_category(info, label, s, info.get("feature") in own))
    return cats

"""Circuit discovery over the whole encoder-decoder graph: edge attribution patching (EAP, Syed et al. 2023),
EAP with integrated gradients (EAP-IG, Hanna et al. 2024), exact edge patching, and circuit faithfulness.

    graph = EdgeGraph(model)                                  # senders x receivers, the valid edges
    scores = edge_scores(model, pairs, method="eap-ig")        # (senders, receivers), mean over pairs
    exact = edge_patching(model, pairs, edges)                 # the real (frozen-norm) patching effect of each edge
    f = circuit_faithfulness(model, pairs, graph.top_edges(scores, 200))

Graph. Senders: the source and target embeddings, every head of encoder self-, decoder self- and cross-attention,
every FFN. Receivers: each head's query, key and value inputs (split, as EAP-IG's `split_qkv`), each FFN's input,
the logits. A cross-attention head's query receiver reads the decoder stream; its key and value receivers read the
encoder output (`hook_memory`), so every encoder sender has an edge to every cross-attention key and value: the
question "which encoder heads feed which cross-attention heads' values" is a set of edges here.

Post-norm. EAP assumes a pre-norm model, where a receiver's input is the sum of the upstream senders' outputs
(before the receiver's own norm). In a post-norm model the stream passes through a norm after every sub-layer.
Here every norm's scale is frozen at the clean run's value, in every run (clean, corrupted, patched), so the stream
at every receiver is again a fixed linear function of the senders' outputs: sender u reaches receiver d through the
chain of frozen norms between them, Phi_{u->d}. Patching edge u -> d replaces Phi_{u->d}(out_u) in d's input by
Phi_{u->d}(out_u corrupted); everything else (attention patterns, FFN activations) is recomputed as usual. The clean
run is reproduced exactly; "corrupted" means the corrupted input through this frozen-norm model (its metric next to
the real corrupted run's is in each result's meta). Pre-norm models freeze their norms the same way.

Every run is the model's own forward pass on the replacement model (`core.replacement`, norms frozen): senders are
read at `hook_result`, `ffn.hook_out` and the embeddings, receivers edited at the per-head `hook_q_input` /
`hook_k_input` / `hook_v_input`, `ffn.hook_in` and `hook_dec_out`; nothing of the forward pass is written here.

Metric: the logit difference good - bad at the pair's position (`ContrastPair`). Scores follow EAP-IG's sign:
(corrupted - clean) . d metric / d input, the first-order estimate of metric(edge patched) - metric(clean).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ...core.heads import Head, kind_of
from ...core.hooks import path_of
from ...core.model import evaluating
from ...core.replacement import ReplacementModel

METHODS = ("eap", "eap-ig", "eap-ig-activations")


@dataclass
class Pair:
    """One contrastive example: clean and corrupted source (same length), the clean decoder input, and the
    logit difference good - bad at decoder position `position`. `ContrastPair` (noun_swaps) fits."""

    src: torch.Tensor  # (1, S)
    corrupted_src: torch.Tensor  # (1, S)
    tgt: torch.Tensor  # (1, T)
    position: int
    good: int
    bad: int


class EdgeGraph:
    """The senders, receivers and valid edges of a model (see the module docstring)."""

    def __init__(self, model) -> None:
        self.senders: list[str] = []
        self.receivers: list[str] = []
        s_info: list[tuple[str, int]] = []  # (stack, order): order = 2*layer (+1 for ffn), embeddings -1
        r_info: list[tuple[str, str, int]] = []  # (stream read: "enc" | "dec" | "mem", stack, order)
        for stack in ("enc", "dec"):
            self.senders.append("src_embed" if stack == "enc" else "tgt_embed")
            s_info.append((stack, -1))
            for i, layer in enumerate(getattr(model, stack)):
                blocks = [("enc_self", layer.self_attn)] if stack == "enc" else [("dec_self", layer.self_attn),
                                                                                ("cross", layer.cross_attn)]
                for j, (kind, attn) in enumerate(blocks):
                    order = 3 * i + j
                    for h in range(attn.n_heads):
                        name = str(Head(kind, i, h))  # type: ignore[arg-type]
                        self.senders.append(name)
                        s_info.append((stack, order))
                        for part in "qkv":
                            self.receivers.append(f"{name}.{part}")
                            r_info.append(("mem" if kind == "cross" and part != "q" else stack, stack, order))
                self.senders.append(path_of(layer.ffn))
                s_info.append((stack, 3 * i + 2))
                self.receivers.append(path_of(layer.ffn))
                r_info.append((stack, stack, 3 * i + 2))
        self.receivers.append("logits")
        r_info.append(("dec", "dec", 10**9))
        valid = torch.zeros(len(self.senders), len(self.receivers), dtype=torch.bool)
        for a, (s_stack, s_order) in enumerate(s_info):
            for b, (read, _, r_order) in enumerate(r_info):
                valid[a, b] = (read == "mem" and s_stack == "enc") or (read == s_stack and s_order < r_order)
        self.valid = valid
        self.s_index = {n: i for i, n in enumerate(self.senders)}
        self.r_index = {n: i for i, n in enumerate(self.receivers)}

    @property
    def n_edges(self) -> int:
        return int(self.valid.sum())

    def edges(self) -> list[tuple[int, int]]:
        return [tuple(e) for e in self.valid.nonzero().tolist()]  # type: ignore[misc]

    def edge_name(self, e: tuple[int, int]) -> str:
        return f"{self.senders[e[0]]} -> {self.receivers[e[1]]}"

    def top_edges(self, scores: torch.Tensor, n: int, *, absolute: bool = False) -> list[tuple[int, int]]:
        """The n valid edges with the most negative score (or the largest |score|)."""
        s = scores.abs() if absolute else -scores
        s = s.masked_fill(~self.valid, -math.inf)
        flat = s.flatten().argsort(descending=True)[:n]
        return [(int(i) // s.size(1), int(i) % s.size(1)) for i in flat]

    def receiver_node(self, r: int) -> str:
        """The node a receiver belongs to: "cross:1:0.q" -> "cross:1:0"; FFN and logits are their own."""
        name = self.receivers[r]
        return name[:-2] if name[-2:] in (".q", ".k", ".v") else name

    def greedy_edges(self, scores: torch.Tensor, n: int, *, absolute: bool = False) -> list[tuple[int, int]]:
        """EAP-IG's greedy search: from the logits backwards, repeatedly add the best edge into a node already in
        the circuit; then drop the edges that carry nothing (`connected`: a sender other than an embedding with no
        edge into it outputs its corrupted value; a receiver that sends nothing on reaches no logit); add more until
        n edges survive (at most n). Best: the most negative score (the edges whose patching lowers the metric most:
        the ones the clean behaviour needs), or with `absolute` the largest |score| (EAP-IG's default)."""
        want, tried, best = n, n, []
        for _ in range(50):
            chosen = self._greedy(scores, tried, absolute)
            if len(chosen) > want:  # cut back to n; the cut can leave edges that carry nothing: drop those too
                chosen = self.connected(chosen[:want])
            if len(chosen) > len(best):
                best = chosen
            if len(best) >= want or tried >= self.n_edges:
                break
            tried += want - len(chosen)
        return best

    def _greedy(self, scores: torch.Tensor, n: int, absolute: bool) -> list[tuple[int, int]]:
        s = (scores.abs() if absolute else -scores).masked_fill(~self.valid, -math.inf)
        by_node: dict[str, list[int]] = {}
        for r in range(len(self.receivers)):
            by_node.setdefault(self.receiver_node(r), []).append(r)
        heap: list[tuple[float, int, int]] = []
        active: set[str] = set()

        def activate(node: str) -> None:
            if node in active or node not in by_node:
                return
            active.add(node)
            for r in by_node[node]:
                for u in self.valid[:, r].nonzero()[:, 0].tolist():
                    heapq.heappush(heap, (-float(s[u, r]), u, r))

        activate("logits")
        chosen: list[tuple[int, int]] = []
        while heap and len(chosen) < n:
            _, u, r = heapq.heappop(heap)
            chosen.append((u, r))
            activate(self.senders[u])
        return self.connected(chosen)

    def connected(self, edges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """`edges` less those that carry nothing: repeatedly drop edges whose sender (an embedding aside) has no edge
        into it (it outputs its corrupted value) and edges whose receiver's node sends nothing on (nor is the
        logits): what is left is connected from the embeddings to the logits (EAP-IG's `prune`)."""
        chosen = list(edges)
        while True:
            fed = {self.receiver_node(r) for _, r in chosen}
            sending = {self.senders[u] for u, _ in chosen} | {"logits"}
            kept = [(u, r) for u, r in chosen if (self.senders[u].endswith("_embed") or self.senders[u] in fed)
                    and self.receiver_node(r) in sending]
            if len(kept) == len(chosen):
                return kept
            chosen = kept


# --------------------------------------------------------------------------------- the frozen-norm model


class _Frozen:
    """One sentence through the replacement model with every norm scale frozen at the clean run's
    (`core.replacement`), senders and receivers at the model's own hook points: a sender's write is `hook_result`
    (a head), `ffn.hook_out` or an embedding; a receiver's input is a head's `hook_q_input` / `hook_k_input` /
    `hook_v_input`, an FFN's `hook_in`, or the decoder output at the last position (the logits). `run` is batched over
    rows, each with its own edge weights (1 = clean edge, 0 = corrupted)."""

    def __init__(self, model, graph: EdgeGraph, pair: Pair) -> None:
        self.model, self.graph, self.cfg = model, graph, model.cfg
        dev = model.device
        self.src = pair.src.to(dev)
        self.tgt = pair.tgt[:, : pair.position + 1].to(dev)
        self.position, self.good, self.bad = pair.position, int(pair.good), int(pair.bad)
        embeds = {stack: model.stream(stack).hook_embed.name for stack in ("enc", "dec")}
        self.rm = ReplacementModel(model, self.src, self.tgt, freeze=("norms",), names=list(embeds.values()))
        logits = self.rm.logits
        self.real_clean = float(logits[0, -1, self.good] - logits[0, -1, self.bad])
        self.embeds = {stack: self.rm.clean[name][0] for stack, name in embeds.items()}
        with evaluating(model), torch.no_grad():
            c_logits, c_tr = model.run_with_cache(pair.corrupted_src.to(dev), self.tgt, names=list(embeds.values()))
        self.real_corrupted = float(c_logits[0, -1, self.good] - c_logits[0, -1, self.bad])
        self.c_embeds = {stack: c_tr[name][0] for stack, name in embeds.items()}
        self.corrupted_outputs: dict[int, torch.Tensor] | None = None

    # -- the run -----------------------------------------------------------------------------------------
    def run(self, weights: torch.Tensor | None = None, *, src_embed: torch.Tensor | None = None,
            leaves: bool = False, track: bool = False, batch: int = 1, alpha: torch.Tensor | None = None):
        """Metric per row (B,). `weights` (B, senders, receivers): 1 keeps the clean edge, 0 patches in the corrupted
        sender output (needs `corrupted_outputs`). `alpha` (B,): every edge of row b weighted alpha[b] at once (each
        receiver reads alpha x its senders' outputs + (1 - alpha) x their corrupted ones: EAP-IG over activations),
        without the (B, senders, receivers) tensor. `src_embed` (B, S, D) replaces the source embedding (IG).
        `leaves`: receiver inputs get a zero leaf each (returned for gradients). `track`: return each receiver's
        delta (clean - corrupted, propagated) for scoring. Also returns the senders' outputs of row 0."""
        B = next((t.size(0) for t in (weights, alpha, src_embed) if t is not None), batch)
        state = _EdgeState(self, None if weights is None else (1 - weights), leaves, track,
                           None if alpha is None else (1 - alpha))
        spec = state.hooks(src_embed)
        with self.rm.frozen(spec):
            logits = self.model(self.src.expand(B, -1), self.tgt.expand(B, -1))
        metric = logits[:, -1, self.good] - logits[:, -1, self.bad]
        return metric, state.calls, state.deltas, state.outputs

    def prepare(self) -> None:
        """Sender outputs of the corrupted input through the frozen-norm model (the donors)."""
        if self.corrupted_outputs is None:
            emb = self.c_embeds["enc"][None]
            with torch.no_grad():
                m, _, _, outs = self.run(src_embed=emb)
            # the target embedding is the same in both runs; the corrupted run differs from the source on
            outs[self.graph.s_index["tgt_embed"]] = self.embeds["dec"]
            self.corrupted_outputs = outs
            self.corrupted_metric = float(m[0])


class _EdgeState:
    """The hooks of one `_Frozen.run`: they record each sender's write (and its difference to the corrupted run's,
    carried through the frozen post-norms as the stream passes them), and at each receiver subtract the patched
    edges' differences and add a gradient leaf. The model's forward pass runs; nothing of it is re-derived here."""

    def __init__(self, net: _Frozen, coef: torch.Tensor | None, leaves: bool, track: bool,
                 uniform: torch.Tensor | None = None) -> None:
        self.net, self.g, self.coef, self.leaves, self.track = net, net.graph, coef, leaves, track
        self.uniform = uniform  # (B,): one coefficient for every edge of a row
        self.corr = net.corrupted_outputs
        self.need_delta = coef is not None or track or uniform is not None
        self.calls: list[tuple[torch.Tensor, list[int]]] = []
        self.deltas: dict[int, torch.Tensor] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.stack: tuple[list[int], torch.Tensor | None] = ([], None)  # sender ids, (u, B, L, D) differences
        self.memory: tuple[list[int], torch.Tensor | None] = ([], None)

    # -- senders and the stream --------------------------------------------------------------------------
    def emit(self, sender: int, out: torch.Tensor) -> None:
        """Record sender output (B, L, D); extend the difference stack."""
        self.outputs[sender] = out[0].detach()
        if self.need_delta:
            ids, d = self.stack
            diff = (out - self.corr[sender])[None] if self.corr is not None else torch.zeros_like(out)[None]
            self.stack = (ids + [sender], diff if d is None else torch.cat([d, diff]))

    def through(self, norm) -> None:
        """The stream passed `norm` (post-norm, or a final norm): so do the differences it carries."""
        ids, d = self.stack
        if self.need_delta and ids:
            self.stack = (ids, norm.linear(d, self.net.rm.scale(norm)))

    def receive(self, x: torch.Tensor, recv: list[int], stack, norm=None) -> torch.Tensor:
        """The inputs of receivers `recv`, (R, B, L, D) from `x` (B, L, D) already read (pre-norm: through `norm`):
        minus the patched edges' differences, plus a leaf each; the differences recorded for scoring."""
        ids, d = stack
        read = (lambda t: t) if norm is None else (lambda t: norm.linear(t, self.net.rm.scale(norm)))
        out = x[None].expand(len(recv), *x.shape)
        if self.coef is not None and ids:
            c = self.coef[:, ids][:, :, recv]  # (B, u, R)
            nz = c.nonzero()
            if len(nz) * 8 < c.numel():  # few patched edges (edge patching): only those rows change
                b_, u_, r_ = nz.T
                out = out.clone()
                out.index_put_((r_, b_), -read(c[b_, u_, r_][:, None, None] * d[u_, b_]), accumulate=True)
            elif len(nz):
                out = out - read(torch.einsum("bur,ubld->rbld", c, d))
        if self.uniform is not None and ids:
            out = out - read(self.uniform[:, None, None] * d.sum(0))[None]
        if self.track and ids:
            for r in recv:
                self.deltas[r] = d[:, 0] if d.size(1) == 1 else d.mean(1)
        if self.leaves:
            z = torch.zeros_like(out, requires_grad=True)
            self.calls.append((z, list(recv)))
            out = out + read(z)
        return out

    # -- the hooks -----------------------------------------------------------------------------------------
    def hooks(self, src_embed: torch.Tensor | None) -> list[tuple[str, object]]:
        """(hook name, function) for every sender's write and receiver's read of both stacks, the norms the
        differences pass, the memory hand-over and the logits' read; `src_embed` replaces the source embedding."""
        g, model = self.g, self.net.model
        spec: list[tuple[str, object]] = []
        for stack in ("enc", "dec"):
            stream = model.stream(stack)
            spec.append((stream.hook_embed.name, self._embed_hook(stack, src_embed)))
            for i, sub in stream.sublayers():
                read_norm = None if sub.norm_on_stream else sub.norm  # pre-norm: the receiver reads through it
                if sub.is_attention:
                    kind = kind_of(path_of(sub.block))
                    names = [str(Head(kind, i, h)) for h in range(sub.block.n_heads)]  # type: ignore[arg-type]
                    cross = sub.name == "cross_attn"
                    inputs = {"q": sub.block.hook_q_input, "k": sub.block.hook_k_input, "v": sub.block.hook_v_input}
                    for part, point in inputs.items():
                        recv = [g.r_index[f"{n}.{part}"] for n in names]
                        from_memory = cross and part != "q"
                        spec.append((point.name, self._split_input_hook(recv, from_memory,
                                                                        None if from_memory else read_norm)))
                    spec.append((sub.block.hook_result.name, self._heads_hook([g.s_index[n] for n in names])))
                else:
                    spec.append((sub.block.hook_in.name, self._ffn_in_hook(g.r_index[path_of(sub.block)], read_norm)))
                    spec.append((sub.block.hook_out.name, self._ffn_out_hook(g.s_index[path_of(sub.block)])))
                if sub.norm_on_stream:
                    spec.append((sub.hook_norm.name, self._norm_passed_hook(sub.norm)))
            if stream.final_norm is not None:
                spec.append((stream.hook_out.name, self._norm_passed_hook(stream.final_norm)))
            if stack == "enc":
                spec.append((stream.hook_out.name, self._memory_done))
        spec.append((model.stream("dec").hook_out.name, self._logits_in))
        return spec

    def _embed_hook(self, stack: str, src_embed: torch.Tensor | None):
        sender = self.g.s_index["src_embed" if stack == "enc" else "tgt_embed"]

        def fn(x, hook):
            if stack == "enc" and src_embed is not None:
                x = src_embed
            self.emit(sender, x)
            return x
        return fn

    def _heads_hook(self, senders: list[int]):
        def fn(x, hook):  # (B, H, L, D)
            for h, sender in enumerate(senders):
                self.emit(sender, x[:, h])
        return fn

    def _ffn_out_hook(self, sender: int):
        def fn(x, hook):
            self.emit(sender, x)
        return fn

    def _norm_passed_hook(self, norm):
        def fn(x, hook):
            self.through(norm)
        return fn

    def _split_input_hook(self, recv: list[int], memory: bool, norm):
        def fn(x, hook):  # (B, L, H, D): each head's copy of what the block reads
            stack = self.memory if memory else self.stack
            return self.receive(x[:, :, 0], recv, stack, norm).permute(1, 2, 0, 3)
        return fn

    def _ffn_in_hook(self, recv: int, norm):
        def fn(x, hook):
            return self.receive(x, [recv], self.stack, norm)[0]
        return fn

    def _memory_done(self, x, hook):  # the encoder's differences are what cross-attention keys and values read
        self.memory, self.stack = self.stack, ([], None)

    def _logits_in(self, x, hook):  # the decoder output; the logits read its last position
        last = self.receive(x[:, -1:], [self.g.r_index["logits"]], (self.stack[0], None if self.stack[1] is None
                                                                    else self.stack[1][:, :, -1:]))[0]
        return torch.cat([x[:, :-1], last], dim=1)

def _as_pair(p) -> Pair:
    return Pair(p.src, p.corrupted_src, p.tgt, int(p.position), int(p.good), int(p.bad))


# ------------------------------------------------------------------------------------------------ scores


@dataclass
class EdgeScores:
    scores: torch.Tensor  # (senders, receivers) mean over pairs; 0 on invalid edges
    graph: EdgeGraph
    method: str
    meta: dict[str, Any] = field(default_factory=dict)


def _grads(net: _Frozen, src_embed: torch.Tensor | None, batch: int,
           alpha: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
    """d metric / d receiver input, summed over rows: {receiver: (L, D)}."""
    with torch.enable_grad():
        m, calls, _, _ = net.run(src_embed=src_embed, leaves=True, batch=batch, alpha=alpha)
        leaves = [z for z, _ in calls]
        grads = torch.autograd.grad(m.sum(), leaves)
    out = {}
    for (_z, recv), gz in zip(calls, grads):
        for j, r in enumerate(recv):
            out[r] = gz[j].sum(0)
    return out


def edge_scores(model, pairs: Sequence, *, method: str = "eap-ig", steps: int = 16) -> EdgeScores:
    """EAP or EAP-IG scores of every valid edge, averaged over `pairs` (see the module docstring). "eap-ig"
    integrates the gradients along the straight line from the corrupted to the clean source embedding, `steps`
    points k/steps, k = 0..steps-1 (EAP-IG's convention), one batch per pair; "eap-ig-activations" along the line
    from every sender's corrupted output to its clean one (each receiver reads alpha x clean + (1 - alpha) x
    corrupted, Hanna et al. 2024's integration over activations, Marks et al.'s "ig" for SAE circuits)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not pairs:
        raise ValueError("edge_scores needs at least one pair")
    graph = EdgeGraph(model)
    total = torch.zeros(len(graph.senders), len(graph.receivers), dtype=torch.float64)
    with evaluating(model):
        for p in map(_as_pair, pairs):
            net = _Frozen(model, graph, p)
            net.prepare()
            with torch.no_grad():
                _, _, deltas, _ = net.run(track=True)
            if method == "eap":
                grads = _grads(net, None, 1)
            elif method == "eap-ig-activations":
                alphas = torch.arange(steps, dtype=torch.float32, device=net.src.device) / steps
                grads = {r: g / steps for r, g in _grads(net, None, steps, alpha=alphas).items()}
            else:
                clean, corr = net.embeds["enc"], net.c_embeds["enc"]
                alphas = torch.arange(steps, dtype=clean.dtype, device=clean.device) / steps
                emb = corr[None] + alphas[:, None, None] * (clean - corr)[None]
                grads = {r: g / steps for r, g in _grads(net, emb, steps).items()}
            for r, d in deltas.items():
                ids = _delta_ids(graph, r)
                total[ids, r] += torch.einsum("uld,ld->u", -d, grads[r]).double().cpu()
    total /= len(pairs)
    total[~graph.valid] = 0
    return EdgeScores(total, graph, method, {"pairs": len(pairs), "steps": steps if method == "eap-ig" else 1})


def _delta_ids(graph: EdgeGraph, r: int) -> list[int]:
    return graph.valid[:, r].nonzero()[:, 0].tolist()


# ------------------------------------------------------------------------------------------ interventions


def _weights(graph: EdgeGraph, rows: list[list[tuple[int, int]]], keep: bool) -> torch.Tensor:
    """(B, s, r): keep=False: all ones but the listed edges 0; keep=True: zeros but the listed edges 1."""
    w = torch.full((len(rows), len(graph.senders), len(graph.receivers)), 0.0 if keep else 1.0)
    for b, edges in enumerate(rows):
        if edges:
            s, r = torch.tensor(edges).T
            w[b, s, r] = 1.0 if keep else 0.0
    return w


def edge_patching(model, pairs: Sequence, edges: list[tuple[int, int]], *, batch_size: int = 64) -> torch.Tensor:
    """(E,) exact patching effect of each edge alone, metric(edge patched) - metric(clean), mean over pairs."""
    graph = EdgeGraph(model)
    out = torch.zeros(len(edges), dtype=torch.float64)
    with evaluating(model), torch.no_grad():
        for p in map(_as_pair, pairs):
            net = _Frozen(model, graph, p)
            net.prepare()
            clean = float(net.run()[0][0])
            for start in range(0, len(edges), batch_size):
                chunk = edges[start: start + batch_size]
                w = _weights(graph, [[e] for e in chunk], keep=False)
                out[start: start + len(chunk)] += net.run(w)[0].double().cpu() - clean
    return out / len(pairs)


def flips(clean: torch.Tensor, corrupted: torch.Tensor) -> torch.Tensor:
    """The stated rule for pairs a circuit is measured on: the clean run prefers `good` (clean > 0) and the real
    corrupted run prefers `bad` (corrupted < 0), so the corruption flips the prediction. Elsewhere
    clean - corrupted is small or of the wrong sign and a normalised score divides by noise."""
    return (clean > 0) & (corrupted < 0)


def _quartiles(x: torch.Tensor) -> dict[str, float]:
    if not len(x):
        return {"median": math.nan, "q1": math.nan, "q3": math.nan}
    q = torch.quantile(x.double(), torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    return {"median": float(q[1]), "q1": float(q[0]), "q3": float(q[2])}


def circuit_metric(model, pairs: Sequence, circuits: list[list[tuple[int, int]]], *,
                   flipping_only: bool = True) -> dict[str, Any]:
    """Each circuit's metric with only its edges clean (every other edge patched), per pair, next to the clean run,
    the real corrupted run (the model on the corrupted source) and the frozen-norm corrupted run (every edge
    patched). `normalized`: (circuit - real corrupted) / (clean - real corrupted) on the means: 1 = the circuit
    does all the clean run does, 0 = no more than the real corrupted input; `normalized_frozen` the same against the
    frozen-norm corrupted run, which is what the empty circuit gives (`normalized_frozen` of no edges is 0, of
    every edge 1). `per_pair` (P, C) the normalised value per pair, `quartiles` its median and quartiles per circuit.
    Pairs whose corruption does not flip the prediction (`flips`) are flagged in `flipping` and, with
    `flipping_only`, left out of every mean and distribution (`n_pairs` counts those used)."""
    graph = EdgeGraph(model)
    rows, clean, corr, real = [], [], [], []
    with evaluating(model), torch.no_grad():
        for p in map(_as_pair, pairs):
            net = _Frozen(model, graph, p)
            net.prepare()
            clean.append(net.real_clean)
            corr.append(net.corrupted_metric)
            real.append(net.real_corrupted)
            rows.append(net.run(_weights(graph, circuits, keep=True))[0].double().cpu())
    vals = torch.stack(rows)  # (P, C)
    clean_t, corr_t, real_t = (torch.tensor(v, dtype=torch.float64) for v in (clean, corr, real))
    flipping = flips(clean_t, real_t)
    use = flipping if flipping_only and bool(flipping.any()) else torch.ones_like(flipping)
    v, c, f, r = vals[use], clean_t[use], corr_t[use], real_t[use]
    per_pair = (v - r[:, None]) / (c - r)[:, None]
    mean = v.mean(0)
    return {"circuit": mean, "clean": float(c.mean()), "corrupted": float(f.mean()), "real_corrupted": float(r.mean()),
            "normalized": (mean - r.mean()) / (c.mean() - r.mean()),
            "normalized_frozen": (mean - f.mean()) / (c.mean() - f.mean()),
            "per_pair": per_pair, "quartiles": [_quartiles(per_pair[:, k]) for k in range(per_pair.size(1))],
            "flipping": flipping, "n_pairs": int(use.sum()), "flipping_only": flipping_only and bool(flipping.any())}


def iterative_circuits(model, pairs: Sequence, sizes: Sequence[int], *, step: float = 0.2
                       ) -> dict[int, list[tuple[int, int]]]:
    """Circuits of at most each of `sizes` edges by iterated EAP: start from every edge; at each step estimate, to
    first order *at the current circuit*, what each valid edge is worth there (EAP's product of the sender's output
    difference and the receiver-input gradient in the run where only the circuit's edges are clean, mean over
    `pairs`: the metric's loss if a circuit edge is removed, its gain if an edge outside is added back), keep the
    best (1 - `step`) x the circuit's size (down to the next size at most), then drop the edges left carrying
    nothing (`EdgeGraph.connected`). One gradient run per pair and step; the steps stop at each size asked for.
    One-shot EAP and EAP-IG estimate every edge at the clean run, where all other edges are clean; a circuit of a
    few % of the edges runs far from there. Re-ranking every edge, not only the circuit's, lets an edge removed too
    early come back. Returns {size: edges}."""
    if not pairs:
        raise ValueError("iterative_circuits needs at least one pair")
    if not 0 < step < 1:
        raise ValueError(f"step must be in (0, 1), got {step}")
    graph = EdgeGraph(model)
    todo = sorted({int(n) for n in sizes}, reverse=True)
    if not todo or todo[-1] < 1:
        raise ValueError(f"sizes must be positive edge counts, got {list(sizes)}")
    nets = []
    with evaluating(model):
        for p in map(_as_pair, pairs):
            net = _Frozen(model, graph, p)
            net.prepare()
            nets.append(net)
        everything = graph.edges()  # row-major, as est[graph.valid]
        current = list(everything)
        out: dict[int, list[tuple[int, int]]] = {}
        while todo:
            while todo and len(current) <= todo[0]:
                out[todo.pop(0)] = list(current)
            if not todo:
                break
            est = _removal_estimates(nets, current)  # an edge's worth is -est, in the circuit or not
            n_next = max(int(len(current) * (1 - step)), todo[0])
            keep = est[graph.valid].argsort()[:n_next].sort().values.tolist()
            current = graph.connected([everything[i] for i in keep])
    return out


def _removal_estimates(nets: list[_Frozen], circuit: list[tuple[int, int]]) -> torch.Tensor:
    """(senders, receivers): EAP's first-order estimate, at the run where only `circuit` is clean, of the metric's
    change when each edge is patched (removed from the circuit; for an edge outside it, minus the change when it
    is added back), mean over `nets`. At the whole graph: EAP."""
    graph = nets[0].graph
    w = _weights(graph, [circuit], keep=True)
    est = torch.zeros(len(graph.senders), len(graph.receivers), dtype=torch.float64)
    for net in nets:
        with torch.enable_grad():
            m, calls, deltas, _ = net.run(w, leaves=True, track=True)
            grads = torch.autograd.grad(m.sum(), [z for z, _ in calls])
        for (_z, recv), gz in zip(calls, grads):
            for j, r in enumerate(recv):
                est[_delta_ids(graph, r), r] -= torch.einsum("uld,ld->u", deltas[r].detach(), gz[j][0]).double().cpu()
    est /= len(nets)
    est[~graph.valid] = 0
    return est


def node_scores(scores: EdgeScores) -> dict[str, float]:
    """Each sender node's score: the sum of its out-edges' (patching its output everywhere, to first order)."""
    g = scores.graph
    total = (scores.scores * g.valid).sum(1)
    return {name: float(total[i]) for i, name in enumerate(g.senders) if not name.endswith("_embed")}


def node_circuit(graph: EdgeGraph, nodes: Sequence[str]) -> list[tuple[int, int]]:
    """The edges of a circuit of whole nodes (heads and FFNs): every valid edge from a kept node or an embedding
    into a kept node's query, key, value or input, or into the logits; a removed node's output is patched
    everywhere."""
    keep = set(nodes)
    unknown = sorted(keep - set(graph.senders))
    if unknown:
        raise ValueError(f"unknown nodes {unknown[:5]}: nodes are heads (cross:0:1) and FFNs (dec.1.ffn)")
    edges = [(u, r) for u, r in graph.edges()
             if (graph.senders[u].endswith("_embed") or graph.senders[u] in keep)
             and (graph.receivers[r] == "logits" or graph.receiver_node(r) in keep)]
    return graph.connected(edges)


def node_circuit_of_size(scores: EdgeScores, n_edges: int, *, absolute: bool = False) -> list[tuple[int, int]]:
    """The whole-node circuit (`node_circuit`) of the most important heads and FFNs by `node_scores` (the most
    negative first, or the largest |score|), as many as fit in `n_edges` edges."""
    ranked = sorted(node_scores(scores).items(), key=lambda kv: -abs(kv[1]) if absolute else kv[1])
    top: list[tuple[int, int]] = []
    chosen: list[str] = []
    for name, _ in ranked:
        edges = node_circuit(scores.graph, [*chosen, name])
        if len(edges) > n_edges:
            break
        chosen.append(name)
        top = edges
    return top


def circuit_faithfulness(model, pairs: Sequence, scores: EdgeScores, n_edges: int, *, random_circuits: int = 10,
                         seed: int = 0, search: str = "greedy", absolute: bool = False,
                         flipping_only: bool = True) -> dict[str, Any]:
    """Normalised faithfulness of a circuit of at most `n_edges` edges (`search`: "greedy", by score, see
    `EdgeGraph.greedy_edges`; "top": the top n by score; `absolute`: by |score|; "iterative": `iterative_circuits`,
    which takes its own gradients and reads only `scores.graph`; "nodes": the whole-node circuit (`node_circuit`) of
    the most important heads and FFNs by `node_scores`, as many as fit in n_edges), next to `random_circuits` random
    sets of valid edges of the circuit's size. Normalised against the real corrupted run (`faithfulness`) and the
    frozen-norm one (`faithfulness_frozen`); per-pair median and quartiles; pairs that do not flip left out with
    `flipping_only` (see `circuit_metric`)."""
    graph = scores.graph
    if search not in ("greedy", "top", "iterative", "nodes"):
        raise ValueError(f"search must be 'greedy', 'top', 'iterative' or 'nodes', got {search!r}")
    if search == "iterative":
        top = iterative_circuits(model, pairs, [n_edges])[n_edges]
    elif search == "greedy":
        top = graph.greedy_edges(scores.scores, n_edges, absolute=absolute)
    elif search == "nodes":
        top = node_circuit_of_size(scores, n_edges, absolute=absolute)
    else:
        top = graph.top_edges(scores.scores, n_edges, absolute=absolute)
    n_edges = len(top)
    all_edges = graph.edges()
    g = torch.Generator().manual_seed(seed)
    rand = [[all_edges[j] for j in torch.randperm(len(all_edges), generator=g)[:n_edges].tolist()]
            for _ in range(random_circuits)]
    res = circuit_metric(model, pairs, [top, *rand], flipping_only=flipping_only)
    norm, frozen = res["normalized"], res["normalized_frozen"]
    return {"n_edges": n_edges, "fraction": n_edges / graph.n_edges, "faithfulness": float(norm[0]),
            "faithfulness_frozen": float(frozen[0]), "quartiles": res["quartiles"][0],
            "random_faithfulness": [float(v) for v in norm[1:]],
            "random_faithfulness_frozen": [float(v) for v in frozen[1:]], "clean": res["clean"],
            "corrupted": res["corrupted"], "real_corrupted": res["real_corrupted"], "n_pairs": res["n_pairs"],
            "not_flipping": int((~res["flipping"]).sum()), "edges": [graph.edge_name(e) for e in top]}

"""Attribution graphs for one output token, through the encoder, cross-attention and the decoder.

    g = attribution_graph(model, src, tgt, position=4)          # the token the model predicts after tgt[4]
    g.logit == g.adjacency[-1].sum()                             # completeness: exact to fp64 (tested)
    keep = g.prune(0.8)                                          # nodes holding 80 % of the influence on the logit
    g.frame()                                                    # node, kind, stack, layer, head, position, ...

The local replacement model (circuit-tracer's, Ameisen et al. 2025) for an encoder-decoder: attention patterns,
layer-norm scales and the FFN gates (activation(pre) / pre, the ReLU mask for ReLU models) are frozen at the clean
run's values — `core.replacement.ReplacementModel`, the model's own modules in float64 held by hooks, which circuits
and the other decompositions share; the graph has no forward pass of its own. What is left is linear in the residual
streams, so every node's write decomposes exactly into the writes of the nodes upstream of it. Nodes:

    embed   source and target embeddings, one per position (token + position, as `hook_{src,tgt}_embed`)
    head    each head x query position of encoder self-, decoder self- and cross-attention (`hook_result`);
            its node carries its attention row (`attention`: one weight per key position). A feature graph has none
            by default: an attention block without a dictionary passes its rows through (`_Builder.pass_through`:
            with its pattern frozen it is linear, so its heads are edges, circuit-tracer's convention)
    ffn     each FFN x position (`ffn.hook_out`)
    bias    every constant (norm biases, attention and FFN biases) in one node
    error   per (stack, layer, position): what the frozen model fails to reconstruct of that layer's node writes
            (float64 rounding, ~1e-13: the freezing is exact at the clean point); a feature-level graph
            (`analysis.feature_graph`) adds one error node per dictionary site and position (`site` set): the
            dictionary's reconstruction error
    feature (feature-level graphs, `analysis.feature_graph`) an active dictionary feature at a site and position, in
            place of the head or FFN nodes of the block it sits on
    logit   the target logit (or logit difference), last

Edges run from the residual stream's writers to the readers: a head reads every key position through its
frozen pattern and its value/output matrices (so a source embedding or an encoder head reaches a cross-attention
head through the memory: "source -> cross-attention value/output" edges), an FFN reads its own position, the logit
reads the decoder's final stream at `position`. Query and key paths are frozen, as in circuit-tracer.

Scalars: node t's attribution is a_t = g_t . w_t, with w_t its write and g_t the gradient of the logit with
respect to that write in the frozen model (every path, through every later node). Edge s -> t is
A[t, s] = g_t . (the part of w_t that s's write makes). Then, exactly: the edges into t plus its bias and error
edges sum to a_t; the edges out of s sum to a_s; the logit's edges sum to the logit; the source nodes'
(embeddings, bias, errors) attributions sum to the logit. a_t is also what removing t's write changes the logit by
in the frozen model. The real model's response to removing nodes is measured by `remove_nodes`.

Influence and pruning follow circuit-tracer: A normalised row-wise by absolute value, influence on the logit
summed over every path length; `prune` keeps the fewest nodes holding a fraction of the total.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import torch

from ...core.batching import decoder_input
from ...core.hooks import path_of
from ...core.layers import Sublayer
from ...core.model import evaluating
from ...core.protocols import Progress
from ...core.replacement import ReplacementModel

NODE_KINDS = ("embed", "bias", "error", "head", "ffn", "feature", "logit")


@dataclass
class AttributionGraph:
    """Nodes (dicts) and the dense adjacency A[target, source]; the logit node is last."""

    nodes: list[dict[str, Any]]
    adjacency: torch.Tensor  # (N, N) float64
    attribution: torch.Tensor  # (N,) a_t = g_t . w_t; the logit node holds the logit
    logit: float  # the real model's logit (difference), fp32 run
    position: int
    token: int
    baseline_token: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    _influence: torch.Tensor | None = None

    @property
    def influence(self) -> torch.Tensor:
        """(N,) each node's influence on the logit through every path, on |A| normalised per row (circuit-tracer)."""
        if self._influence is None:
            self._influence = node_influence(self.adjacency)
        return self._influence

    def prune(self, node_threshold: float = 0.8, max_nodes: int | None = None) -> torch.Tensor:
        """Indices of the fewest nodes whose influence reaches `node_threshold` of the total, plus the logit node;
        with `max_nodes`, at most that many nodes besides the logit (the most influential ones: of every set of that
        size, the one holding the largest share). circuit-tracer's node pruning (`find_threshold` on the same
        influence), except that it also keeps every input token whatever its influence; embeddings, error and bias
        nodes are ranked and counted here like any other node."""
        if not 0 < node_threshold <= 1:
            raise ValueError(f"node_threshold must be in (0, 1], got {node_threshold}")
        if max_nodes is not None and max_nodes < 1:
            raise ValueError(f"max_nodes must be at least 1, got {max_nodes}")
        inf = self.influence[:-1]
        order = inf.argsort(descending=True)
        total = float(inf.sum())
        if total <= 0:
            return torch.tensor([len(self.nodes) - 1])
        cum = inf[order].cumsum(0) / total
        n = int((cum < node_threshold - 1e-12).sum()) + 1
        if max_nodes is not None:
            n = min(n, max_nodes)
        return torch.cat([order[:n].sort().values, torch.tensor([len(self.nodes) - 1])])

    def index(self, **match) -> list[int]:
        """Indices of the nodes whose fields equal `match` (e.g. kind="head", block="cross_attn")."""
        return [i for i, n in enumerate(self.nodes) if all(n.get(k) == v for k, v in match.items())]

    def frame(self):
        """A pandas DataFrame, one row per node, with its attribution and influence."""
        import pandas as pd  # optional: only the tabular view needs it

        rows = [{**n, "attribution": float(a), "influence": float(i)}
                for n, a, i in zip(self.nodes, self.attribution, self.influence)]
        return pd.DataFrame(rows)


def node_influence(adjacency: torch.Tensor) -> torch.Tensor:
    """Influence of every node on the last (logit) node: e_logit (B + B^2 + ...), B = |A| with rows summing to 1."""
    if len(adjacency) > ORDERED_INFLUENCE:
        ordered = _ordered_influence(adjacency)
        if ordered is not None:
            return ordered
    a = adjacency.abs()
    b = a / a.sum(1, keepdim=True).clamp(min=1e-30)
    cur = b[-1].clone()
    total = cur.clone()
    for _ in range(len(b)):  # a DAG: the powers vanish after its depth
        cur = cur @ b
        if not bool(cur.any()):
            break
        total += cur
    return total


ORDERED_INFLUENCE = 2048
"""Above this many nodes (feature graphs: ~7,500 at 20 source and 24 target tokens) influence is solved in node order
(`_ordered_influence`) rather than summed as a power series over a dense |A| (head graphs keep the series)."""


def _ordered_influence(adjacency: torch.Tensor, chunk: int = 512) -> torch.Tensor | None:
    """`node_influence` for a graph whose nodes are in topological order (every edge runs from a lower index to a
    higher one, as the builder adds them), None for any other. Then y = e_logit + y B is solved from the last node
    down, `chunk` nodes at a time: each chunk's part of y is what the finished later nodes send it, through a
    triangular solve for the edges inside the chunk. Every entry of A is read once or twice, where the power series
    reads it once per path length (2.5 s against 0.3 s at 7,500 nodes)."""
    n = len(adjacency)
    rowsum = torch.linalg.vector_norm(adjacency, 1, dim=1).clamp(min=1e-30)
    y = torch.zeros(n, dtype=adjacency.dtype)
    y[n - 1] = 1.0
    for hi in range(n, 0, -chunk):
        lo = max(hi - chunk, 0)
        if bool(adjacency[lo:hi, lo:].triu().any()):
            return None  # an edge from a node to itself or an earlier one
        base = (y[hi:] / rowsum[hi:]) @ adjacency[hi:, lo:hi].abs()
        if hi == n:
            base[-1] += 1.0
        inner = adjacency[lo:hi, lo:hi].abs() / rowsum[lo:hi, None]  # strictly lower triangular
        eye = torch.eye(hi - lo, dtype=adjacency.dtype)
        y[lo:hi] = torch.linalg.solve_triangular(eye - inner, base[None], upper=False, left=False)[0]
    y[n - 1] -= 1.0
    return y


# ---------------------------------------------------------------------------------------------- the frozen model


def _blocks(model, stack: str) -> list[tuple[tuple[str, int, str], Sublayer]]:
    """((stack, layer, block name), sub-layer) of a stack in the order they write."""
    return [((stack, i, sub.name), sub) for i, sub in model.stream(stack).sublayers()]


def _capture_names(model) -> list[str]:
    """What the graph reads of the clean run besides what the replacement model freezes: the embeddings, each
    head's and FFN's write, what each FFN reads."""
    names = [model.stream("enc").hook_embed.name, model.stream("dec").hook_embed.name]
    for stack in ("enc", "dec"):
        for _, sub in _blocks(model, stack):
            names += [sub.block.hook_result.name] if sub.is_attention else [sub.block.hook_out.name,
                                                                             sub.hook_block_in.name]
    return names


def _tokens(ids, name: str) -> torch.Tensor:
    t = torch.as_tensor(ids, dtype=torch.long)
    t = t.view(1, -1) if t.dim() == 1 else t
    if t.dim() != 2 or t.size(0) != 1 or t.size(1) == 0:
        raise ValueError(f"{name} must be one non-empty sentence, (L,) or (1, L); got shape {tuple(t.shape)}")
    return t


def _check_unpadded(model, src: torch.Tensor, tgt: torch.Tensor) -> None:
    """One unpadded sentence. The decoder's start id may be the padding id (Marian's convention): position 0 then
    holds it and is a position like any other."""
    pad = model.cfg.pad_id
    later = tgt[:, 1:] if model.cfg.start_id == pad else tgt
    if bool((src == pad).any()) or bool((later == pad).any()):
        raise ValueError("attribution_graph takes one unpadded sentence: its ids contain the padding id")


# ---------------------------------------------------------------------------------------------------- the graph


def graph_size(model, src_len: int, position: int, *, head_nodes: bool = True) -> int:
    """How many nodes `attribution_graph` builds for a source of `src_len` tokens and decoder `position` (before
    building it: the adjacency is nodes² float64, 8 bytes each); without `head_nodes`, the attention blocks' share
    left out (a feature graph's pass-through blocks)."""
    t = position + 1
    n = src_len + t + 2  # embeddings, bias, logit
    for stack, length in (("enc", src_len), ("dec", t)):
        stream = model.stream(stack)
        n += len(stream.layers) * length  # error nodes: one per layer and position
        for _, sub in stream.sublayers():  # a head x position or an FFN x position
            if sub.is_attention and not head_nodes:
                continue
            n += (sub.block.n_heads if sub.is_attention else 1) * length
    return n



TARGETS = ("logit", "runner-up", "demeaned")


def attribution_graph(model, src, tgt, position: int = -1, token: int | None = None, *,
                      baseline_token: int | None = None, target: str = "logit",
                      src_tokens: list[str] | None = None, tgt_tokens: list[str] | None = None,
                      progress: Progress | None = None) -> AttributionGraph:
    """The attribution graph of the logit of `token` (default: the model's top token) at decoder position
    `position` (the token predicted after reading tgt[position]); with `baseline_token`, of the logit difference.
    `target`: "logit" (that logit, or the difference to `baseline_token`), "runner-up" (the difference to the
    best other token: what decides the choice) or "demeaned" (the logit minus the mean logit over the vocabulary:
    free of what raises every logit alike). A raw logit is dominated by what every token shares, which the
    embeddings carry; the two others measure the choice itself (issue 38 point 4).
    `src`, `tgt`: one sentence of ids (a decoder that starts with the padding id, as Marian's, is fine).
    `src_tokens` / `tgt_tokens` (optional) label the nodes. `progress(done, total)` is called after each sub-layer
    of the backward and the forward pass (an exception it raises, such as a request path's cancellation, ends the
    construction there).

    Everything runs on the replacement model (`core.replacement`): the model's own modules in float64 with attention,
    norm scales and FFN gates frozen at the clean run. The gradients come from one backward pass through it; the
    writes are decomposed by walking each layer with its own `compose` (so pre- and post-norm are said once, in
    core) on a tensor whose rows are the nodes' contributions."""
    src, tgt, position = _target(model, src, tgt, position, token, baseline_token, target)
    rm = ReplacementModel(model, src, tgt, dtype=torch.float64, names=_capture_names(model))
    return _build(rm, position, token, baseline_token, target, src_tokens, tgt_tokens, progress, head_nodes=True)


def target_of(logits: torch.Tensor, graph: AttributionGraph) -> torch.Tensor:
    """`graph`'s target read from logits over the vocabulary (last axis): the token's logit, less the baseline
    token's when it has one, less the mean logit for a "demeaned" graph. What interventions compare."""
    out = logits[..., graph.token]
    if graph.baseline_token is not None:
        out = out - logits[..., graph.baseline_token]
    if graph.meta.get("target") == "demeaned":
        out = out - logits.mean(-1)
    return out


def _target(model, src, tgt, position: int, token: int | None, baseline_token: int | None, target: str):
    """Checked (src, tgt cut after `position`, position >= 0): the arguments every graph takes."""
    src, tgt = _tokens(src, "src").to(model.device), _tokens(tgt, "tgt").to(model.device)
    if not -tgt.size(1) <= position < tgt.size(1):
        raise ValueError(f"position {position} out of range for a target prefix of {tgt.size(1)} tokens")
    _check_unpadded(model, src, tgt)
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}; got {target!r}")
    if target != "logit" and baseline_token is not None:
        raise ValueError(f"target {target!r} chooses its own baseline: leave baseline_token out")
    position %= tgt.size(1)
    tgt = tgt[:, : position + 1]  # later decoder positions cannot reach this logit (causal)
    vocab = model.output_proj.weight.size(0)
    for t in (token, baseline_token):
        if t is not None and not 0 <= int(t) < vocab:
            raise ValueError(f"token {t} out of range: the target vocabulary has {vocab} entries")
    return src, tgt, position


def _build(rm: ReplacementModel, position: int, token: int | None, baseline_token: int | None, target: str,
           src_tokens, tgt_tokens, progress, *, head_nodes: bool) -> AttributionGraph:
    """The graph on a replacement model (with or without dictionaries): the target's coefficients, then the walk.
    Without `head_nodes`, an attention block without a dictionary has no nodes: it passes its input rows through
    (`_Builder.pass_through`)."""
    vocab = rm.model.output_proj.weight.size(0)
    row = rm.logits[0, position]
    if token is None:
        token = int(row.argmax())
    if target == "runner-up":
        baseline_token = int(row.clone().index_fill_(0, torch.tensor([token]), float("-inf")).argmax())
    coef = torch.zeros(vocab, dtype=torch.float64)  # the target as a combination of logits
    coef[token] += 1
    if baseline_token is not None:
        coef[baseline_token] -= 1
    if target == "demeaned":
        coef -= 1.0 / vocab
    logit = float(row @ coef)
    builder = _Builder(rm, position, coef, src_tokens, tgt_tokens, progress, head_nodes)
    return builder.build(logit, token, baseline_token, target)


class _Builder:
    """One graph: gradients from the frozen model's backward pass, then the contribution walk (see
    `attribution_graph`). Split out of it for the two passes' shared state, not for reuse."""

    def __init__(self, rm: ReplacementModel, position: int, coef: torch.Tensor, src_tokens, tgt_tokens, progress,
                 head_nodes: bool = True):
        self.rm, self.m, self.position, self.coef = rm, rm.model, position, coef
        self.x = {k: v[0] for k, v in rm.clean.items()}  # drop the batch axis
        self.length = {"enc": rm.src.size(1), "dec": rm.tgt.size(1)}
        self.blocks = {s: _blocks(self.m, s) for s in ("enc", "dec")}
        self.sites = _feature_sites(rm, self.blocks)  # block key or "memory" -> the dictionary's SiteFeatures
        self.passthrough = set() if head_nodes else {key for s in ("enc", "dec") for key, sub in self.blocks[s]
                                                     if sub.is_attention and key not in self.sites}
        self.names = {"enc": src_tokens, "dec": tgt_tokens}
        self.progress = progress
        self.steps, self.total = 0, 2 * (len(self.blocks["enc"]) + len(self.blocks["dec"])) + ("memory" in self.sites)

    def step(self) -> None:
        self.steps += 1
        if self.progress is not None:
            self.progress(self.steps, self.total)

    # -- backward: the gradient of the target at every write ---------------------------------------------------
    def gradients(self) -> tuple[dict[tuple, torch.Tensor], dict[str, torch.Tensor]]:
        """(L, D) gradient of the target with respect to each block's write (every head of a block writes to the
        same place) and to each stack's embedding, in the frozen model: one backward pass."""
        leaves: dict[str, torch.Tensor] = {}

        def tap(x, hook):
            leaves[hook.name] = torch.zeros_like(x, requires_grad=True)
            return x + leaves[hook.name]

        names = [self.m.stream(s).hook_embed.name for s in ("enc", "dec")]
        names += [sub.block.hook_out.name for s in ("enc", "dec") for _, sub in self.blocks[s]]
        memory = self.m.stream("enc").hook_out.name
        if "memory" in self.sites:  # the memory dictionary's output: its features' coefficients
            names.append(memory)
        with torch.enable_grad():
            logits = self.rm(extra=[(n, tap) for n in names])
            grads = torch.autograd.grad(logits[0, self.position] @ self.coef, [leaves[n] for n in names])
        g = {n: gr[0] for n, gr in zip(names, grads)}
        out = {key: g[sub.block.hook_out.name] for s in ("enc", "dec") for key, sub in self.blocks[s]}
        if "memory" in self.sites:
            out["memory"] = g[memory]
        return out, {s: g[self.m.stream(s).hook_embed.name] for s in ("enc", "dec")}

    def reading(self, key, sub: Sublayer, g: torch.Tensor) -> torch.Tensor:
        """Each node's reading direction: the gradient of g . (its write) with respect to what it reads. FFN (L, D):
        the frozen FFN's backward at each position; heads (H, Lq, D): the head's OV circuit applied to g (the
        pattern weights each key by its probability)."""
        block = sub.block
        if key in self.sites or key in self.passthrough:  # features read through their encoder rows; no nodes
            return g
        if sub.is_attention:
            return torch.einsum("hdf,qf->hqd", block.ov().detach(), g)
        with torch.enable_grad(), self.rm.frozen():
            inp = self.x[sub.hook_block_in.name][None].clone().requires_grad_(True)
            return torch.autograd.grad(block(inp), inp, g[None])[0][0]

    # -- the graph -------------------------------------------------------------------------------------------
    def build(self, logit: float, token: int, baseline_token: int | None, target: str) -> AttributionGraph:
        g_node, g_emb = self.gradients()
        r_dir = {}
        for stack in ("dec", "enc"):
            for key, sub in reversed(self.blocks[stack]):
                r_dir[key] = self.reading(key, sub, g_node[key])
                self.step()
        nodes, ids = self.nodes()
        n = len(nodes)
        self.A = torch.zeros(n, n, dtype=torch.float64)
        self.attribution = torch.zeros(n, dtype=torch.float64)
        self.ids = ids
        memory = None
        for stack in ("enc", "dec"):
            stream = self.m.stream(stack)
            rows = _Rows(self, stack, ids, memory[1] if memory is not None else None)
            self.attribution[rows.node[: self.length[stack]]] = (g_emb[stack] * self.x[stream.hook_embed.name]).sum(-1)
            c = rows.start(self.x[stream.hook_embed.name])

            def block_fn(sub: Sublayer, h: torch.Tensor, rows=rows, stack=stack) -> torch.Tensor:
                key = (stack, self._layer_of(sub, stack), sub.name)
                out = self.edges_into(key, sub, h if sub.name != "cross_attn" else memory, rows,  # noqa: B023 (set by the encoder pass before the decoder runs)
                                      g_node[key], r_dir[key])
                self.step()
                return out

            with evaluating(self.m), torch.no_grad(), self.m.hooks(rows.norm_hooks()):
                for layer in stream.layers:
                    c = layer.compose(c, block_fn)
            if stream.final_norm is not None:
                with torch.no_grad():
                    c = rows.norm(stream.final_norm, c)
            if stack == "enc":
                memory = (c, rows) if "memory" not in self.sites else self._memory_features(c, rows, g_node["memory"])
        at = rows.pos == self.position
        u = self.m.output_proj.weight.detach().t() @ self.coef  # (D,): the target's direction in the final stream
        out_bias = 0.0 if self.m.output_proj.bias is None else float(self.m.output_proj.bias.detach() @ self.coef)
        contrib = c[at, 0] @ u
        bias_id, logit_id = ids["bias"], ids["logit"]
        real = rows.node[at] >= 0
        self.A[logit_id, rows.node[at][real]] = contrib[real]
        self.A[logit_id, bias_id] = float(contrib[~real].sum()) + out_bias
        site_errors = [j for nd in ids["features"].values() for j in nd["errors"].tolist()]
        for j in [bias_id, *ids["error"].values(), *site_errors]:  # sources: the sum of their out-edges
            self.attribution[j] = self.A[:, j].sum()
        self.attribution[logit_id] = self.A[logit_id].sum()
        cfg = self.m.cfg
        meta = {"src_len": self.length["enc"], "tgt_len": self.length["dec"], "norm_first": cfg.norm_first,
                "target": target}
        nodes[logit_id]["token"] = token
        return AttributionGraph(nodes, self.A, self.attribution, logit, self.position, token, baseline_token, meta)

    def _layer_of(self, sub: Sublayer, stack: str) -> int:
        for (_, i, _), other in self.blocks[stack]:
            if other.block is sub.block:
                return i
        raise AssertionError("a sub-layer outside the model")

    def edges_into(self, key, sub: Sublayer, h, rows: _Rows, g: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """Fill the edges into block `key`'s nodes from the rows it reads, `h` (rows, 1, D), or the memory's rows for
        cross-attention; return the block's writes as rows (its nodes' rows hold their clean writes, the bias rows
        its constant)."""
        if sub.name == "cross_attn":
            h, read_rows = h
        else:
            read_rows = rows
        stack, i, _ = key
        A, ids, block = self.A, self.ids, sub.block
        bias_id = ids["bias"]
        hs = h[:, 0]  # (n_read, D)
        stream_in = torch.zeros(self.length[read_rows.stack], hs.size(1), dtype=hs.dtype)
        stream_in.index_add_(0, read_rows.pos, hs)  # the input the block reads, as the rows rebuild it
        out = torch.zeros(rows.n, 1, hs.size(1), dtype=hs.dtype)
        err_ids = torch.tensor([ids["error"][stack, i, q] for q in range(self.length[stack])])
        if key in self.sites:
            return self._feature_edges(key, sub, hs, rows, read_rows, stream_in, g, out, err_ids)
        if key in self.passthrough:
            return self.pass_through(key, sub, hs, rows, read_rows, out)
        own = rows.block_rows[key]
        real = read_rows.node >= 0
        if sub.is_attention:
            tids = ids["blocks"][key]  # (H, Lq)
            H, Lq = tids.shape
            probs = self.rm.probs(block)[0]  # (H, Lq, Lk)
            write = self.x[block.hook_result.name]  # (H, Lq, D)
            weights = probs[:, :, read_rows.pos] * torch.einsum("nd,hqd->hqn", hs, r)  # (H, Lq, n_read)
            sources, by_node = _by_node(weights[:, :, real].reshape(H * Lq, -1), read_rows.node[real])
            A[tids.reshape(-1, 1), sources.reshape(1, -1)] = by_node
            with self.rm.frozen(), self.m.capture([block.hook_result.name]) as seen:
                self._call(sub, torch.zeros_like(stream_in), stack)
                value_bias = seen[block.hook_result.name][0][0]  # (H, Lq, D): the heads' output on a zero input
                self._call(sub, stream_in, stack)
                recon = seen[block.hook_result.name][1][0]
            A[tids.reshape(-1), bias_id] = (weights[:, :, ~real].sum(-1) + (g[None] * value_bias).sum(-1)).reshape(-1)
            A[tids.reshape(-1), err_ids.repeat(H)] += ((write - recon) * g[None]).sum(-1).reshape(-1)
            self.attribution[tids.reshape(-1)] = (g[None] * write).sum(-1).reshape(-1)
            for node, row in zip(tids.reshape(-1).tolist(), probs.reshape(H * Lq, -1).tolist()):
                self.nodes_list[node]["attention"] = [round(v, 4) for v in row]
            out[own.reshape(-1), 0] = write.reshape(H * Lq, -1)
            if block.out_proj.bias is not None:
                out[rows.bias_rows, 0] += block.out_proj.bias.detach()
            return out
        tids = ids["blocks"][key]  # (L,)
        write = self.x[block.hook_out.name]  # (L, D)
        dots = (hs * r[read_rows.pos]).sum(-1)  # each row read at its own position
        A[tids[read_rows.pos[real]], read_rows.node[real]] = dots[real]
        with torch.no_grad(), self.rm.frozen():
            const = block(torch.zeros_like(stream_in)[None])[0]  # the frozen FFN on a zero input: its constant
            recon = block(stream_in[None])[0]
        bias_dots = torch.zeros(len(tids), dtype=hs.dtype).index_add_(0, read_rows.pos[~real], dots[~real])
        A[tids, bias_id] = bias_dots + (g * const).sum(-1)
        A[tids, err_ids] += ((write - recon) * g).sum(-1)  # += : a pass-through block's error rows may be read too
        self.attribution[tids] = (g * write).sum(-1)
        out[own, 0] = write
        return out

    def pass_through(self, key, sub: Sublayer, hs: torch.Tensor, rows: _Rows, read_rows, out: torch.Tensor
                     ) -> torch.Tensor:
        """An attention block without nodes (circuit-tracer's convention: with its pattern frozen it is linear, so
        its heads are edges): each node's rows `hs` (n_read, D) at the key positions, mixed by the frozen pattern
        through each head's value and output matrices, become that node's rows at the query positions; the block's
        constant (value and output biases) goes to the bias rows, and what the rows miss of the clean output (float64
        rounding) to the layer's error rows. Returns the block's writes as rows."""
        block, stack = sub.block, key[0]
        probs = self.rm.probs(block)[0]  # (H, Lq, Lk)
        H, Lq, Lk = probs.shape
        live = hs.ne(0).any(-1) | (read_rows.node < 0)  # rows not yet written hold zeros
        nodes, group = torch.unique(read_rows.node[live], return_inverse=True)
        values = hs[live] @ block.v_proj.weight.detach().T  # (n_live, H * Dh); the value bias is in the constant
        dense = torch.zeros(len(nodes), Lk, values.size(1), dtype=hs.dtype)
        dense.index_put_((group, read_rows.pos[live]), values, accumulate=True)
        mixed = torch.einsum("hqk,gkhe->gqhe", probs, dense.view(len(nodes), Lk, H, -1)).reshape(len(nodes), Lq, -1)
        at = torch.searchsorted(nodes, rows.node).clamp(max=len(nodes) - 1)
        hit = (nodes[at] == rows.node).nonzero()[:, 0]
        out[hit, 0] = mixed[at[hit], rows.pos[hit]] @ block.out_proj.weight.detach().T
        with self.rm.frozen(), self.m.capture([block.hook_result.name]) as seen:
            self._call(sub, torch.zeros(Lk, hs.size(1), dtype=hs.dtype), stack)
        bias = 0.0 if block.out_proj.bias is None else block.out_proj.bias.detach()
        out[rows.bias_rows, 0] += seen[block.hook_result.name][0][0].sum(0) + bias
        clean = self.x[block.hook_result.name].sum(0) + bias  # (Lq, D)
        recon = torch.zeros_like(clean).index_add_(0, rows.pos, out[:, 0])
        out[rows.layer_error_rows[key[1]], 0] += clean - recon
        return out

    def _feature_edges(self, key, sub: Sublayer, hs: torch.Tensor, rows: _Rows, read_rows, stream_in: torch.Tensor,
                       g: torch.Tensor, out: torch.Tensor, err_ids: torch.Tensor) -> torch.Tensor:
        """Edges into a dictionary's features at block `key` (an SAE on an attention block's output, a transcoder on
        an FFN) from the rows it reads, `hs` (n_read, D); the block's writes as rows: each feature's
        activation x its decoder row, the site's error (y - reconstruction), b_dec on the bias rows, a skip
        transcoder's linear term on every row it reads (a linear path, like the residual one)."""
        sf, nd = self.sites[key], self.ids["features"][key]
        q, f = nd["position"], nd["feature"]
        enc = sf.W_enc[:, f]  # (D, n_f): each feature's encoder column
        block = sub.block
        if sub.is_attention:  # pre_f = enc_f . (sum_h P[h, q, k] (x_k OV_h) + constants - b_dec) + b_enc
            probs = self.rm.probs(block)[0]  # (H, Lq, Lk)
            ov_enc = torch.einsum("hde,ej->hdj", block.ov().detach(), enc)  # (H, D, n_f): OV_h W_enc[:, f]
            # each feature's reading direction per key position, the heads mixed by the pattern: (Lk, D, n_f);
            # then one product per key position (the heads summed first: H times fewer products than per head)
            by_key = torch.einsum("hjk,hdj->kdj", probs[:, q], ov_enc)
            weights = torch.zeros(len(f), len(read_rows.pos), dtype=hs.dtype)
            for k in read_rows.pos.unique().tolist():
                at = (read_rows.pos == k).nonzero()[:, 0]
                weights[:, at] = (hs[at] @ by_key[k]).T
            with self.rm.frozen(), self.m.capture([block.hook_result.name]) as seen:
                self._call(sub, torch.zeros_like(stream_in), key[0])
                self._call(sub, stream_in, key[0])
            bias = 0.0 if block.out_proj.bias is None else block.out_proj.bias.detach()
            const_out = seen[block.hook_result.name][0][0].sum(0) + bias  # (Lq, D): the block on a zero input
            recon = seen[block.hook_result.name][1][0].sum(0) + bias  # on the input the rows rebuild
            clean = self.x[block.hook_out.name]
            const = ((const_out[q] - sf.b_dec) * enc.T).sum(-1) + sf.b_enc[f]
            err = ((clean[q] - recon[q]) * enc.T).sum(-1)
        else:  # a transcoder reads the FFN's input at its own position: pre_f = enc_f . x_q + b_enc
            weights = _same_position(hs, read_rows.pos, enc, q)
            const = sf.b_enc[f]
            err = ((self.x[sub.hook_block_in.name][q] - stream_in[q]) * enc.T).sum(-1)
        return self._feature_writes(sf, nd, g, weights, read_rows, const, err_ids[q], err, rows, hs, out)

    def _feature_writes(self, sf, nd, g: torch.Tensor, weights: torch.Tensor, read_rows, const: torch.Tensor,
                        err_node: torch.Tensor, err: torch.Tensor, rows, hs: torch.Tensor | None,
                        out: torch.Tensor) -> torch.Tensor:
        """Fill feature nodes' edges (each feature's coefficient, its decoder row . the gradient at the site's
        output, times the part of its pre-activation that each row makes) and attributions; return the site's
        writes as rows."""
        A, fids, q, f, act = self.A, nd["ids"], nd["position"], nd["feature"], nd["activation"]
        coef = (sf.W_dec[f] * g[q]).sum(-1)  # (n_f,)
        if isinstance(weights, tuple):  # (feature index, row index, value) of the rows at each feature's position
            jj, nn, vv = weights
            real = read_rows.node[nn] >= 0
            A[fids[jj[real]], read_rows.node[nn[real]]] = coef[jj[real]] * vv[real]
            from_bias = torch.zeros(len(fids), dtype=vv.dtype).index_add_(0, jj[~real], vv[~real])
        else:  # (n_f, n_read) dense
            real = read_rows.node >= 0
            sources, by_node = _by_node(weights[:, real], read_rows.node[real])
            A[fids.reshape(-1, 1), sources.reshape(1, -1)] = coef[:, None] * by_node
            from_bias = weights[:, ~real].sum(1)
        A[fids, self.ids["bias"]] = coef * (from_bias + const)
        A[fids, err_node] += coef * err  # += : the layer's error node may also be a row it read
        self.attribution[fids] = coef * act
        if hs is not None and sf.W_skip is not None:  # the skip term: linear in what each row holds
            out[:, 0] += hs @ sf.W_skip.T
        out[rows.feature_rows[nd["key"]], 0] = act[:, None] * sf.W_dec[f]
        out[rows.error_rows[nd["key"]], 0] = sf.residual[0]
        out[rows.bias_rows, 0] += sf.b_dec
        return out

    def _memory_features(self, c: torch.Tensor, rows: _Rows, g: torch.Tensor) -> tuple[torch.Tensor, _MemoryRows]:
        """The memory dictionary's features read the encoder's rows (after its final norm) at their position; the
        memory cross-attention reads is then their writes, the site's errors and b_dec: the rows returned. The
        rounding between the rows and the clean memory goes to the last encoder layer's error nodes."""
        sf, nd = self.sites["memory"], self.ids["features"]["memory"]
        q, f = nd["position"], nd["feature"]
        enc = sf.W_enc[:, f]
        hs = c[:, 0]
        weights = _same_position(hs, rows.pos, enc, q)
        const = sf.b_enc[f] - (sf.b_dec[None] * enc.T).sum(-1)
        stream = torch.zeros(self.length["enc"], hs.size(1), dtype=hs.dtype).index_add_(0, rows.pos, hs)
        err = ((self.x[sf.hook_in][q] - stream[q]) * enc.T).sum(-1)
        last = len(self.m.stream("enc").layers) - 1
        err_node = (torch.tensor([self.ids["error"]["enc", last, int(p)] for p in q.tolist()], dtype=torch.long)
                    if last >= 0 else torch.full_like(q, self.ids["bias"]))
        mem = _MemoryRows(nd, self.length["enc"])
        out = torch.zeros(mem.n, 1, hs.size(1), dtype=hs.dtype)
        self._feature_writes(sf, nd, g, weights, rows, const, err_node, err, mem, None, out)
        self.step()
        return out, mem

    def _call(self, sub: Sublayer, inp: torch.Tensor, stack: str) -> None:
        """Run an attention block of the frozen model on one input (L, D) (cross-attention: the memory)."""
        with torch.no_grad():
            if sub.name == "cross_attn":
                q_in = torch.zeros(1, self.length["dec"], inp.size(1), dtype=inp.dtype)  # frozen pattern: unread
                sub.block(q_in, memory=inp[None])
            else:
                sub.block(inp[None], causal=stack == "dec" and sub.name == "self_attn")

    def nodes(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The node list (embeddings, bias, errors, blocks' nodes, logit: the order every graph keeps) and where
        each kind's nodes sit in it."""
        nodes: list[dict[str, Any]] = []

        def add(**n) -> int:
            nodes.append(n)
            return len(nodes) - 1

        def tok(stack, q):
            names = self.names[stack]
            return names[q] if names is not None and q < len(names) else None

        ids: dict[str, Any] = {"embed": {}, "error": {}, "blocks": {}}
        for stack, side in (("enc", "src"), ("dec", "tgt")):
            ids["embed"][stack] = [add(kind="embed", stack=stack, layer=None, head=None, block=None, position=q,
                                       token=tok(stack, q), label=f"{side} {q}" + (f" {tok(stack, q)}" if tok(
                                           stack, q) is not None else "")) for q in range(self.length[stack])]
        ids["bias"] = add(kind="bias", stack=None, layer=None, head=None, block=None, position=None, token=None,
                          label="bias")
        for stack in ("enc", "dec"):
            for i in range(len(self.m.stream(stack).layers)):
                for q in range(self.length[stack]):
                    ids["error"][stack, i, q] = add(kind="error", stack=stack, layer=i, head=None, block=None,
                                                    position=q, token=tok(stack, q), label=f"error {stack}.{i} @{q}")
        ids["features"] = {}
        for stack in ("enc", "dec"):
            for key, sub in self.blocks[stack]:
                _, i, b = key
                L = self.length[stack]
                if key in self.sites:
                    ids["features"][key] = self._site_nodes(key, self.sites[key], stack, i, b, add, tok)
                elif key in self.passthrough:
                    continue  # no nodes: its heads are edges (`pass_through`)
                elif b == "ffn":
                    ids["blocks"][key] = torch.tensor([add(kind="ffn", stack=stack, layer=i, head=None, block="ffn",
                                                           position=q, token=tok(stack, q),
                                                           label=f"{path_of(sub.block)} @{q}") for q in range(L)])
                else:
                    short = {"self_attn": f"{stack}_self", "cross_attn": "cross"}[b]
                    ids["blocks"][key] = torch.tensor([[add(kind="head", stack=stack, layer=i, head=h, block=b,
                                                            position=q, token=tok(stack, q),
                                                            label=f"{short}:{i}:{h} @{q}") for q in range(L)]
                                                       for h in range(sub.block.n_heads)])  # (H, L)
            if stack == "enc" and "memory" in self.sites:
                ids["features"]["memory"] = self._site_nodes("memory", self.sites["memory"], "enc", None, None, add,
                                                             tok)
        ids["logit"] = add(kind="logit", stack="dec", layer=None, head=None, block=None, position=self.position,
                           token=None, label=f"logit @{self.position}")
        self.nodes_list = nodes
        return nodes, ids


    def _site_nodes(self, key, sf, stack: str, layer: int | None, block: str | None, add, tok) -> dict[str, Any]:
        """Nodes of a dictionary's site: its active features at each position (position-major, features in id
        order), then one error node per position."""
        active = sf.active[0].nonzero()  # (n_f, 2): position, feature
        q, f = active[:, 0], active[:, 1]
        act = sf.pre[0][q, f]  # on the active set the activation is the pre-activation (in the graph's dtype)
        link = feature_link(sf.site, 0)[: -1]  # the site's query up to the feature id (urlencode per node: 0.3 s)
        fids = [add(kind="feature", stack=stack, layer=layer, head=None, block=block, position=p, token=tok(stack, p),
                    label=f"{sf.site}#{j} @{p}", site=sf.site, feature=j, activation=a, link=f"{link}{j}")
                for p, j, a in zip(q.tolist(), f.tolist(), act.tolist())]
        eids = [add(kind="error", stack=stack, layer=layer, head=None, block=block, position=p, token=tok(stack, p),
                    label=f"error {sf.site} @{p}", site=sf.site) for p in range(self.length[stack])]
        return {"key": key, "ids": torch.tensor(fids, dtype=torch.long), "position": q, "feature": f,
                "activation": act, "errors": torch.tensor(eids, dtype=torch.long)}


def _by_node(weights: torch.Tensor, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the distinct nodes, weights (T, n) summed over the rows of each node): the edges from rows that a node holds
    at several positions (past a pass-through attention block) to each of T readers."""
    distinct, inverse = torch.unique(nodes, return_inverse=True)
    summed = torch.zeros(weights.size(0), len(distinct), dtype=weights.dtype).index_add_(1, inverse, weights)
    return distinct, summed


def _same_position(hs: torch.Tensor, pos: torch.Tensor, enc: torch.Tensor, q: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(feature index j, row index n, enc[:, j] . hs[n]) for every row n at feature j's position `q[j]`: what a
    dictionary reading its own position (a transcoder, the memory SAE) takes from each row."""
    js, ns, vs = [], [], []
    for p in q.unique().tolist():
        jp, np_ = (q == p).nonzero()[:, 0], (pos == p).nonzero()[:, 0]
        js.append(jp.repeat(len(np_)))
        ns.append(np_.repeat_interleave(len(jp)))
        vs.append((hs[np_] @ enc[:, jp]).reshape(-1))  # row-major: n outer, j inner
    if not js:
        empty = torch.zeros(0, dtype=torch.long)
        return empty, empty, torch.zeros(0, dtype=hs.dtype)
    return torch.cat(js), torch.cat(ns), torch.cat(vs)


def feature_link(site: str, feature: int) -> str:
    """The app's link to a feature's dashboard (the Features tab at that site and feature), as a URL query (the
    spelling of `ui.link`, which the analysis layer cannot import: `urlencode` of tab, site, feature)."""
    return "?" + urlencode({"tab": "features", "site": site, "feature": int(feature)})


def _feature_sites(rm: ReplacementModel, blocks: dict[str, list]) -> dict[Any, Any]:
    """{block key or "memory": SiteFeatures} for the dictionaries the replacement model carries. A feature graph
    takes SAEs on attention blocks' outputs and on the memory, and transcoders on FFNs."""
    out: dict[Any, Any] = {}
    memory = rm.model.stream("enc").hook_out.name
    for sf in rm.features.values():
        if sf.hook_in == memory:
            out["memory"] = sf
            continue
        found = [key for s in ("enc", "dec") for key, sub in blocks[s]
                 if (sf.transcoder and not sub.is_attention and sf.hook_out == sub.block.hook_out.name)
                 or (not sf.transcoder and sub.is_attention and sf.hook_in == sub.block.hook_out.name)]
        if not found:
            raise ValueError(f"a feature graph takes SAEs on attention blocks' outputs (…attn.hook_out) and on "
                             f"hook_memory, and transcoders on FFNs; {sf.site} is neither")
        out[found[0]] = sf
    return out


class _MemoryRows:
    """The memory's rows when a dictionary sits on it: its features, its error per position, a bias row per
    position (what cross-attention reads, as `_Rows` for a stack)."""

    stack = "enc"

    def __init__(self, nd: dict[str, Any], length: int) -> None:
        n_f = len(nd["ids"])
        self.node = torch.cat([nd["ids"], nd["errors"], torch.full((length,), -1, dtype=torch.long)])
        self.pos = torch.cat([nd["position"], torch.arange(length), torch.arange(length)])
        self.n = len(self.node)
        self.feature_rows = {nd["key"]: torch.arange(n_f)}
        self.error_rows = {nd["key"]: torch.arange(n_f, n_f + length)}
        self.bias_rows = torch.arange(n_f + length, self.n)


class _Rows:
    """The rows of one stack's contribution walk: one per source node and position it has reached (its embedding at
    its position, each head's, FFN's or feature's write at its query position, and, past a pass-through attention
    block, the same node at the other positions that block mixes it into) and one bias row per position; `node` is
    each row's node id (-1: bias), `pos` its position. Through a norm, a row is mapped by the norm's frozen linear
    part at its position's scale; the bias rows also get the norm's bias."""

    def __init__(self, builder: _Builder, stack: str, ids: dict[str, Any], memory=None) -> None:
        self.b, self.stack = builder, stack
        L = builder.length[stack]
        self.node_list: list[int] = [*ids["embed"][stack], *[-1] * L]
        self.pos_list: list[int] = [*range(L), *range(L)]
        self.first_block = [-1] * (2 * L)  # the index of the block that writes each row (-1: before every block)
        self.block_rows: dict[tuple, torch.Tensor] = {}
        self.feature_rows: dict[tuple, torch.Tensor] = {}
        self.error_rows: dict[tuple, torch.Tensor] = {}
        self.layer_error_rows: dict[int, torch.Tensor] = {}  # a pass-through block's rounding, per layer
        for index, (key, _) in enumerate(builder.blocks[stack]):
            self._add_block(index, key, ids, L)
        self._spread(memory, L)
        self.node, self.pos = torch.tensor(self.node_list), torch.tensor(self.pos_list)
        self.n = len(self.node_list)
        self.bias_rows = torch.arange(L, 2 * L)
        self.is_bias = (self.node < 0).to(torch.float64)[:, None, None]

    def _append(self, nodes: list[int], positions: list[int], index: int) -> torch.Tensor:
        first = len(self.node_list)
        self.node_list += nodes
        self.pos_list += positions
        self.first_block += [index] * len(nodes)
        return torch.arange(first, len(self.node_list))

    def _add_block(self, index: int, key: tuple, ids: dict[str, Any], L: int) -> None:
        """The rows block `key` writes at its own positions: its features then its errors, its head or FFN nodes,
        or (a pass-through block) its layer's error rows, shared by the layer's pass-through blocks."""
        if key in ids["features"]:
            nd = ids["features"][key]
            self.feature_rows[key] = self._append(nd["ids"].tolist(), nd["position"].tolist(), index)
            self.error_rows[key] = self._append(nd["errors"].tolist(), list(range(L)), index)
        elif key in self.b.passthrough:
            if key[1] not in self.layer_error_rows:
                errors = [int(ids["error"][self.stack, key[1], q]) for q in range(L)]
                self.layer_error_rows[key[1]] = self._append(errors, list(range(L)), index)
        else:
            tids = ids["blocks"][key]
            positions = (list(range(L)) * tids.size(0)) if tids.dim() == 2 else list(range(L))
            self.block_rows[key] = self._append(tids.reshape(-1).tolist(), positions, index).view(tids.shape)

    def _spread(self, memory, L: int) -> None:
        """The rows a pass-through block mixes into: each node written before the stack's last pass-through block at
        every other position it can reach (the encoder's every position, the decoder's later ones: causal), and the
        memory's nodes at every decoder position when a cross-attention block passes them through."""
        keys = [key for key, _ in self.b.blocks[self.stack]]
        last = max((i for i, key in enumerate(keys) if key in self.b.passthrough), default=-1)
        nodes_pos = []
        for n, p, first in zip(self.node_list, self.pos_list, self.first_block):
            if n >= 0 and first < last:
                nodes_pos += [(n, q) for q in (range(L) if self.stack == "enc" else range(p + 1, L)) if q != p]
        if memory is not None and any(key[2] == "cross_attn" for key in self.b.passthrough if key[0] == "dec"):
            nodes_pos += [(int(m), q) for m in memory.node.unique().tolist() if m >= 0 for q in range(L)]
        if nodes_pos:
            self._append([n for n, _ in nodes_pos], [q for _, q in nodes_pos], len(keys))

    def start(self, embed: torch.Tensor) -> torch.Tensor:
        c = torch.zeros(self.n, 1, embed.size(-1), dtype=embed.dtype)
        c[: embed.size(0), 0] = embed
        return c

    def norm(self, norm, c: torch.Tensor) -> torch.Tensor:
        """A norm outside a layer (the stack's final norm): its frozen linear part, its bias on the bias rows."""
        scale = self.b.rm.scale(norm)[0][self.pos][:, None]  # (rows, 1, 1)
        return norm.linear(c, scale) + self.is_bias * norm.bias.detach()

    def norm_hooks(self) -> list[tuple[str, Any]]:
        """Hooks that make each layer norm act on rows: its scale per row's position, its bias on bias rows only."""
        spec: list[tuple[str, Any]] = []
        for _, sub in self.b.blocks[self.stack]:
            scale = self.b.rm.scale(sub.norm)[0][self.pos][:, None]  # (rows, 1, 1)
            spec.append((sub.norm.hook_scale.name, lambda x, hook, scale=scale: scale))
            bias = sub.norm.bias.detach()
            spec.append((sub.hook_norm.name, lambda x, hook, bias=bias: x - (1 - self.is_bias) * bias))
        return spec


# ---------------------------------------------------------------------------------------- interventions


def node_write(model, node: dict[str, Any]) -> tuple[str, tuple]:
    """The hook point and (after the batch axis) index of a node's write: an embedding's position, a head's
    output at its position, an FFN's output there. Bias and error nodes have no write of their own."""
    if node["kind"] not in ("embed", "head", "ffn"):
        raise ValueError(f"node {node['label']} is a {node['kind']} node: only embed, head and ffn nodes "
                         "can be removed")
    stream = model.stream(node["stack"])
    if node["kind"] == "embed":
        return stream.hook_embed.name, (node["position"],)
    if node["kind"] == "head":
        block = stream.layers[node["layer"]].sublayer(node["block"]).block
        return block.hook_result.name, (node["head"], node["position"])
    return stream.layers[node["layer"]].ffn.hook_out.name, (node["position"],)


def zero_writes(assign: list[tuple[int, tuple]]):
    """A hook zeroing, per (batch row, index after the batch axis), one node's write: what removing nodes does."""
    def hook(x, point):
        x = x.clone()
        for row, idx in assign:
            x[row][idx] = 0
        return x
    return hook


def remove_nodes(model, src, tgt, graph: AttributionGraph, node_sets: list[list[int]]) -> torch.Tensor:
    """The real model's logit (difference) with each set of nodes' writes zeroed, one set per row of one batch
    (embeddings: that position's embedding; heads: that head's output at that position; FFNs: the FFN's output
    there). Bias and error nodes cannot be removed this way."""
    src, tgt = _tokens(src, "src").to(model.device), _tokens(tgt, "tgt").to(model.device)
    tgt = tgt[:, : graph.position + 1]
    edits: dict[str, list[tuple[int, tuple]]] = {}
    for row, nodes in enumerate(node_sets):
        for j in nodes:
            name, idx = node_write(model, graph.nodes[j])
            edits.setdefault(name, []).append((row, idx))

    n = len(node_sets)
    with evaluating(model), torch.no_grad(), model.hooks({k: zero_writes(v) for k, v in edits.items()}):
        logits = model(src.expand(n, -1), tgt.expand(n, -1))[:, graph.position].double()
    return target_of(logits, graph).cpu()


def removable(graph: AttributionGraph) -> list[int]:
    """Nodes `remove_nodes` can zero: embeddings, heads and FFNs."""
    return [i for i, n in enumerate(graph.nodes) if n["kind"] in ("embed", "head", "ffn")]


def faithfulness_check(model, src, tgt, graph: AttributionGraph, k: int = 5, *, random_sets: int = 10,
                       seed: int = 0) -> dict[str, float]:
    """Logit drop when the top-k nodes by attribution are removed together, next to k random removable nodes
    (mean over `random_sets` draws); both in the real model."""
    cand = removable(graph)
    att = graph.attribution[cand]
    top = [cand[j] for j in att.argsort(descending=True)[:k].tolist()]
    g = torch.Generator().manual_seed(seed)
    rand = [[cand[j] for j in torch.randperm(len(cand), generator=g)[:k].tolist()] for _ in range(random_sets)]
    vals = remove_nodes(model, src, tgt, graph, [top, *rand])
    return {"logit": graph.logit, "top_drop": graph.logit - float(vals[0]),
            "random_drop": graph.logit - float(vals[1:].mean()), "top_predicted": float(att.sort(descending=True)
                                                                                          .values[:k].sum())}


# ------------------------------------------------------------------------------------------- corpus contexts


def component_contexts(tm, sources: list[str], targets: list[str], *, top: int = 5, window: int = 4,
                       check: Callable[[], None] | None = None) -> dict[tuple, list[dict[str, Any]]]:
    """Where in a corpus each graph component writes most: for every head, key (stack, layer, block, head), and
    every FFN, key (stack, layer, "ffn", None), the `top` sentences in which the norm of its write (`hook_result`
    of that head, `ffn.hook_out`) at one position is largest, one position per sentence. Each context: `sentence`
    (index), `position`, `score` (the norm), `text` (the pieces around the position, `window` each side, the
    position in brackets) and for a head `key` / `weight` (the key it attends most there). Teacher-forced on
    (`sources`, `targets`) with `tm` (a TranslationModel); `check()` runs between sentences (a request path's
    cancellation)."""
    model, cfg = tm.model, tm.model.cfg
    subs = [(key, sub) for stack in ("enc", "dec") for key, sub in _blocks(model, stack)]
    names = []
    for _, sub in subs:
        names += [sub.block.hook_result.name, sub.block.hook_probs.name] if sub.is_attention else \
            [sub.block.hook_out.name]
    found: dict[tuple, list[dict[str, Any]]] = {}

    def text(pieces: list[str], q: int) -> str:
        left = pieces[max(0, q - window): q]
        right = pieces[q + 1: q + 1 + window]
        return " ".join([*(["…"] if q > window else []), *left, f"[{pieces[q]}]", *right,
                         *(["…"] if q + 1 + window < len(pieces) else [])])

    for k, (source, target) in enumerate(zip(sources, targets)):
        if check is not None:
            check()
        src_ids, _ = tm.encode_source(source)
        out_ids = tm.tgt_tokenizer.encode(target)[: cfg.max_positions - 1]
        if not src_ids or not out_ids:
            continue
        src = torch.tensor([src_ids], device=tm.device)
        tgt_ids = decoder_input(out_ids, cfg.start_id, prefix=True)  # the reference read whole (no EOS to drop)
        tgt = torch.tensor([tgt_ids], device=tm.device)
        pieces = {"enc": tm.src_tokenizer.pieces(src_ids), "dec": ["<s>", *tm.tgt_tokenizer.pieces(out_ids)]}
        with evaluating(model), torch.no_grad():
            _, cache = model.run_with_cache(src, tgt, names=names)
        for (stack, i, b), sub in subs:
            if sub.is_attention:
                norms = cache[sub.block.hook_result.name][0].float().norm(dim=-1)  # (H, L)
                heads = list(range(norms.size(0)))
                probs = cache[sub.block.hook_probs.name][0].float()  # (H, Lq, Lk)
            else:
                norms = cache[sub.block.hook_out.name][0].float().norm(dim=-1)[None]  # (1, L)
                heads = [None]
            keys = pieces["enc"] if b == "cross_attn" or stack == "enc" else pieces["dec"]
            for h, row in zip(heads, norms):
                q = int(row.argmax())
                entry = {"sentence": k, "position": q, "score": float(row[q]), "text": text(pieces[stack], q)}
                if h is not None:
                    j = int(probs[h, q].argmax())
                    entry.update(key=keys[j], weight=float(probs[h, q, j]))
                best = found.setdefault((stack, i, b, h), [])
                best.append(entry)
                best.sort(key=lambda e: -e["score"])
                del best[top:]
    return found

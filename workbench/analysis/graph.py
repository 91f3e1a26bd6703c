"""Attribution graphs for one output token, through the encoder, cross-attention and the decoder.

    g = attribution_graph(model, src, tgt, position=4)          # the token the model predicts after tgt[4]
    g.logit == g.adjacency[-1].sum()                             # completeness: exact to fp64 (tested)
    keep = g.prune(0.8)                                          # nodes holding 80 % of the influence on the logit
    g.frame()                                                    # node, kind, stack, layer, head, position, ...

The local replacement model (circuit-tracer's, Ameisen et al. 2025) for an encoder-decoder: attention patterns,
layer-norm scales and the FFN gates (activation(pre) / pre, the ReLU mask for ReLU models) are frozen at the clean
run's values. What is left is linear in the residual streams, so every node's write decomposes exactly into the
writes of the nodes upstream of it. Nodes:

    embed   source and target embeddings, one per position (token + position, as `hook_{src,tgt}_embed`)
    head    each head x query position of encoder self-, decoder self- and cross-attention (`hook_result`);
            its node carries its attention row (`attention`: one weight per key position)
    ffn     each FFN x position (`ffn.hook_out`)
    bias    every constant (norm biases, attention and FFN biases) in one node
    error   per (stack, layer, position): what the frozen model fails to reconstruct of that layer's node writes
            (float rounding here: the freezing is exact at the clean point; transcoder features would put their
            reconstruction error here)
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

import torch

from ..core.batching import decoder_input
from ..core.hooks import path_of
from ..core.layers import Sublayer
from ..core.model import evaluating

NODE_KINDS = ("embed", "bias", "error", "head", "ffn", "logit")


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
        with `max_nodes`, at most that many nodes besides the logit (the most influential ones)."""
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


# ---------------------------------------------------------------------------------------------- linear algebra


def _fn(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Frozen norm's linear part: (x - mean) / s * w; s broadcast per row."""
    return (x - x.mean(-1, keepdim=True)) / s * w


def _fnT(g: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Its transpose applied to a gradient: centre(g * w / s)."""
    y = g * w / s
    return y - y.mean(-1, keepdim=True)


def _blocks(model, stack: str) -> list[tuple[tuple[str, int, str], Sublayer]]:
    """((stack, layer, block name), sub-layer) of a stack in the order they write."""
    return [((stack, i, sub.name), sub) for i, sub in model.stream(stack).sublayers()]


def _capture_names(model) -> list[str]:
    names = [model.stream("enc").hook_embed.name, model.stream("dec").hook_embed.name]
    for stack in ("enc", "dec"):
        for _, sub in _blocks(model, stack):
            names.append(sub.norm.hook_scale.name)
            if sub.is_attention:
                names += [sub.block.hook_result.name, sub.block.hook_probs.name]
            else:  # the FFN's gates need what it reads
                names += [sub.block.hook_out.name, sub.block.hook_hidden.name, sub.hook_block_in.name]
    for stack in ("enc", "dec"):
        final = model.stream(stack).final_norm
        if final is not None:
            names.append(final.hook_scale.name)
    return names


class _Params:
    """fp64 copies of the weights one block needs."""

    def __init__(self, module, kind: str):
        d = lambda t: None if t is None else t.detach().double()  # noqa: E731
        if kind == "ffn":
            self.w_up, self.b_up = d(module.up_proj.weight), d(module.up_proj.bias)
            self.w_down, self.b_down = d(module.down_proj.weight), d(module.down_proj.bias)
        else:
            h, dh = module.n_heads, module.d_head
            self.wv = d(module.v_proj.weight).view(h, dh, -1)  # (H, Dh, D): v_h = x @ wv[h].T
            self.bv = None if module.v_proj.bias is None else d(module.v_proj.bias).view(h, dh)
            self.wo = d(module.head_weights())  # (H, Dh, D): result_h = context_h @ wo[h]
            self.bo = d(module.out_proj.bias)
            self.ov = torch.einsum("hed,hef->hdf", self.wv, self.wo)  # (H, D, D): x -> result, per head


def _tokens(ids, name: str) -> torch.Tensor:
    t = torch.as_tensor(ids, dtype=torch.long)
    t = t.view(1, -1) if t.dim() == 1 else t
    if t.dim() != 2 or t.size(0) != 1 or t.size(1) == 0:
        raise ValueError(f"{name} must be one non-empty sentence, (L,) or (1, L); got shape {tuple(t.shape)}")
    return t


# ---------------------------------------------------------------------------------------------------- the graph


def graph_size(model, src_len: int, position: int) -> int:
    """How many nodes `attribution_graph` builds for a source of `src_len` tokens and decoder `position` (before
    building it: the adjacency is nodes² float64, 8 bytes each)."""
    t = position + 1
    n = src_len + t + 2  # embeddings, bias, logit
    for stack, length in (("enc", src_len), ("dec", t)):
        stream = model.stream(stack)
        n += len(stream.layers) * length  # error nodes: one per layer and position
        for _, sub in stream.sublayers():  # a head x position or an FFN x position
            n += (sub.block.n_heads if sub.is_attention else 1) * length
    return n



TARGETS = ("logit", "runner-up", "demeaned")


def attribution_graph(model, src, tgt, position: int = -1, token: int | None = None, *,
                      baseline_token: int | None = None, target: str = "logit",
                      src_tokens: list[str] | None = None, tgt_tokens: list[str] | None = None,
                      progress: Callable[[int, int], None] | None = None) -> AttributionGraph:
    """The attribution graph of the logit of `token` (default: the model's top token) at decoder position
    `position` (the token predicted after reading tgt[position]); with `baseline_token`, of the logit difference.
    `target`: "logit" (that logit, or the difference to `baseline_token`), "runner-up" (the difference to the
    best other token: what decides the choice) or "demeaned" (the logit minus the mean logit over the vocabulary:
    free of what raises every logit alike). A raw logit is dominated by what every token shares, which the
    embeddings carry; the two others measure the choice itself (issue 38 point 4).
    `src`, `tgt`: one sentence of ids. `src_tokens` / `tgt_tokens` (optional) label the nodes. `progress(done,
    total)` is called after each sub-layer of the backward and the forward pass (an exception it raises, such as
    a request path's cancellation, ends the construction there)."""
    src, tgt = _tokens(src, "src").to(model.device), _tokens(tgt, "tgt").to(model.device)
    if not -tgt.size(1) <= position < tgt.size(1):
        raise ValueError(f"position {position} out of range for a target prefix of {tgt.size(1)} tokens")
    if bool((src == model.cfg.pad_id).any()) or bool((tgt == model.cfg.pad_id).any()):
        raise ValueError("attribution_graph takes one unpadded sentence: its ids contain the padding id")
    position %= tgt.size(1)
    tgt = tgt[:, : position + 1]  # later decoder positions cannot reach this logit (causal)
    cfg = model.cfg
    with evaluating(model), torch.no_grad():
        logits, tr = model.run_with_cache(src, tgt, names=_capture_names(model))
    row = logits[0, position].double()
    if token is None:
        token = int(row.argmax())
    vocab = model.output_proj.weight.size(0)
    for t in (token, baseline_token):
        if t is not None and not 0 <= int(t) < vocab:
            raise ValueError(f"token {t} out of range: the target vocabulary has {vocab} entries")
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}; got {target!r}")
    if target != "logit" and baseline_token is not None:
        raise ValueError(f"target {target!r} chooses its own baseline: leave baseline_token out")
    if target == "runner-up":
        baseline_token = int(row.clone().index_fill_(0, torch.tensor([token]), float("-inf")).argmax())
    weight = model.output_proj.weight.detach().double()
    bias = None if model.output_proj.bias is None else model.output_proj.bias.detach().double()
    logit = float(row[token] - (0 if baseline_token is None else row[baseline_token]))
    u = weight[token].clone()
    out_bias = 0.0 if bias is None else float(bias[token])
    if baseline_token is not None:
        u -= weight[baseline_token]
        out_bias -= 0.0 if bias is None else float(bias[baseline_token])
    if target == "demeaned":
        logit = float(row[token] - row.mean())
        u -= weight.mean(0)
        out_bias -= 0.0 if bias is None else float(bias.mean())

    x = {k: v[0].double() for k, v in tr.items()}  # drop the batch axis, fp64
    S, T = src.size(1), tgt.size(1)
    length = {"enc": S, "dec": T}
    pre = cfg.norm_first
    blocks = {s: _blocks(model, s) for s in ("enc", "dec")}
    params = {key: _Params(sub.block, "attn" if sub.is_attention else "ffn")
              for s in ("enc", "dec") for key, sub in blocks[s]}

    def norm_of(sub: Sublayer):
        n = sub.norm
        return n.weight.detach().double(), n.bias.detach().double(), x[n.hook_scale.name]

    finals = {}
    for stack in ("enc", "dec"):
        mod = model.stream(stack).final_norm
        if mod is not None:
            finals[stack] = (mod.weight.detach().double(), mod.bias.detach().double(), x[mod.hook_scale.name])

    # gates of each FFN: activation(pre) / pre, pre recomputed in fp64 from the captured input
    gates, ffn_in = {}, {}
    for stack in ("enc", "dec"):
        for key, sub in blocks[stack]:
            if sub.is_attention:
                continue
            i = key[1]
            p = params[key]
            xin = x[sub.hook_block_in.name]
            pa = xin @ p.w_up.t() + (0 if p.b_up is None else p.b_up)
            hid = x[sub.block.hook_hidden.name]
            gates[stack, i] = torch.where(pa.abs() > 1e-30, hid / torch.where(pa.abs() > 1e-30, pa, 1.0), 0.0)
            ffn_in[stack, i] = xin

    # ---------------------------------------------------------------------------------- backward: g per block
    # g_node[block]: (L, D) gradient of the logit w.r.t. any write of that block at each position (all heads
    # of one block at one position write to the same point); r[block]: each node's reading direction.
    g_node: dict[tuple, torch.Tensor] = {}
    r_dir: dict[tuple, torch.Tensor] = {}
    D = cfg.d_model
    G = torch.zeros(T, D, dtype=torch.float64)
    G[position] = u
    if "dec" in finals:
        G = _fnT(G, finals["dec"][0], finals["dec"][2])
    G_mem = torch.zeros(S, D, dtype=torch.float64)
    g_emb = {}
    total_steps = 2 * (len(blocks["enc"]) + len(blocks["dec"]))
    steps = [0]

    def step() -> None:
        steps[0] += 1
        if progress is not None:
            progress(steps[0], total_steps)

    for stack in ("dec", "enc"):
        if stack == "enc":
            G = G_mem
            if "enc" in finals:
                G = _fnT(G, finals["enc"][0], finals["enc"][2])
        for key, sub in reversed(blocks[stack]):
            _, i, b = key
            w, _, s = norm_of(sub)
            p = params[key]
            g = G if pre else _fnT(G, w, s)
            g_node[key] = g
            if b == "ffn":
                r = ((g @ p.w_down) * gates[stack, i]) @ p.w_up  # (L, D)
                back = r
            else:
                probs = x[sub.block.hook_probs.name]  # (H, Lq, Lk)
                r = torch.einsum("hdf,qf->hqd", p.ov, g)  # (H, Lq, D)
                back = torch.einsum("hqk,hqd->kd", probs, r)  # (Lk, D)
            r_dir[key] = r
            step()
            if b == "cross_attn":
                G_mem = G_mem + back
                G = G if pre else g  # the decoder stream gets nothing back: queries are frozen
                continue
            if pre:
                G = G + _fnT(back, w, s)
            else:
                G = g + back
        g_emb[stack] = G

    # ----------------------------------------------------------------------------------- node list
    nodes: list[dict[str, Any]] = []

    def add(**n) -> int:
        nodes.append(n)
        return len(nodes) - 1

    def tok(stack, q):
        names = src_tokens if stack == "enc" else tgt_tokens
        return names[q] if names is not None and q < len(names) else None

    emb_ids = {}
    for stack, side in (("enc", "src"), ("dec", "tgt")):
        emb_ids[stack] = [add(kind="embed", stack=stack, layer=None, head=None, block=None, position=q,
                              token=tok(stack, q), label=f"{side} {q}" + (f" {tok(stack, q)}" if tok(stack, q)
                                                                          is not None else ""))
                          for q in range(length[stack])]
    bias_id = add(kind="bias", stack=None, layer=None, head=None, block=None, position=None, token=None, label="bias")
    err_ids = {}
    for stack in ("enc", "dec"):
        for i in range(len(getattr(model, stack))):
            for q in range(length[stack]):
                err_ids[stack, i, q] = add(kind="error", stack=stack, layer=i, head=None, block=None, position=q,
                                           token=tok(stack, q), label=f"error {stack}.{i} @{q}")
    block_ids = {}
    for stack in ("enc", "dec"):
        for key, sub in blocks[stack]:
            _, i, b = key
            L = length[stack]
            if b == "ffn":
                block_ids[key] = torch.tensor([add(kind="ffn", stack=stack, layer=i, head=None, block="ffn",
                                                   position=q, token=tok("dec" if stack == "dec" else "enc", q),
                                                   label=f"{path_of(sub.block)} @{q}") for q in range(L)])
            else:
                H = sub.block.n_heads
                short = {"self_attn": f"{stack}_self", "cross_attn": "cross"}[b]
                block_ids[key] = torch.tensor([[add(kind="head", stack=stack, layer=i, head=h, block=b, position=q,
                                                    token=tok(stack, q), label=f"{short}:{i}:{h} @{q}")
                                                for q in range(L)] for h in range(H)])  # (H, L)
    logit_id = add(kind="logit", stack="dec", layer=None, head=None, block=None, position=position, token=token,
                   label=f"logit @{position}")
    N = len(nodes)
    A = torch.zeros(N, N, dtype=torch.float64)
    attribution = torch.zeros(N, dtype=torch.float64)

    # ---------------------------------------------------------------------------------- forward: edges
    memory = None
    for stack in ("enc", "dec"):
        L = length[stack]
        emb = x[model.stream(stack).hook_embed.name]  # (L, D)
        ids = torch.tensor(emb_ids[stack])
        R = emb.clone()  # (n, D): each source node's contribution to the stream at its own position
        pos = torch.arange(L)
        Rb = torch.zeros(L, D, dtype=torch.float64)  # the bias node's contribution per position
        attribution[ids] = (g_emb[stack] * emb).sum(-1)
        for key, sub in blocks[stack]:
            _, i, b = key
            w, nb, s = norm_of(sub)
            p = params[key]
            g = g_node[key]
            r = r_dir[key]
            if b == "cross_attn":
                rids, Rr, rpos, Rbr = memory
            else:
                rids, rpos = ids, pos
                Rr, Rbr = (_fn(R, w, s[pos]), _fn(Rb, w, s) + nb) if pre else (R, Rb)
            stream_r = torch.zeros(length["enc" if b == "cross_attn" else stack], D, dtype=torch.float64)
            stream_r.index_add_(0, rpos, Rr)
            stream_r += Rbr  # the reconstructed input the block reads
            if b == "ffn":
                tids = block_ids[key]  # (L,)
                write = x[sub.block.hook_out.name]  # (L, D)
                A[tids[rpos], rids] = (Rr * r[rpos]).sum(-1)
                const = (gates[stack, i] * (0 if p.b_up is None else p.b_up)) @ p.w_down.t()
                const = const + (0 if p.b_down is None else p.b_down)
                A[tids, bias_id] = (Rbr * r).sum(-1) + (g * const).sum(-1)
                hid = gates[stack, i] * (stream_r @ p.w_up.t() + (0 if p.b_up is None else p.b_up))
                recon = hid @ p.w_down.t() + (0 if p.b_down is None else p.b_down)
                err = ((write - recon) * g).sum(-1)  # (L,)
                A[tids, torch.tensor([err_ids[stack, i, q] for q in range(L)])] = err
                attribution[tids] = (g * write).sum(-1)
                new_R, new_pos, new_ids = write, torch.arange(L), tids
            else:
                tids = block_ids[key]  # (H, Lq)
                H, Lq = tids.shape
                probs = x[sub.block.hook_probs.name]  # (H, Lq, Lk)
                write = x[sub.block.hook_result.name]  # (H, Lq, D)
                dots = torch.einsum("nd,hqd->hqn", Rr, r)  # (H, Lq, n)
                A[tids.reshape(-1, 1), rids.reshape(1, -1)] = (probs[:, :, rpos] * dots).reshape(H * Lq, -1)
                vb = 0.0 if p.bv is None else torch.einsum("he,hef->hf", p.bv, p.wo)[:, None]  # (H, 1, D)
                A[tids.reshape(-1), bias_id] = (torch.einsum("hqk,kd,hqd->hq", probs, Rbr, r)
                                                + (g[None] * vb).sum(-1)).reshape(-1)
                recon = torch.einsum("hqk,kd,hdf->hqf", probs, stream_r, p.ov) + vb
                err = ((write - recon) * g[None]).sum(-1)  # (H, Lq)
                eids = torch.tensor([err_ids[stack, i, q] for q in range(Lq)])
                A[tids.reshape(-1), eids.repeat(H)] = err.reshape(-1)
                attribution[tids.reshape(-1)] = (g[None] * write).sum(-1).reshape(-1)
                for h in range(H):
                    for q in range(Lq):
                        nodes[int(tids[h, q])]["attention"] = [round(float(v), 4) for v in probs[h, q]]
                new_R, new_pos, new_ids = write.reshape(H * Lq, D), torch.arange(Lq).repeat(H), tids.reshape(-1)
                if p.bo is not None:
                    Rb = Rb + p.bo
            step()
            R = torch.cat([R, new_R])
            pos = torch.cat([pos, new_pos])
            ids = torch.cat([ids, new_ids])
            if not pre:
                R = _fn(R, w, s[pos])
                Rb = _fn(Rb, w, s) + nb
        if stack in finals:
            w, nb, s = finals[stack]
            R = _fn(R, w, s[pos])
            Rb = _fn(Rb, w, s) + nb
        if stack == "enc":
            memory = (ids, R, pos, Rb)
    at = pos == position
    A[logit_id, ids[at]] = R[at] @ u
    A[logit_id, bias_id] = float(Rb[position] @ u) + out_bias
    # the sources' attributions are the sums of their out-edges (bias and errors have no write of their own)
    for j in [bias_id, *err_ids.values()]:
        attribution[j] = A[:, j].sum()
    attribution[logit_id] = A[logit_id].sum()
    meta = {"src_len": S, "tgt_len": T, "norm_first": pre, "target": target}
    return AttributionGraph(nodes, A, attribution, logit, position, token, baseline_token, meta)


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

    def zero(assign):
        def hook(x, point):
            x = x.clone()
            for row, idx in assign:
                x[row][idx] = 0
            return x
        return hook

    n = len(node_sets)
    with evaluating(model), torch.no_grad(), model.hooks({k: zero(v) for k, v in edits.items()}):
        logits = model(src.expand(n, -1), tgt.expand(n, -1))[:, graph.position].double()
    out = logits[:, graph.token]
    if graph.baseline_token is not None:
        out = out - logits[:, graph.baseline_token]
    if graph.meta.get("target") == "demeaned":
        out = out - logits.mean(-1)
    return out.cpu()


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

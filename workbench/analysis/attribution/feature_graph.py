"""Feature-level attribution graphs: the attribution graph of one output token with dictionary features as nodes.

    dicts = {site: SparseDictionary.load(d) for site, d in ...}    # or a list: each dictionary's site from its cfg
    g = feature_graph(model, dicts, src, tgt, position=4)           # an AttributionGraph, as attribution_graph's
    g.adjacency[-1].sum() == g.logit                                 # completeness (fp64, tested to 1e-10)
    keep = g.prune(0.8, max_nodes=100)
    remove_features(model, dicts, src, tgt, g, [[i, j]])             # the real spliced model, features clamped to 0
    pruned_check(model, dicts, src, tgt, g, keep[:-1])               # the pruned graph's features vs the rest, real
    graph_scores(g)                                                  # circuit-tracer's replacement / completeness

The local replacement model of circuit-tracer (Ameisen et al. 2025) for an encoder-decoder with per-layer
dictionaries: attention patterns, norm scales and FFN gates frozen at the clean run (`core.replacement`), and at each
dictionary's site the site's output replaced by its active features, linear in what the dictionary reads (the active
set held at the clean run's: a TopK, BatchTopK, JumpReLU or ReLU feature that fires has activation = pre-activation,
so an edge into a feature is a share of its pre-activation), plus the site's error (y - reconstruction) held
constant. Nodes:

    embed    source and target embeddings, per position
    feature  an active feature at a site and position: an SAE's on an attention block's output (`…attn.hook_out`;
             it replaces that block's head nodes), a transcoder's on an FFN (it replaces the FFN's nodes), an SAE's on
             `hook_memory` (between the encoder and every cross-attention). Fields: site, feature, position, stack,
             layer and block (None for hook_memory), activation, link (the app's Features tab on that feature)
    error    one per site and position (`site` set): y - reconstruction, a source; and, as in head graphs, one per
             (stack, layer, position) without a site, the float64 rounding of the walk (~1e-13)
    ffn      an FFN without a transcoder keeps one node per position (its whole write)
    bias     every constant (norm and block biases, b_enc, b_dec, the value and output biases of pass-through blocks)
    logit    last

An attention block without a dictionary has no nodes (circuit-tracer's convention): with its pattern frozen it is
linear, so its heads are edges. It passes each node's rows through (`graph._Builder.pass_through`): a node's write at
key position k reaches query position q as P[h, q, k] (x OV_h) summed over heads, and an edge s -> t then sums every
path from s to t through such blocks (tested: equal to the head-node graph's edges with its head nodes eliminated, on
one-dimensional heads where that elimination is exact). `head_nodes=True` keeps the older convention (one node per
head and position, as head graphs; with no dictionary, the head graph itself).

Edges and attributions keep `attribution_graph`'s meaning: a_t = g_t . w_t with g_t the target's gradient at t's
write in the replacement model (for a feature: its activation x (W_dec[f] . g at the site's output)); the edge
s -> feature f is (W_dec[f] . g) x (the part of f's pre-activation that s's write makes): through the frozen pattern
and the head's OV circuit for an attention SAE (OV_h W_enc[:, f], weighted by P[h, q, k]), at its own position for a
transcoder (through a pre-norm block's frozen norm) and for the memory SAE. The edges into a node sum to its
attribution, the edges into the logit to the target. A skip transcoder's linear term is a linear path like the
residual one: it rides on the rows of the nodes it reads, not a node.

Influence and pruning are circuit-tracer's (`graph.node_influence`, `AttributionGraph.prune`): |A| normalised per
row, a node's influence the sum over every path from the logit of the products of those weights, and the pruned graph
the fewest most influential nodes reaching a share of the total. Error nodes, embeddings and the one bias node are
ranked and counted like features. `paths_within` gives what a pruned graph holds by its own paths (a stricter share).

Each feature node's dashboard: `node["link"]` is the app's URL query; its top contexts and output effects are
`features.dashboard.FeatureData` lookups, made on demand by `feature_details` (a corpus pass per feature: lazy, not
at graph time).

Measured (scripts/feature_graph_report.py, shipped k-16 dictionaries, every position of test2016's first 5 sentences
and one drawn position of each of the next 30: 108 tokens; docs/evidence/feature_graph_heads_as_edges.json against
feature_graph_head_nodes.json, the same run with --head-nodes): completeness 1e-15 relative; the 80 %-influence graph
fits 100 nodes on 47 % of the tokens with heads as edges (45 % every position / 53 % sampled) against 52 % with head
nodes (54 % / 47 %): the goal (90 %) is missed either way, by ~40 points. Heads as edges help early positions (≤ 4:
91 % against 80 %) and cost later ones (≥ 10: 15 % against 33 %): the influence a head node gathered is spread over the
nodes upstream of it. What the 80 % sets hold then (mean of 110 nodes, every position): features 57, whole FFNs 26
(dec.0 8, the encoder's 15, dec.2/3 3), embeddings 20, site errors 6, bias 1; FFNs hold 23 % of the influence
(median). Feature rankings and attributions do not change (a feature's attribution is a_f (W_dec[f] . g) either
way), so the top-5 interventions are the same; the pruned graph's features clamped together cost 5.1 nats (median 5.0)
on the sampled tokens against 0.8 for all the others (27 of 30 tokens: kept > rest).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from ...core.hooks import HookPoint
from ...core.model import evaluating
from ...core.protocols import Progress
from ...core.replacement import FEATURES, FREEZABLE, ReplacementModel
from ...core.splice import attach, site_module
from ...features.dashboard import FeatureData
from ...features.dictionary import SparseDictionary
from ...features.sites import site_of, splice
from .graph import (
    AttributionGraph,
    _build,
    _capture_names,
    _target,
    _tokens,
    graph_size,
    node_write,
    target_of,
    zero_writes,
)


def _by_site(dictionaries: Mapping[str, Any] | Iterable[SparseDictionary]) -> dict[str, Any]:
    if isinstance(dictionaries, Mapping):
        return dict(dictionaries)
    return {site_of(d).name: d for d in dictionaries}


def feature_graph(model, dictionaries: Mapping[str, Any] | Iterable[SparseDictionary], src, tgt, position: int = -1,
                  token: int | None = None, *, baseline_token: int | None = None, target: str = "logit",
                  src_tokens: list[str] | None = None, tgt_tokens: list[str] | None = None,
                  progress: Progress | None = None, head_nodes: bool = False) -> AttributionGraph:
    """The attribution graph of `token` at decoder `position` with `dictionaries`' features as nodes ({site:
    dictionary}, or dictionaries whose configs name their sites). Arguments as `graph.attribution_graph`'s.
    An attention block without a dictionary passes its input through (its heads are edges, circuit-tracer's
    convention); with `head_nodes`, it keeps one node per head and position, as head graphs do (the older
    convention: with no dictionaries, the head graph itself)."""
    sites = _by_site(dictionaries)
    src, tgt, position = _target(model, src, tgt, position, token, baseline_token, target)
    rm = ReplacementModel(model, src, tgt, freeze=(*FREEZABLE, FEATURES) if sites else FREEZABLE, dtype=torch.float64,
                          names=_capture_names(model), splices=sites)
    graph = _build(rm, position, token, baseline_token, target, src_tokens, tgt_tokens, progress,
                   head_nodes=head_nodes)
    graph.meta["sites"] = sorted(sites)
    graph.meta["head_nodes"] = head_nodes
    return graph


def feature_graph_size(model, dictionaries: Mapping[str, Any] | Iterable[SparseDictionary], src, tgt,
                       position: int = -1, *, head_nodes: bool = False) -> int:
    """How many nodes `feature_graph` builds (before building it: its adjacency is nodes² float64, 450 MB at 7,500
    nodes). One float32 forward pass: the active features are counted where the dictionaries' encoders put them (a
    float64 pre-activation at a TopK tie could move one)."""
    sites = _by_site(dictionaries)
    src, tgt, position = _target(model, src, tgt, position, None, None, "logit")
    rm = ReplacementModel(model, src, tgt, freeze=(), splices=sites)
    n = graph_size(model, src.size(1), position, head_nodes=head_nodes)
    memory = model.stream("enc").hook_out.name
    for site, sf in rm.features.items():
        length = sf.active.size(1)
        n += int(sf.active[0].sum()) + length  # its features, one error per position
        if sf.hook_in == memory or not (sf.transcoder or head_nodes):  # an attention block's heads: none to replace
            continue
        module = site_module(model, site)
        block = module if sf.transcoder else next(m for m in model.modules() if getattr(m, "hook_out", None) is module)
        n -= getattr(block, "n_heads", 1) * length  # the block's head (or FFN) nodes it replaces
    return n


def feature_nodes(graph: AttributionGraph) -> list[int]:
    """Indices of the feature nodes."""
    return [i for i, n in enumerate(graph.nodes) if n["kind"] == "feature"]


def remove_features(model, dictionaries, src, tgt, graph: AttributionGraph, node_sets: list[list[int]]
                    ) -> torch.Tensor:
    """The real model's target with each set of nodes removed, one set per row of one batch: features clamped to 0
    at their position (the dictionaries spliced in, `<site>.sae.hook_acts`, the error term kept, so everything else
    is the model's own computation); embeddings, heads and FFNs zeroed as `graph.remove_nodes` does."""
    sites = _by_site(dictionaries)
    src, tgt = _tokens(src, "src").to(model.device), _tokens(tgt, "tgt").to(model.device)
    tgt = tgt[:, : graph.position + 1]
    feats: dict[str, list[tuple[int, int, int]]] = {}
    edits: dict[str, list[tuple[int, tuple]]] = {}
    for row, nodes in enumerate(node_sets):
        for j in nodes:
            node = graph.nodes[j]
            if node["kind"] == "feature":
                feats.setdefault(node["site"], []).append((row, node["position"], node["feature"]))
            else:
                name, idx = node_write(model, node)
                edits.setdefault(name, []).append((row, idx))

    def clamp(assign):
        def hook(acts, point):
            for row, q, f in assign:
                acts[row, q, f] = 0
            return acts
        return hook

    n = len(node_sets)
    with evaluating(model), torch.no_grad(), _spliced(model, sites) as points:
        spec = [(points[site].hook_acts.name, clamp(v)) for site, v in feats.items()]
        spec += [(name, zero_writes(v)) for name, v in edits.items()]
        with model.hooks(spec):
            logits = model(src.expand(n, -1), tgt.expand(n, -1))[:, graph.position].double()
    return target_of(logits, graph).cpu()


@contextlib.contextmanager
def _spliced(model, sites: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The dictionaries attached to `model` for the block: {site: Splice}. A `SparseDictionary` goes through
    `features.splice`, so a splice the app already holds for it is shared, not refused."""
    with contextlib.ExitStack() as stack:
        points = {}
        for site, d in sites.items():  # each entered as soon as attached: a failure detaches the earlier ones
            points[site] = stack.enter_context(splice(model, d) if isinstance(d, SparseDictionary)
                                               else attach(model, site, d))
        yield points


def feature_check(model, dictionaries, src, tgt, graph: AttributionGraph, k: int = 5, *, random_sets: int = 10,
                  seed: int = 0) -> dict[str, float]:
    """Interventions that test the graph's feature ranking in the real model: the target's drop when the top-k
    features by attribution are clamped to 0 together, next to the top-k by gradient x activation
    (`feature_gradient_x_activation`) and k random active features (mean over `random_sets` draws), and what the
    graph predicts for its own set and the random ones: the sum of the removed features' attributions (in the
    replacement model, exact for one feature and for features none of which lies downstream of another); in the real
    model attention, norms, gates and the other features' active sets respond."""
    cand = feature_nodes(graph)
    if not cand:
        raise ValueError("the graph has no feature nodes")
    att = graph.attribution[cand]
    order = att.argsort(descending=True)[:k].tolist()
    top = [cand[j] for j in order]
    gxa = feature_gradient_x_activation(model, dictionaries, src, tgt, graph)[cand]
    by_gxa = [cand[j] for j in gxa.argsort(descending=True)[:k].tolist()]
    g = torch.Generator().manual_seed(seed)
    rand = [[cand[j] for j in torch.randperm(len(cand), generator=g)[:k].tolist()] for _ in range(random_sets)]
    vals = remove_features(model, dictionaries, src, tgt, graph, [[], top, by_gxa, *rand])
    base = float(vals[0])  # the spliced model with nothing clamped: the model itself
    rand_pred = [float(graph.attribution[r].sum()) for r in rand]
    return {"logit": base, "top_drop": base - float(vals[1]), "top_predicted": float(att[order].sum()),
            "gxa_drop": base - float(vals[2]), "random_drop": base - float(vals[3:].mean()),
            "random_predicted": sum(rand_pred) / len(rand_pred)}


def graph_scores(graph: AttributionGraph) -> dict[str, float]:
    """circuit-tracer's two graph scores (`compute_graph_scores`), on the influence `prune` ranks by: *replacement*,
    the share of the embeddings' and error nodes' influence that is the embeddings' (the end-to-end flow from the
    tokens that passes no error node); *completeness*, the mean over nodes, weighted by influence (+1 for the logit),
    of the share of each node's |in-edges| that does not come from an error node. Error nodes: the dictionaries'
    (`site` set) and the frozen model's rounding ones. The bias node is in neither: circuit-tracer's graphs have
    none (their transcoders' biases are left out of the adjacency), so its influence counts for neither side."""
    a = graph.adjacency.abs()
    b = a / a.sum(1, keepdim=True).clamp(min=1e-30)
    inf = graph.influence.clone()
    inf[-1] = 1.0  # circuit-tracer's influence + logit weights
    kinds = [n["kind"] for n in graph.nodes]
    error = torch.tensor([k == "error" for k in kinds])
    embed = torch.tensor([k == "embed" for k in kinds])
    tokens, errors = float(inf[embed].sum()), float(inf[error].sum())
    clean = 1.0 - b[:, error].sum(1)
    return {"replacement": tokens / (tokens + errors) if tokens + errors > 0 else 0.0,
            "completeness": float((clean * inf).sum() / inf.sum())}


def paths_within(graph: AttributionGraph, keep) -> torch.Tensor:
    """(N,) each node's influence on the logit through the paths whose nodes all lie in `keep` (0 elsewhere), on the
    full graph's normalised |A| (`graph.influence`'s): what a pruned graph holds of the influence by its own edges.
    At most `graph.influence`; equal to it for every node when `keep` is every node."""
    n = len(graph.nodes)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[torch.as_tensor(keep, dtype=torch.long)] = True
    mask[-1] = True
    a = graph.adjacency.abs()
    b = a / a.sum(1, keepdim=True).clamp(min=1e-30)
    b = b[mask][:, mask]
    cur = b[-1].clone()
    total = cur.clone()
    for _ in range(len(b)):  # a DAG: the powers vanish after its depth
        cur = cur @ b
        if not bool(cur.any()):
            break
        total += cur
    out = torch.zeros(n, dtype=torch.float64)
    out[mask] = total
    out[-1] = 0.0
    return out


def pruned_check(model, dictionaries, src, tgt, graph: AttributionGraph, keep) -> dict[str, float]:
    """The pruned graph `keep` (node indices, as `graph.prune` gives) tested in the real model: the target's drop
    with the pruned graph's features clamped to 0 together, and with every other active feature clamped to 0 together
    (the dictionaries spliced in, errors kept), each beside the graph's prediction (the sum of their attributions).
    A pruned graph that holds the mechanism loses much of the target with its own features and little without the
    rest."""
    feats = set(feature_nodes(graph))
    kept = sorted(feats & {int(i) for i in keep})
    rest = sorted(feats - set(kept))
    vals = remove_features(model, dictionaries, src, tgt, graph, [[], kept, rest])
    base = float(vals[0])
    return {"logit": base, "kept_features": len(kept), "rest_features": len(rest),
            "kept_drop": base - float(vals[1]), "kept_predicted": float(graph.attribution[kept].sum()),
            "rest_drop": base - float(vals[2]), "rest_predicted": float(graph.attribution[rest].sum())}


def feature_gradient_x_activation(model, dictionaries, src, tgt, graph: AttributionGraph) -> torch.Tensor:
    """(N,) gradient x activation of each feature node (0 for the other nodes): its activation times W_dec[f] . the
    real model's gradient of the graph's target at the site's output (one backward pass, nothing frozen). The ranking
    one would use without a graph: `feature_check` sets its top-k beside the graph's."""
    sites = _by_site(dictionaries)
    src, tgt = _tokens(src, "src").to(model.device), _tokens(tgt, "tgt").to(model.device)
    tgt = tgt[:, : graph.position + 1]
    outputs = {}
    for site in sites:
        module = site_module(model, site)
        outputs[site] = module.name if isinstance(module, HookPoint) else module.hook_out.name
    leaves: dict[str, torch.Tensor] = {}

    def tap(x, hook):
        leaves[hook.name] = torch.zeros_like(x, requires_grad=True)
        return x + leaves[hook.name]

    names = list(dict.fromkeys(outputs.values()))
    with evaluating(model), torch.enable_grad(), model.hooks([(n, tap) for n in names]):
        target = target_of(model(src, tgt)[0, graph.position].double(), graph)
        grads = dict(zip(names, torch.autograd.grad(target, [leaves[n] for n in names])))
    out = torch.zeros(len(graph.nodes), dtype=torch.float64)
    for i in feature_nodes(graph):
        node = graph.nodes[i]
        w = sites[node["site"]].W_dec[node["feature"]].detach().double()
        out[i] = node["activation"] * float(w @ grads[outputs[node["site"]]][0, node["position"]].double())
    return out


def feature_details(tm, directories: Mapping[str, Any], node: dict[str, Any], *, contexts: int = 5,
                    effects: int = 10) -> dict[str, Any]:
    """A feature node's dashboard content, looked up on demand: its link, top contexts and output effects from
    `features.dashboard.FeatureData` (the dictionary's directory, with its corpus statistics, per site)."""
    fd = FeatureData.load(tm, directories[node["site"]])
    f = int(node["feature"])
    return {"site": node["site"], "feature": f, "link": node["link"],
            "contexts": [vars(c) for c in fd.contexts(f, limit=contexts)],
            "output_effects": fd.output_effects(f, top=effects)}

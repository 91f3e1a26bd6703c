"""How far an attribution graph can be trusted: its predictions beside real removals and beside the baselines.

A graph's node attribution is exactly what removing that node changes the logit by in the *frozen* model
(attention patterns, norm scales and FFN gates fixed). The real model re-normalises and re-attends, so the two
differ; a reader needs to know by how much before acting on the ranking. `graph_trust` puts, for the graph's top
computed nodes (heads and FFNs) and apart from them its embeddings, the predicted effect beside the effect of
really removing that node alone, with the rank correlation of the two. `top_sets_vs_baselines` asks the question
a researcher asks first: do the graph's top-k computed nodes matter more, removed together in the real model,
than the top-k by gradient × activation (one backward pass, no graph) and than k random nodes?
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .attribution import spearman
from .gradients import run_with_grads
from .graph import AttributionGraph, attribution_graph, node_write, removable, remove_nodes


@dataclass(frozen=True)
class GraphTrust:
    """Predicted (graph attribution) and real (logit change when removed alone) effects of a graph's top nodes."""

    nodes: list[int]
    labels: list[str]
    kinds: list[str]
    predicted: np.ndarray
    real: np.ndarray
    spearman: float
    """Rank correlation of predicted and real effects over the top computed nodes (not the embeddings)."""

    def frame(self):
        import pandas as pd

        return pd.DataFrame({"node": self.nodes, "label": self.labels, "kind": self.kinds,
                             "predicted": self.predicted, "real": self.real})


def graph_trust(model, src, tgt, graph: AttributionGraph, top: int = 20) -> GraphTrust:
    """The graph's `top` computed nodes by |attribution| and then every embedding node, each with its predicted
    effect and the real model's logit change when that node alone is removed (one batched forward)."""
    cand = removable(graph)
    computed = [j for j in cand if graph.nodes[j]["kind"] != "embed"]
    embeds = [j for j in cand if graph.nodes[j]["kind"] == "embed"]
    att = graph.attribution.double()
    computed = sorted(computed, key=lambda j: -abs(float(att[j])))[:top]
    chosen = computed + embeds
    removed = remove_nodes(model, src, tgt, graph, [[j] for j in chosen]).double().numpy()
    real = graph.logit - removed
    predicted = att[chosen].numpy()
    n = len(computed)
    rho = float(spearman(torch.tensor(predicted[:n]), torch.tensor(real[:n]))) if n >= 3 else float("nan")
    return GraphTrust(chosen, [graph.nodes[j]["label"] for j in chosen], [graph.nodes[j]["kind"] for j in chosen],
                      predicted, real, rho)


def gradient_x_activation(model, src, tgt, graph: AttributionGraph, nodes: Sequence[int]) -> np.ndarray:
    """Gradient × activation of each node's write in the real model (one backward pass), for the graph's target."""
    names = sorted({node_write(model, graph.nodes[j])[0] for j in nodes})
    position, token, baseline = graph.position, graph.token, graph.baseline_token
    demeaned = graph.meta.get("target") == "demeaned"

    def metric(logits: torch.Tensor) -> torch.Tensor:
        row = logits[0, position]
        value = row[token] - (row[baseline] if baseline is not None else 0)
        return value - row.mean() if demeaned else value

    src_t = torch.as_tensor(src).reshape(1, -1).to(model.device)
    tgt_t = torch.as_tensor(tgt).reshape(1, -1)[:, : position + 1].to(model.device)
    _, acts, grads = run_with_grads(model, src_t, tgt_t, metric, names=names)
    out = []
    for j in nodes:
        name, idx = node_write(model, graph.nodes[j])
        out.append(float((acts[name][0][idx].double() * grads[name][0][idx].double()).sum()))
    return np.array(out)


def top_sets_vs_baselines(model, items: Sequence[tuple], k: int = 5, *, target: str = "logit",
                          random_sets: int = 10, seed: int = 0) -> dict:
    """Over `items` (src ids, tgt ids, position): the real logit drop when removing, together, the graph's top-k
    computed nodes (by attribution), the top-k by gradient × activation, and k random computed nodes (mean over
    `random_sets`); and the graph's predicted drop for its own set. Means, medians and the share of items where
    the graph's set beats gradient × activation's, in the target's units (nats of logit)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for src, tgt, position in items:
        graph = attribution_graph(model, src, tgt, position=position, target=target)
        computed = [j for j in removable(graph) if graph.nodes[j]["kind"] != "embed"]
        att = graph.attribution.double()
        by_graph = sorted(computed, key=lambda j: -float(att[j]))[:k]
        gxa = gradient_x_activation(model, src, tgt, graph, computed)
        by_gxa = [computed[i] for i in np.argsort(-gxa)[:k]]
        rand = [[computed[i] for i in torch.randperm(len(computed), generator=g)[:k].tolist()]
                for _ in range(random_sets)]
        vals = remove_nodes(model, src, tgt, graph, [by_graph, by_gxa, *rand]).double().numpy()
        rows.append({"graph": graph.logit - vals[0], "gxa": graph.logit - vals[1],
                     "random": float(np.mean(graph.logit - vals[2:])),
                     "predicted": float(att[by_graph].sum()), "overlap": len(set(by_graph) & set(by_gxa)) / k})
    drop = {key: np.array([r[key] for r in rows]) for key in ("graph", "gxa", "random", "predicted", "overlap")}
    return {
        "items": len(rows), "k": k, "target": target,
        "mean_drop": {key: float(drop[key].mean()) for key in ("graph", "gxa", "random")},
        "median_drop": {key: float(np.median(drop[key])) for key in ("graph", "gxa", "random")},
        "graph_beats_gxa": float((drop["graph"] > drop["gxa"]).mean()),
        "graph_beats_random": float((drop["graph"] > drop["random"]).mean()),
        "predicted_over_real_median": float(np.nanmedian(drop["predicted"] / np.where(np.abs(drop["graph"]) > 1e-9,
                                                                                 drop["graph"], np.nan))),
        "mean_overlap_with_gxa": float(drop["overlap"].mean()),
        "per_item": rows,
    }

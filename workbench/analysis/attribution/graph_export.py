"""An attribution graph as circuit-tracer's graph file: the JSON its frontend (Anthropic's attribution-graph viewer,
as circuit-tracer ships it) loads from `graph_data/SLUG.json`, pruned as circuit-tracer prunes.

    g = attribution_graph(model, src, tgt, position=4, src_tokens=..., tgt_tokens=...)
    data = circuit_tracer_graph(g, slug="hund-4", token_prob=0.61, token_str="dog")
    write_circuit_tracer(data, "graph_files")     # graph_files/hund-4.json + graph_files/graph-metadata.json
    # then: circuit-tracer start-server --graph_file_dir graph_files   (or any static server of its frontend)

The schema (`schemas/circuit_tracer_graph.schema.json`) is generated from circuit-tracer's pydantic models
(`circuit_tracer/frontend/graph_models.py` at d797c82); `tests/analysis/attribution/test_graph_export.py` validates
against it.

How an encoder-decoder graph is laid out in a viewer made for one decoder stack:

    prompt_tokens   the source tokens, then the decoder input (start token + target prefix up to `position`)
    ctx_idx         a source position q is q; a decoder position q is len(source) + q
    layer           "E" for embeddings (and the bias node); otherwise the row of the sub-layer that writes, in the
                    order the residual streams are written: encoder layer 0 self-attention, its FFN, layer 1 ...,
                    then decoder layer 0 self-attention, cross-attention, FFN, ...; the logit is the row above them
    feature         a head's index; 0 for an FFN; -1 for an error; a dictionary feature's id; an embedding's position
    feature_type    "embedding", "logit", "mlp reconstruction error" (our per-layer error node, drawn on the row of
                    its layer's FFN), "cross layer transcoder" (a dictionary feature: the only spelling the viewer
                    gives a feature panel; circuit-tracer writes it for per-layer transcoders too), and ours:
                    "attention head", "mlp" and "bias" (drawn as plain circles)
    influence       circuit-tracer's cumulative score: the share of the total influence held by the nodes at least as
                    influential as this one (the viewer's pruning slider compares it with its threshold)
    clerp           our node label (with its token); the logit's is `Output "tok" (p=0.613)`, the form the viewer
                    parses for the token and its probability

The bias node (every constant: norm, attention and FFN biases) has no position; it is drawn in the embedding row at
ctx_idx 0. Feature nodes (kind "feature", from a feature-level graph) carry `stack`, `layer`, `position`, `feature`,
and optionally `block` (the sub-layer whose row they share; else read from `site`, their dictionary's site as
`analysis.qk_attribution` names it; else the end of their layer, or the stack's top row for hook_memory) and
`activation`.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ...core.batching import decoder_input
from ...core.model import evaluating
from ...core.protocols import Progress
from .graph import AttributionGraph, attribution_graph, node_influence

SCHEMA = Path(__file__).with_name("schemas") / "circuit_tracer_graph.schema.json"
BLOCK_ORDER = ("self_attn", "cross_attn", "ffn")
FEATURE_TYPE = {"embed": "embedding", "logit": "logit", "error": "mlp reconstruction error",
                "feature": "cross layer transcoder", "head": "attention head", "ffn": "mlp", "bias": "bias"}
ALWAYS_KEPT = ("embed", "logit")  # circuit-tracer keeps every token and logit node
SOURCES = ("bias", "error")  # nodes without incoming edges: kept while they have an outgoing one


class PruneResult(NamedTuple):
    node_mask: torch.Tensor  # (N,) bool: nodes kept
    edge_mask: torch.Tensor  # (N, N) bool, [target, source]: edges kept
    cumulative_scores: torch.Tensor  # (N,) circuit-tracer's per-node score (see the module docstring)


def _find_threshold(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """circuit-tracer's find_threshold: the score at which the sorted scores' cumulative share reaches `threshold`."""
    ordered = torch.sort(scores, descending=True).values
    cum = torch.cumsum(ordered, 0) / ordered.sum()
    i = min(int(torch.searchsorted(cum, torch.tensor([threshold], dtype=cum.dtype))), len(cum) - 1)
    return ordered[i]


def prune_graph(graph: AttributionGraph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> PruneResult:
    """circuit-tracer's `prune_graph` (circuit_tracer/graph.py) on our graph: the fewest nodes holding
    `node_threshold` of the influence on the logit (`AttributionGraph.prune`) plus every embedding and the logit;
    then, on the adjacency restricted to them, the edges holding `edge_threshold` of the edge influence (|A|
    normalised per row times the influence of its target); then, until nothing changes, nodes left without an
    outgoing kept edge (all but embeddings and the logit) or, for heads, FFNs and features, without an incoming one
    are dropped with their edges. One addition: a zero entry of the adjacency is never an edge."""
    if not 0 <= edge_threshold <= 1:
        raise ValueError(f"edge_threshold must be in [0, 1], got {edge_threshold}")
    kinds = [n["kind"] for n in graph.nodes]
    n = len(kinds)
    always = torch.tensor([k in ALWAYS_KEPT for k in kinds])
    needs_in = torch.tensor([k not in ALWAYS_KEPT and k not in SOURCES for k in kinds])
    needs_out = ~always
    node_mask = torch.zeros(n, dtype=torch.bool)
    node_mask[graph.prune(node_threshold)] = True
    node_mask |= always

    # circuit-tracer zeroes the dropped nodes' rows and columns of the whole matrix; the same scores come from the
    # kept nodes' block alone (K x K, not N x N: feature graphs have thousands of nodes), the logit staying last
    kept = node_mask.nonzero().flatten()
    sub = graph.adjacency[kept][:, kept].abs()
    normalised = sub / sub.sum(1, keepdim=True).clamp(min=1e-10)
    logit_weight = torch.zeros(len(kept), dtype=sub.dtype)
    logit_weight[-1] = 1.0
    edge_scores = normalised * (node_influence(sub) + logit_weight)[:, None]
    edge_mask = torch.zeros(n, n, dtype=torch.bool)
    edge_mask[kept[:, None], kept[None, :]] = (edge_scores >= _find_threshold(edge_scores.flatten(), edge_threshold)) \
        & (sub != 0)

    old = node_mask.clone()
    node_mask[needs_out] &= edge_mask[:, needs_out].any(0)
    node_mask[needs_in] &= edge_mask[needs_in].any(1)
    while not torch.equal(node_mask, old):
        old = node_mask.clone()
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
        node_mask[needs_out] &= edge_mask[:, needs_out].any(0)
        node_mask[needs_in] &= edge_mask[needs_in].any(1)

    scores, order = torch.sort(graph.influence, descending=True)
    cumulative = torch.zeros_like(graph.influence)
    cumulative[order] = torch.cumsum(scores, 0) / scores.sum().clamp(min=1e-300)
    return PruneResult(node_mask, edge_mask, cumulative)


@torch.no_grad()
def token_probability(model, src: torch.Tensor, tgt: torch.Tensor, graph: AttributionGraph) -> float:
    """The model's probability of the graph's token at its position (what the viewer shows on the logit node);
    `src`, `tgt`: the (1, L) sentence the graph was built on."""
    with evaluating(model):
        logits = model(src.to(model.device), tgt[:, : graph.position + 1].to(model.device))[0, graph.position]
    return float(logits.float().softmax(-1)[graph.token])


MEMORY_ROW = ("enc", 1 << 30, "memory")
"""The row of the encoder output's own dictionary (hook_memory): after every encoder row, before the decoder's."""


def _on_memory(node: dict[str, Any]) -> bool:
    return node["kind"] in ("feature", "error") and bool(node.get("site")) and node["stack"] == "enc" \
        and node.get("layer") is None


def graph_rows(graph: AttributionGraph) -> dict[tuple[str, int], int]:
    """(stack, layer, block) -> row, in the order the residual streams are written (encoder, then decoder); a
    hook_memory dictionary's nodes get a row of their own between them (`MEMORY_ROW`)."""
    keys = {(n["stack"], n["layer"], n["block"]) for n in graph.nodes if n["kind"] in ("head", "ffn")}
    keys |= {k for n in graph.nodes if n["kind"] == "feature" and (k := _feature_key(n))[1] is not None
             and k[2] is not None}
    if any(_on_memory(n) for n in graph.nodes):
        keys.add(MEMORY_ROW)
    order = [*BLOCK_ORDER, "memory"]
    ordered = sorted(keys, key=lambda k: (k[0] != "enc", k[1], order.index(k[2])))
    return {k: i for i, k in enumerate(ordered)}


def prompt_tokens(graph: AttributionGraph) -> tuple[list[str], int]:
    """The source tokens then the decoder input, from the embedding nodes' labels (`<q>` where a node has none),
    and the number of source tokens."""
    side = {"enc": {}, "dec": {}}
    for n in graph.nodes:
        if n["kind"] == "embed":
            side[n["stack"]][n["position"]] = n["token"] if n.get("token") is not None else f"<{n['position']}>"
    src = [side["enc"][q] for q in range(len(side["enc"]))]
    tgt = [side["dec"][q] for q in range(len(side["dec"]))]
    return src + tgt, len(src)


def _process_token(token: str) -> str:
    """circuit-tracer's process_token (frontend/utils.py): control characters drawn visibly."""
    return token.replace("\n", "⏎").replace("\t", "→").replace("\r", "↵")


def _place(node: dict[str, Any], rows: dict, src_len: int) -> tuple[str, int, int]:
    """(layer, feature, ctx_idx) of a non-logit node."""
    kind = node["kind"]
    pos = node.get("position")
    ctx = 0 if pos is None else pos + (src_len if node["stack"] == "dec" else 0)
    if kind == "embed":
        return "E", ctx, ctx
    if kind == "bias":
        return "E", -1, ctx
    if kind == "error" and node.get("site"):  # a dictionary's error at its site: its features' row, feature -2
        return str(_feature_row(node, rows)), -2, ctx  # (-1 is the layer's rounding error, possibly on that row)
    if kind == "error":  # the layer's reconstruction error, on the row of its last sub-layer
        row = max(r for (s, i, _), r in rows.items() if s == node["stack"] and i == node["layer"])
        return str(row), -1, ctx
    if kind == "head":
        return str(rows[node["stack"], node["layer"], node["block"]]), int(node["head"]), ctx
    if kind == "ffn":
        return str(rows[node["stack"], node["layer"], "ffn"]), 0, ctx
    if kind == "feature":
        return str(_feature_row(node, rows)), int(node["feature"]), ctx
    raise ValueError(f"node {node.get('label')} has kind {kind!r}, which the circuit-tracer export cannot place")


_SITE_BLOCK = re.compile(r"^(?:enc|dec)\.\d+\.(?:hook_resid_)?(self_attn|cross_attn|ffn)\b")


def _feature_key(node: dict[str, Any]) -> tuple[str, int | None, str | None]:
    """(stack, layer, block) of a feature node: `block`, or read from its `site` (dec.1.ffn, dec.2.cross_attn.hook_out,
    enc.0.hook_resid_self_attn), else None."""
    block = node.get("block")
    if block is None and node.get("site"):
        m = _SITE_BLOCK.match(node["site"])
        block = m.group(1) if m else None
    return node["stack"], node.get("layer"), block


def _feature_row(node: dict[str, Any], rows: dict) -> int:
    """A feature node's row: its sub-layer's; without one, the last row of its layer (of the layer before, for the
    stream entering a layer: hook_resid_in), or of its stack (hook_memory)."""
    if _on_memory(node) and MEMORY_ROW in rows:
        return rows[MEMORY_ROW]
    stack, layer, block = _feature_key(node)
    if layer is not None and (stack, layer, block) in rows:
        return rows[stack, layer, block]
    ours = {i: r for (s, i, _), r in sorted(rows.items(), key=lambda kv: kv[1]) if s == stack}  # layer -> last row
    if layer is not None and str(node.get("site", "")).endswith("hook_resid_in"):  # the stream entering the layer
        return ours.get(layer - 1, min(r for (s, _, _), r in rows.items() if s == stack))
    return ours[layer] if layer is not None else max(ours.values())


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def circuit_tracer_graph(graph: AttributionGraph, *, slug: str, token_prob: float, token_str: str | None = None,
                         baseline_str: str | None = None, node_threshold: float = 0.8, edge_threshold: float = 0.98,
                         scan: str = "attention-workbench", prompt: str | None = None,
                         feature_scans: dict[str, str] | None = None) -> dict[str, Any]:
    """The graph as circuit-tracer's graph file (a dict; `write_circuit_tracer` saves it), pruned by `prune_graph`.
    `token_prob`: the model's probability of the target token (the viewer shows it and sorts logits by it);
    `token_str` / `baseline_str`: how the target token (and the baseline of a logit difference) read.
    `feature_scans` {site: folder}: where the viewer finds the feature files (`features.circuit_tracer`) of each
    dictionary whose features are nodes (a feature node's `site`), e.g. "./data/features/hook_memory" under
    circuit-tracer's server; written as its custom scan, one entry of `transcoder_list` per row."""
    if not slug or "/" in slug:
        raise ValueError(f"slug must be a non-empty file name without '/', got {slug!r}")
    if not 0 <= token_prob <= 1:
        raise ValueError(f"token_prob must be a probability, got {token_prob}")
    tokens, src_len = prompt_tokens(graph)
    rows = graph_rows(graph)
    kept = prune_graph(graph, node_threshold, edge_threshold)
    token_str = str(graph.token) if token_str is None else token_str
    baseline_str = str(graph.baseline_token) if baseline_str is None else baseline_str
    versus = "" if graph.baseline_token is None else f' minus "{_process_token(baseline_str)}"'
    if graph.meta.get("target") == "demeaned":
        versus = " minus the mean logit"

    nodes = _node_entries(graph, kept, rows, src_len, token_prob, token_str, versus)
    ids = [e["node_id"] for e in nodes.values()]
    if len(set(ids)) != len(ids):  # the viewer keys nodes (and merges features) by layer_feature_ctx
        dup = sorted({x for x in ids if ids.count(x) > 1})
        raise ValueError(f"two nodes share a (layer, feature, ctx_idx) in the circuit-tracer layout: {dup[:5]}")

    a = graph.adjacency
    targets, sources = kept.edge_mask.nonzero(as_tuple=True)
    links = [{"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": float(a[t, s])}
             for t, s in zip(targets.tolist(), sources.tolist()) if s in nodes and t in nodes]
    connected = {x for link in links for x in (link["source"], link["target"])}
    used = [e for e in nodes.values() if e["node_id"] in connected or e["feature_type"] in ("embedding", "logit")]
    src_part, tgt_part = tokens[:src_len], tokens[src_len:]
    transcoder_list: list[str] = []
    if feature_scans:
        transcoder_list = _transcoder_list(graph, nodes, connected, feature_scans, len(rows))
        scan = "custom-" + scan  # the viewer then looks a feature up in transcoder_list[its row]
    metadata = {"slug": slug, "scan": scan, "transcoder_list": transcoder_list,
                "prompt_tokens": [_process_token(t) for t in tokens],
                "prompt": prompt if prompt is not None else " ".join(src_part) + " → " + " ".join(tgt_part),
                "node_threshold": node_threshold}
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": metadata, "qParams": qparams, "nodes": used, "links": links}


def _node_entries(graph: AttributionGraph, kept, rows: dict, src_len: int, token_prob: float, token_str: str,
                  versus: str) -> dict[int, dict[str, Any]]:
    """{graph node: its circuit-tracer node entry} for the nodes `prune_graph` kept."""
    nodes: dict[int, dict[str, Any]] = {}
    for i in kept.node_mask.nonzero().flatten().tolist():
        node = graph.nodes[i]
        influence = float(kept.cumulative_scores[i])
        if node["kind"] == "logit":
            layer, feature, ctx = str(len(rows)), int(graph.token), src_len + graph.position
            entry = {"node_id": f"{layer}_{feature}_{ctx}", "feature": feature, "layer": layer, "ctx_idx": ctx,
                     "feature_type": "logit", "token_prob": float(token_prob), "is_target_logit": True,
                     "clerp": f'Output "{_process_token(token_str)}" (p={token_prob:.3f}){versus}',
                     "influence": influence, "activation": None}
        else:
            layer, feature, ctx = _place(node, rows, src_len)
            label = node.get("label", "")
            tok = node.get("token")
            clerp = label if tok is None or node["kind"] == "embed" else f"{label} “{_process_token(str(tok))}”"
            activation = node.get("activation") if node["kind"] == "feature" else None
            entry = {"node_id": f"{layer}_{feature}_{ctx}", "feature": feature, "layer": layer, "ctx_idx": ctx,
                     "feature_type": FEATURE_TYPE[node["kind"]], "token_prob": 0.0, "is_target_logit": False,
                     "clerp": clerp, "influence": influence,
                     "activation": None if activation is None else _finite(float(activation))}
        entry.update(run_idx=0, reverse_ctx_idx=0, jsNodeId=entry["node_id"])
        nodes[i] = entry
    return nodes


def _transcoder_list(graph: AttributionGraph, nodes: dict[int, dict[str, Any]], connected: set,
                     feature_scans: dict[str, str], n_rows: int) -> list[str]:
    """The viewer's `transcoder_list`: per row, the folder of feature files of the dictionary whose features sit
    there (one per row), from `feature_scans` {site: folder}."""
    by_row: dict[str, str] = {}
    for i, e in nodes.items():
        if graph.nodes[i]["kind"] != "feature" or e["node_id"] not in connected:
            continue
        site = graph.nodes[i].get("site")
        if site not in feature_scans:
            raise ValueError(f"feature node {graph.nodes[i].get('label')} is of site {site!r}, which "
                             f"feature_scans lacks (it has {sorted(feature_scans)})")
        if by_row.setdefault(e["layer"], feature_scans[site]) != feature_scans[site]:
            raise ValueError(f"row {e['layer']} holds features of two dictionaries: the viewer reads one per row")
        by_row[e["layer"]] = feature_scans[site]
    return [by_row.get(str(r), "") for r in range(n_rows + 1)]


def validate_circuit_tracer(data: dict[str, Any]) -> None:
    """Raise `jsonschema.ValidationError` unless `data` matches circuit-tracer's graph schema, and ValueError when a
    link names a node the file does not have."""
    import jsonschema  # optional: only validation needs it (it comes with altair)

    jsonschema.validate(data, json.loads(SCHEMA.read_text(encoding="utf-8")))
    ids = {n["node_id"] for n in data["nodes"]}
    missing = {x for link in data["links"] for x in (link["source"], link["target"])} - ids
    if missing:
        raise ValueError(f"links name nodes the file does not have: {sorted(missing)[:5]}")


def write_circuit_tracer(data: dict[str, Any], directory: str | Path) -> Path:
    """Write `SLUG.json` into `directory` and add its metadata to `graph-metadata.json` there (replacing an entry
    with the same slug), as circuit-tracer's create_graph_files does; returns the graph file's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = data["metadata"]
    path = directory / f"{meta['slug']}.json"
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    index = directory / "graph-metadata.json"
    listing = json.loads(index.read_text(encoding="utf-8")) if index.is_file() else {"graphs": []}
    listing["graphs"] = [g for g in listing["graphs"] if g["slug"] != meta["slug"]] + [meta]
    index.write_text(json.dumps(listing, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return path


def export_sentence(tm, source: str, out_dir: str | Path, *, reference: str | None = None,
                    positions: Sequence[int] | None = None, slug: str | None = None, target: str = "logit",
                    node_threshold: float = 0.8, edge_threshold: float = 0.98, scan: str = "attention-workbench",
                    progress: Progress | None = None) -> list[Path]:
    """Graph files of a sentence's output tokens: the model's translation (`tm`, a TranslationModel, with its
    decoding settings), or `reference` teacher-forced; one file per output position (default: every one, the end of
    sentence included), named `SLUG-POSITION.json`, all listed in `out_dir/graph-metadata.json` (the viewer's
    graph menu). `target`: as `attribution_graph`'s."""
    src_ids, _ = tm.encode_source(source)
    if not src_ids:
        raise ValueError("the source sentence is empty")
    cfg = tm.model.cfg
    if reference is None:
        out_ids = list(tm.translate([source], return_tokens=True)[0].tokens)
    else:
        out_ids = [*tm.tgt_tokenizer.encode(reference)[: cfg.max_positions - 1], cfg.eos_id]
    positions = range(len(out_ids)) if positions is None else positions
    for p in positions:
        if not 0 <= p < len(out_ids):
            raise ValueError(f"position {p} out of range: the output has {len(out_ids)} tokens (0..{len(out_ids) - 1})")
    if slug is None:  # ASCII from the sentence: accents dropped ("läuft" -> "lauft"), other runs -> "-"
        plain = unicodedata.normalize("NFKD", source).encode("ascii", "ignore").decode()
        slug = re.sub(r"[^A-Za-z0-9_-]+", "-", plain).strip("-")[:40] or "sentence"
    src_pieces = tm.src_tokenizer.pieces(src_ids)
    out_pieces = tm.tgt_tokenizer.pieces(out_ids)
    src = torch.tensor([src_ids], device=tm.device)
    paths = []
    for p in positions:
        tgt = torch.tensor([decoder_input(out_ids[: p + 1], cfg.start_id)], device=tm.device)
        g = attribution_graph(tm.model, src, tgt, position=p, token=int(out_ids[p]), target=target,
                              src_tokens=src_pieces, tgt_tokens=["<s>", *out_pieces[:p]])
        base = None if g.baseline_token is None else tm.tgt_tokenizer.pieces([g.baseline_token])[0]
        prompt = f"{source} → {' '.join(out_pieces[:p])} [{out_pieces[p]}]"
        data = circuit_tracer_graph(g, slug=f"{slug}-{p}", token_prob=token_probability(tm.model, src, tgt, g),
                                    token_str=out_pieces[p], baseline_str=base, node_threshold=node_threshold,
                                    edge_threshold=edge_threshold, scan=scan, prompt=prompt)
        paths.append(write_circuit_tracer(data, out_dir))
        if progress is not None:
            progress(len(paths), len(positions), f"{paths[-1]}: {len(data['nodes'])} nodes, {len(data['links'])} "
                     f"links (output token {p}, {out_pieces[p]!r})")
    return paths

"""Feature-level attribution graphs over test2016 (docs/analysis.md §12, issue 36 point 3): how small their pruned
graphs are, and how far interventions on the real model confirm them.

    nice python scripts/feature_graph_report.py --sentences 20 --sampled 100 --threads 1 \
        --json docs/evidence/feature_graph.json [--features runs/fg_k8] [--features runs/fg_tc]

The shipped multi30k-de-en and its shipped dictionaries (checkpoints/multi30k-de-en/features: SAEs on hook_memory and
dec.{0..3}.cross_attn.hook_out, skip transcoders on FFNs), each --features folder's dictionaries replacing the
shipped one of their site or adding their site (transcoders on FFNs that ship none). Greedy translations of
test2016's first sentences. Two modes, as benchmarks/bench_graph.py: *every*, every output position of the first
--sentences sentences; *sampled*, one position of each of the next --sampled sentences, drawn uniformly with a
generator seeded by --seed.
Per graph (target "logit"): node and feature counts, `prune(0.8)`'s size (the logit node included) and what
kinds of node it keeps, the same size under circuit-tracer's conventions where they differ from ours (every
embedding kept whatever its influence; no bias node), what `prune(0.8, max_nodes=100)` keeps, the whole-FFN nodes of
the 80 % set by layer, the share of the influence each kind of node holds, the share held by the 100 most influential
nodes, the share `prune(0.8, max_nodes=100)`'s graph holds by its own paths (`paths_within`), circuit-tracer's
replacement and completeness scores (`graph_scores`), the share held by error nodes, the completeness error.
Interventions at one position per sentence (7·i mod its length in every mode, the drawn one in sampled mode), for the
targets "logit" and "demeaned": the real model's target drop with the graph's top-5 features by attribution clamped
to 0 together (the dictionaries spliced in, errors kept: `feature_check`) next to 5 random active features (10
draws) and the top-5 by gradient x activation in the real model (the ranking one would use without a graph), each
beside the graph's prediction (the sum of their attributions); and the top-10 features one by one,
predicted vs real, with their rank correlation; and the pruned graph itself (`prune(0.8, max_nodes=100)`): its
features clamped together against every other active feature clamped together (`pruned_check`). With --site-sets
N: `prune(0.8)`'s size with subsets of the dictionaries on N more sentences (from line 100), to see which sites cost
the nodes. With --freeze-study N: the top-5
features ranked by gradient x activation with the gradient taken under each part of the freezing alone (N sentences
from line 200), to see what makes gradient x activation's ranking beat the graph's. Records go to --records (JSON
lines; a rerun resumes), the summary to --json. Attention blocks without a dictionary pass their input through
(`feature_graph`'s default: heads as edges); --head-nodes gives them one node per head and position (the convention
of docs/evidence/feature_graph.json, _k16 and _k8; docs/evidence/feature_graph_heads_as_edges*.json are without it).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from workbench.analysis.attribution.feature_graph import (
    feature_check,
    feature_graph,
    feature_nodes,
    graph_scores,
    paths_within,
    pruned_check,
    remove_features,
)
from workbench.analysis.attribution.graph import node_influence
from workbench.core.hooks import HookPoint
from workbench.core.replacement import ReplacementModel
from workbench.core.splice import site_module
from workbench.decoding.translator import load
from workbench.features.dictionary import SparseDictionary

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 2 and np.std(ra) > 0 and np.std(rb) > 0 else float("nan")


def measure(model, dicts, src, tgt, pos: int, check: bool, seed: int, head_nodes: bool = False) -> dict:
    t = time.perf_counter()
    g = feature_graph(model, dicts, src, tgt, pos, head_nodes=head_nodes)
    seconds = time.perf_counter() - t
    inf = g.influence[:-1]
    total = float(inf.sum())
    top100 = float(inf.sort(descending=True).values[:100].sum()) / total if total > 0 else 1.0
    errors = [i for i, n in enumerate(g.nodes[:-1]) if n["kind"] == "error" and n.get("site")]
    keep80 = g.prune(0.8)
    keep100 = g.prune(0.8, max_nodes=100)
    embeds = set(g.index(kind="embed"))
    row = {"position": pos, "seconds": seconds, "nodes": len(g.nodes), "features": len(feature_nodes(g)),
           "kept80": len(keep80), "top100_share": top100,
           "kept80_every_embed": len(set(keep80.tolist()) | embeds), "kept80_no_bias": kept_without_bias(g),
           "kept80_kinds": dict(Counter(kind_of(g.nodes[i]) for i in keep80[:-1].tolist())),
           "kept100_kinds": dict(Counter(kind_of(g.nodes[i]) for i in keep100[:-1].tolist())),
           "kept80_ffn_layers": dict(Counter(f"{g.nodes[i]['stack']}.{g.nodes[i]['layer']}.ffn"
                                             for i in keep80[:-1].tolist() if g.nodes[i]["kind"] == "ffn")),
           "influence_share_by_kind": {k: v / total if total > 0 else 0.0 for k, v in influence_by_kind(g).items()},
           "kept80_feature_sites_positions": len({(g.nodes[i]["site"], g.nodes[i]["position"])
                                                  for i in keep80[:-1].tolist() if g.nodes[i]["kind"] == "feature"}),
           "top100_paths_within_share": float(paths_within(g, keep100[:-1])[:-1].sum()) / total if total > 0
           else 1.0, **graph_scores(g),
           "site_error_share": float(inf[errors].sum()) / total if total > 0 else 0.0,
           "rel_error": abs(float(g.adjacency[-1].sum()) - g.logit) / max(abs(g.logit), 1e-12)}
    if check:
        for target in ("logit", "demeaned"):
            gt = g if target == "logit" else feature_graph(model, dicts, src, tgt, pos, target=target,
                                                           head_nodes=head_nodes)
            f = feature_check(model, dicts, src, tgt, gt, 5, random_sets=10, seed=seed)
            feats = feature_nodes(gt)
            top = [feats[j] for j in gt.attribution[feats].argsort(descending=True)[:10].tolist()]
            real = remove_features(model, dicts, src, tgt, gt, [[], *[[i] for i in top]])
            single_real = (real[0] - real[1:]).tolist()
            single_pred = gt.attribution[top].tolist()
            pc = pruned_check(model, dicts, src, tgt, gt, gt.prune(0.8, max_nodes=100)[:-1])
            row[target] = {**f, **{f"pruned_{k}": v for k, v in pc.items() if k != "logit"},
                           "single_predicted": single_pred, "single_real": single_real,
                           "single_spearman": spearman(single_pred, single_real),
                           "top_kinds": [gt.nodes[i]["site"] for i in top[:5]]}
    return row


def kind_of(node: dict) -> str:
    """A node's class in the composition counts: feature, embed, site_error (a dictionary's), head, ffn, bias, or
    error (the frozen model's rounding)."""
    if node["kind"] == "error":
        return "site_error" if node.get("site") else "error"
    return node["kind"]


def influence_by_kind(g) -> dict[str, float]:
    """The influence on the logit summed over the nodes of each class (`kind_of`); the logit node left out."""
    out: dict[str, float] = {}
    for node, value in zip(g.nodes[:-1], g.influence[:-1].tolist()):
        out[kind_of(node)] = out.get(kind_of(node), 0.0) + value
    return out


def kept_without_bias(g) -> int:
    """`prune(0.8)`'s size with the bias node's edges dropped before normalising (circuit-tracer's graphs have no
    bias node: its transcoders' biases are not in the adjacency), the logit node included."""
    bias = g.index(kind="bias")
    a = g.adjacency.clone()
    a[:, bias] = 0
    inf = node_influence(a)[:-1]
    values = inf.sort(descending=True).values
    return int((values.cumsum(0) / values.sum() < 0.8 - 1e-12).sum()) + 2


def node_mix(rows: list[dict]) -> dict:
    """What the pruned graphs hold, over graphs: the mean count of each kind of node in the 80 % set and in
    `prune(0.8, max_nodes=100)`'s, the mean whole-FFN nodes of the 80 % set per layer, the median share of the
    influence each kind holds."""
    def per_key(field: str, reduce) -> dict[str, float]:
        keys = sorted({k for row in rows for k in row.get(field, {})})
        return {k: float(reduce([row.get(field, {}).get(k, 0) for row in rows])) for k in keys}

    return {"kept80_kinds_mean": per_key("kept80_kinds", np.mean),
            "kept100_kinds_mean": per_key("kept100_kinds", np.mean),
            "kept80_ffn_layers_mean": per_key("kept80_ffn_layers", np.mean),
            "influence_share_by_kind_median": per_key("influence_share_by_kind", np.median)}


def summarise(records: list[dict]) -> dict:
    out: dict = {}
    for mode in ("every", "sampled"):
        recs = [r for r in records if r["mode"] == mode]
        if not recs:
            continue
        rows = [row for r in recs for row in r["rows"]]
        kept = np.array([row["kept80"] for row in rows])
        top100 = np.array([row["top100_share"] for row in rows])
        s = {"sentences": len(recs), "graphs": len(rows),
             "share_kept80_at_most_100_nodes": float((kept <= 100).mean()),
             "share_top100_nodes_hold_80pct_influence": float((top100 >= 0.8).mean()),
             "kept80_median_p90_max": [float(np.median(kept)), float(np.percentile(kept, 90)), int(kept.max())],
             "top100_share_median": float(np.median(top100)),
             "circuit_tracer_conventions": {
                 "share_kept80_at_most_100_nodes_every_embedding_kept": float(np.mean(
                     [row["kept80_every_embed"] <= 100 for row in rows])),
                 "kept80_every_embedding_kept_median": float(np.median([row["kept80_every_embed"] for row in rows])),
                 "share_kept80_at_most_100_nodes_no_bias_node": float(np.mean(
                     [row["kept80_no_bias"] <= 100 for row in rows])),
                 "kept80_no_bias_node_median": float(np.median([row["kept80_no_bias"] for row in rows])),
                 "replacement_score_median": float(np.median([row["replacement"] for row in rows])),
                 "completeness_score_median": float(np.median([row["completeness"] for row in rows]))},
             **node_mix(rows),
             "kept80_feature_sites_positions_median": float(np.median(
                 [row["kept80_feature_sites_positions"] for row in rows])),
             # the row key's name is older than its meaning: prune(0.8, max_nodes=100)'s graph, not always 100 nodes
             "pruned_graph_paths_within_share_median": float(np.median(
                 [row["top100_paths_within_share"] for row in rows])),
             "site_error_share_median": float(np.median([row["site_error_share"] for row in rows])),
             "nodes_mean": float(np.mean([row["nodes"] for row in rows])),
             "features_mean": float(np.mean([row["features"] for row in rows])),
             "completeness_rel_error_max": max(row["rel_error"] for row in rows),
             "graph_seconds_mean": statistics.mean(row["seconds"] for row in rows)}
        if mode == "sampled":
            w = np.array([r["tokens"] for r in recs], dtype=float)
            s["share_kept80_at_most_100_nodes_token_weighted"] = float((w * (kept <= 100)).sum() / w.sum())
        for target in ("logit", "demeaned"):
            checks = [row[target] for row in rows if target in row]
            if not checks:
                continue
            pooled_p = [p for c in checks for p in c["single_predicted"]]
            pooled_r = [r for c in checks for r in c["single_real"]]
            rhos = np.array([c["single_spearman"] for c in checks], dtype=float)
            td = [c["top_drop"] for c in checks]
            rd = [c["random_drop"] for c in checks]
            gd = [c["gxa_drop"] for c in checks]
            s[f"interventions_{target}"] = {
                "graphs": len(checks),
                "top5_real_drop_mean_median": [float(np.mean(td)), float(np.median(td))],
                "top5_predicted_mean_median": [float(np.mean([c["top_predicted"] for c in checks])),
                                               float(np.median([c["top_predicted"] for c in checks]))],
                "random5_real_drop_mean_median": [float(np.mean(rd)), float(np.median(rd))],
                "gxa_top5_real_drop_mean_median": [float(np.mean(gd)), float(np.median(gd))],
                "share_graph_top5_beats_gxa_top5": float(np.mean([a > b for a, b in zip(td, gd)])),
                "random5_predicted_mean": float(np.mean([c["random_predicted"] for c in checks])),
                "share_top_drop_over_3x_random": float(np.mean([a > 3 * max(b, 0.0) for a, b in zip(td, rd)])),
                "single_top10_predicted_over_real_median": float(np.median(
                    np.abs(pooled_p) / np.maximum(np.abs(pooled_r), 1e-6))),
                "single_top10_spearman_median_quartiles": [float(np.nanmedian(rhos)),
                                                           float(np.nanpercentile(rhos, 25)),
                                                           float(np.nanpercentile(rhos, 75))],
                "single_top10_pooled_spearman": spearman(pooled_p, pooled_r),
                "pruned_graph": {
                    "kept_features_median": float(np.median([c["pruned_kept_features"] for c in checks])),
                    "kept_real_drop_mean_median": [float(np.mean([c["pruned_kept_drop"] for c in checks])),
                                                   float(np.median([c["pruned_kept_drop"] for c in checks]))],
                    "kept_predicted_mean_median": [float(np.mean([c["pruned_kept_predicted"] for c in checks])),
                                                   float(np.median([c["pruned_kept_predicted"] for c in checks]))],
                    "rest_real_drop_mean_median": [float(np.mean([c["pruned_rest_drop"] for c in checks])),
                                                   float(np.median([c["pruned_rest_drop"] for c in checks]))],
                    "rest_predicted_mean_median": [float(np.mean([c["pruned_rest_predicted"] for c in checks])),
                                                   float(np.median([c["pruned_rest_predicted"] for c in checks]))],
                    "share_kept_drop_over_rest_drop": float(np.mean(
                        [c["pruned_kept_drop"] > c["pruned_rest_drop"] for c in checks]))}}
        out[mode] = s
    return out


def site_sets(tm, dicts: dict, lines: list[str], head_nodes: bool = False) -> dict:
    """Which dictionaries cost the nodes: `prune(0.8)`'s size with every shipped dictionary, with subsets of them, and
    with none (the head graph), at position 7·i mod its length of each sentence."""
    model = tm.model
    sets = {"all": list(dicts), "all but hook_memory": [s for s in dicts if s != "hook_memory"],
            "hook_memory only": ["hook_memory"], "cross-attention SAEs only": [s for s in dicts if "cross" in s],
            "FFN transcoders only": [s for s in dicts if s.endswith(".ffn")], "none (head graph)": []}
    kept: dict[str, list[int]] = {k: [] for k in sets}
    for i, (line, o) in enumerate(zip(lines, tm.translate(lines, return_tokens=True, beam=1))):
        toks = list(o.tokens)
        src = torch.tensor([tm.encode_source(line)[0]])
        tgt = torch.tensor([[model.cfg.start_id, *toks[:-1]]])
        for name, sites in sets.items():
            kept[name].append(len(feature_graph(model, {s: dicts[s] for s in sites}, src, tgt,
                                                (7 * i) % len(toks), head_nodes=head_nodes).prune(0.8)))
    return {name: {"kept80_median": float(np.median(v)), "share_at_most_100": float(np.mean(np.array(v) <= 100)),
                   "kept80": v} for name, v in kept.items()}


FREEZES = {"the graph's (attention, norms, gates, features)": ("attention", "norms", "gates", "features"),
           "attention, norms, gates": ("attention", "norms", "gates"), "norms": ("norms",),
           "attention": ("attention",), "gates": ("gates",), "nothing (gradient x activation)": ()}


def freeze_study(tm, dicts: dict, lines: list[str], head_nodes: bool = False) -> dict:
    """Why gradient x activation's top features remove more than the graph's: each feature's activation x (W_dec[f] .
    the target's gradient at its site's output) with the gradient taken in a replacement model that freezes only some
    parts; the real drop when each ranking's top 5 are clamped together (target: the logit), at position 7·i mod
    its length of each sentence."""
    model = tm.model
    drops: dict[str, list[float]] = {k: [] for k in FREEZES}
    for i, (line, o) in enumerate(zip(lines, tm.translate(lines, return_tokens=True, beam=1))):
        toks = list(o.tokens)
        pos = (7 * i) % len(toks)
        src = torch.tensor([tm.encode_source(line)[0]])
        tgt = torch.tensor([[model.cfg.start_id, *toks[:-1]]])
        g = feature_graph(model, dicts, src, tgt, pos, head_nodes=head_nodes)
        feats = feature_nodes(g)
        sets = []
        for freeze in FREEZES.values():
            rm = ReplacementModel(model, src, tgt[:, : pos + 1], freeze=freeze, dtype=torch.float64,
                                  splices=dicts if "features" in freeze else None)
            outputs = {}
            for site in dicts:
                m = site_module(rm.model, site)
                outputs[site] = m.name if isinstance(m, HookPoint) else m.hook_out.name
            names = list(dict.fromkeys(outputs.values()))
            leaves: dict[str, torch.Tensor] = {}

            def tap(x, hook, leaves=leaves):
                leaves[hook.name] = torch.zeros_like(x, requires_grad=True)
                return x + leaves[hook.name]

            with torch.enable_grad():
                logit = rm(extra=[(n, tap) for n in names])[0, pos, g.token]
                grads = dict(zip(names, torch.autograd.grad(logit, [leaves[n] for n in names])))
            score = torch.tensor([g.nodes[j]["activation"] * float(
                dicts[g.nodes[j]["site"]].W_dec[g.nodes[j]["feature"]].detach().double()
                @ grads[outputs[g.nodes[j]["site"]]][0, g.nodes[j]["position"]]) for j in feats])
            sets.append([feats[j] for j in score.argsort(descending=True)[:5].tolist()])
        vals = remove_features(model, dicts, src, tgt, g, [[], *sets])
        for name, v in zip(FREEZES, vals[1:]):
            drops[name].append(float(vals[0] - v))
    return {name: {"top5_real_drop_mean": float(np.mean(v)), "top5_real_drop_median": float(np.median(v))}
            for name, v in drops.items()}


def load_dictionaries(checkpoint: Path, features: list[Path]) -> list[SparseDictionary]:
    """The shipped dictionaries, then each folder of `features` in order: a dictionary there replaces the one of its
    site, or adds its site where the checkpoint ships none (a transcoder on an FFN without one). A dictionary folder
    holds cfg.json, or a `dictionary/` folder that does: a training run's out-dir."""
    def site(d: SparseDictionary) -> str:
        return d.cfg.hook_name_out or d.cfg.hook_name

    by_site = {site(d): d for d in (SparseDictionary.load(p) for p in sorted((checkpoint / "features").iterdir())
                                    if p.is_dir())}
    for folder in features:
        for d in sorted(folder.iterdir()):
            d = d / "dictionary" if (d / "dictionary" / "cfg.json").exists() else d
            if (d / "cfg.json").exists():
                other = SparseDictionary.load(d)
                by_site[site(other)] = other
    return [by_site[s] for s in sorted(by_site)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "multi30k-de-en"))
    ap.add_argument("--features", action="append", default=[],
                    help="a folder of dictionary folders, each replacing the checkpoint's dictionary of its site or "
                         "adding its site (repeatable, later folders win; default: the checkpoint's features/ alone)")
    ap.add_argument("--src", default=str(DATA / "test_2016_flickr.de"))
    ap.add_argument("--sentences", type=int, default=20, help="every mode: every position of the first N")
    ap.add_argument("--sampled", type=int, default=100, help="sampled mode: one position of each of the next N")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--freeze-study", type=int, default=0,
                    help="also: top-5 features by gradient x activation under partial freezing, on N sentences "
                         "from line 200")
    ap.add_argument("--site-sets", type=int, default=0,
                    help="also: prune(0.8)'s size with subsets of the dictionaries, on N sentences from line 100")
    ap.add_argument("--head-nodes", action="store_true",
                    help="the older convention: attention blocks without a dictionary keep one node per head and "
                         "position (default: they pass their input through, their heads edges)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--records", default=str(ROOT / "runs" / "feature_graph_report" / "records.jsonl"))
    ap.add_argument("--json", default=str(ROOT / "docs" / "evidence" / "feature_graph.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tm = load(args.checkpoint)
    model = tm.model
    dicts = load_dictionaries(Path(args.checkpoint), [Path(f) for f in args.features])
    lines = Path(args.src).read_text(encoding="utf-8").splitlines()[: args.sentences + args.sampled]
    uniforms = torch.rand(len(lines), generator=torch.Generator().manual_seed(args.seed), dtype=torch.float64)
    records_path = Path(args.records)
    records_path.parent.mkdir(parents=True, exist_ok=True)
    records = [json.loads(x) for x in records_path.read_text(encoding="utf-8").splitlines()] \
        if records_path.exists() else []
    done = {r["sentence"] for r in records}
    todo = [i for i in range(len(lines)) if i not in done]
    outs = {i: list(o.tokens) for i, o in zip(todo, tm.translate([lines[i] for i in todo], return_tokens=True,
                                                                  beam=1))} if todo else {}
    meta = {"checkpoint": Path(args.checkpoint).name, "dictionaries": [d.cfg.hook_name_out or d.cfg.hook_name
                                                                       for d in dicts],
            "torch": torch.__version__, "machine": platform.machine(), "threads": torch.get_num_threads(),
            "seed": args.seed, "sentences_every": args.sentences, "sentences_sampled": args.sampled,
            "k": {d.cfg.hook_name_out or d.cfg.hook_name: d.cfg.k for d in dicts},
            "features": ", ".join(args.features) or "the checkpoint's features/",
            "attention_without_dictionary": "head nodes" if args.head_nodes else "pass-through (heads as edges)"}
    with records_path.open("a", encoding="utf-8") as log:
        for k, i in enumerate(todo):
            toks = outs[i]
            src = torch.tensor([tm.encode_source(lines[i])[0]])
            tgt = torch.tensor([[model.cfg.start_id, *toks[:-1]]])
            every = i < args.sentences
            pick = (7 * i) % len(toks) if every else min(int(float(uniforms[i]) * len(toks)), len(toks) - 1)
            positions = range(len(toks)) if every else [pick]
            rows = [measure(model, dicts, src, tgt, p, p == pick, seed=i, head_nodes=args.head_nodes)
                    for p in positions]
            rec = {"mode": "every" if every else "sampled", "sentence": i, "tokens": len(toks), "pick": pick,
                   "rows": rows}
            records.append(rec)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            if (k + 1) % 10 == 0 or k + 1 == len(todo):
                summary = {"meta": meta, **summarise(records)}
                Path(args.json).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
                print(json.dumps(summary), flush=True)
    summary = {"meta": meta, **summarise(records)}
    old = json.loads(Path(args.json).read_text(encoding="utf-8")) if Path(args.json).exists() else {}
    if args.site_sets:
        by_site = {(d.cfg.hook_name_out.rsplit(".hook_out", 1)[0] if d.cfg.transcoder else d.cfg.hook_name): d
                   for d in dicts}
        all_lines = Path(args.src).read_text(encoding="utf-8").splitlines()
        summary["site_sets"] = {"sentences": f"lines 100-{99 + args.site_sets}",
                                **site_sets(tm, by_site, all_lines[100: 100 + args.site_sets], args.head_nodes)}
    elif "site_sets" in old:
        summary["site_sets"] = old["site_sets"]
    if args.freeze_study:
        by_site = {(d.cfg.hook_name_out.rsplit(".hook_out", 1)[0] if d.cfg.transcoder else d.cfg.hook_name): d
                   for d in dicts}
        all_lines = Path(args.src).read_text(encoding="utf-8").splitlines()
        summary["freeze_study"] = {"sentences": f"lines 200-{199 + args.freeze_study}",
                                   **freeze_study(tm, by_site, all_lines[200: 200 + args.freeze_study],
                                                  args.head_nodes)}
    elif "freeze_study" in old:
        summary["freeze_study"] = old["freeze_study"]
    Path(args.json).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

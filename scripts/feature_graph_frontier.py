"""How the size of pruned feature graphs depends on the dictionaries' L0 (docs/analysis.md §12, issue 36 point 3): the
share of test2016 tokens whose 80 %-influence graph has at most 100 nodes, for sets of dictionaries that differ in
their number of active features per position.

    nice python scripts/feature_graph_frontier.py --sentences 5 --threads 1 \
        --set "shipped=" --set "all k=8=runs/fg_k8" --set "memory k=8=hook_memory:runs/frontier/hook_memory/topk_k8"

Each --set is NAME=SPEC (split at the last "="): SPEC empty (the shipped dictionaries), or, joined by commas and
applied in order, folders of dictionary folders (each replaces the shipped one of its site, as
`feature_graph_report.py --features`) and SITE:FOLDER pairs. Every output
position of the first --sentences test2016 sentences (greedy translations), target "logit", the same graphs for
every set. Per set: the dictionaries' k and training FVU, the mean active features per position at each site (read
off the graphs' nodes), `prune(0.8)`'s size (the logit node included: share within 100 nodes, median, 90th
percentile), the share the 100 most influential nodes hold (median), what the 80 %-influence nodes are (mean count
per graph: features by site, heads and whole FFNs by stack, embeddings, errors, the bias node) and the bias node's
share of the influence (median). Written to --json. Attention blocks without a dictionary pass their input through
(`feature_graph`'s default: heads as edges); with --head-nodes they keep one node per head and position (the
convention the sets measured before 2026-11-27 used: each set records which).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from workbench.analysis.attribution.feature_graph import feature_graph
from workbench.decoding.translator import load
from workbench.features.dictionary import SparseDictionary

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"


def folders(checkpoint: Path, spec: str) -> dict[str, Path]:
    """{site: dictionary folder}: the shipped ones, replaced where SPEC names another (see the module's docstring)."""
    def own(path: Path) -> Path:
        return path / "dictionary" if (path / "dictionary" / "cfg.json").exists() else path

    def site(path: Path) -> str:
        cfg = json.loads((path / "cfg.json").read_text(encoding="utf-8"))
        meta = cfg.get("metadata", {})
        return meta.get("hook_name_out") or meta["hook_name"]

    out = {site(d): d for d in sorted((checkpoint / "features").iterdir()) if (d / "cfg.json").exists()}
    for pair in filter(None, spec.split(",")):
        if ":" not in pair:  # a folder of dictionary folders
            for d in sorted((ROOT / pair).iterdir()):
                if (own(d) / "cfg.json").exists():
                    out[site(own(d))] = own(d)
            continue
        name, folder = pair.split(":", 1)
        match = [s for s in out if s == name or s.startswith(name + ".")]
        if len(match) != 1:
            raise SystemExit(f"no single shipped site for {name!r}: {sorted(out)}")
        out[match[0]] = own(ROOT / folder)
    return out


def part_of(node: dict) -> str:
    """Where a node of a pruned graph sits: a feature's site, a head's or whole FFN's stack, or its kind."""
    if node["kind"] == "feature":
        return f"feature {node['site']}"
    if node["kind"] in ("head", "ffn"):
        return f"{node['kind']} {node['stack']}"
    if node["kind"] == "error" and node.get("site"):
        return "site error"
    return node["kind"]


def training_fvu(folder: Path) -> float | None:
    path = folder / "training.json"
    return json.loads(path.read_text(encoding="utf-8")).get("final", {}).get("fvu") if path.exists() else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "multi30k-de-en"))
    ap.add_argument("--src", default=str(DATA / "test_2016_flickr.de"))
    ap.add_argument("--sentences", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], help="NAME=SPEC (repeatable)")
    ap.add_argument("--head-nodes", action="store_true", help="attention blocks without a dictionary keep head nodes")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=str(ROOT / "docs" / "evidence" / "feature_graph_frontier.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    checkpoint = Path(args.checkpoint)
    tm = load(checkpoint)
    model = tm.model
    lines = Path(args.src).read_text(encoding="utf-8").splitlines()[: args.sentences]
    outs = [list(o.tokens) for o in tm.translate(lines, return_tokens=True, beam=1)]
    out_path = Path(args.json)
    summary = json.loads(out_path.read_text(encoding="utf-8")) if out_path.exists() else {}
    summary["meta"] = {"checkpoint": checkpoint.name, "sentences": args.sentences, "torch": torch.__version__,
                       "machine": platform.machine(), "threads": torch.get_num_threads()}
    sets = summary.setdefault("sets", {})
    for item in args.set or ["shipped="]:
        name, spec = item.rsplit("=", 1) if "=" in item else (item, "")
        where = folders(checkpoint, spec)
        dicts = [SparseDictionary.load(d) for d in where.values()]
        kept, top100, active, seconds, bias_share = [], [], defaultdict(list), [], []
        composition: dict[str, int] = defaultdict(int)
        for line, toks in zip(lines, outs):
            src = torch.tensor([tm.encode_source(line)[0]])
            tgt = torch.tensor([[model.cfg.start_id, *toks[:-1]]])
            for pos in range(len(toks)):
                t = time.perf_counter()
                g = feature_graph(model, dicts, src, tgt, pos, head_nodes=args.head_nodes)
                inf = g.influence[:-1]
                keep = g.prune(0.8)
                kept.append(len(keep))
                for j in keep[:-1].tolist():
                    composition[part_of(g.nodes[j])] += 1
                bias_share.append(float(inf[g.index(kind="bias")].sum() / inf.sum()))
                seconds.append(time.perf_counter() - t)
                top100.append(float(inf.sort(descending=True).values[:100].sum() / inf.sum()))
                per: dict[tuple[str, int], int] = defaultdict(int)
                for n in g.nodes:
                    if n["kind"] == "feature":
                        per[(n["site"], n["position"])] += 1
                for s in {s for s, _ in per}:
                    counts = [c for (s2, _), c in per.items() if s2 == s]
                    active[s].append(float(np.mean(counts)))
        kept_a = np.array(kept)
        training = {s: {"k": d.cfg.k, "d_sae": d.cfg.d_sae, "architecture": d.cfg.architecture,
                        "training_fvu": training_fvu(where[s]),
                        "folder": str(where[s].resolve().relative_to(ROOT.resolve()))}
                    for s, d in zip(where, dicts)}
        sets[name] = {"spec": spec or "shipped", "dictionaries": training, "graphs": len(kept),
                      "attention_without_dictionary": "head nodes" if args.head_nodes else "pass-through",
                      "active_per_position_mean": {s: float(np.mean(v)) for s, v in sorted(active.items())},
                      "share_kept80_at_most_100_nodes": float((kept_a <= 100).mean()),
                      "kept80_median_p90_max": [float(np.median(kept_a)), float(np.percentile(kept_a, 90)),
                                                int(kept_a.max())],
                      "top100_share_median": float(np.median(top100)),
                      "kept80_parts_mean": {k: v / len(kept) for k, v in sorted(composition.items())},
                      "bias_node_share_median": float(np.median(bias_share)),
                      "graph_seconds_mean": float(np.mean(seconds))}
        print(name, json.dumps(sets[name]), flush=True)
        out_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

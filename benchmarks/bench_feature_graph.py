"""Feature-level attribution graphs on the shipped de->en model with its shipped dictionaries: seconds per graph at
20 source tokens, beside the head-level graph of the same tokens in the same run (issue 36 point 3: ≤ 5 s per output
token).

    nice python benchmarks/bench_feature_graph.py [--positions 5] [--threads 1 2] [--repeats 2] \
        [--out benchmarks/results/feature_graph_cpu.json]

The sentence: the first test2016 sentence of 20 source tokens (EOS included), as benchmarks/bench_graph.py; its greedy
translation; --positions output positions evenly spaced (first and last included). Per position and thread count:
`attribution_graph` (head graph), `feature_graph` (nodes, every edge, attributions) and the feature graph's influence
(`prune`'s cost: `graph.influence`), best of --repeats (the machine is shared: the best run is the least disturbed).
The graph sizes and the completeness error are recorded with them. `uptime` before and after goes in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from workbench import load
from workbench.analysis.attribution.feature_graph import feature_graph, feature_nodes
from workbench.analysis.attribution.graph import attribution_graph
from workbench.features.dictionary import SparseDictionary

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"


def best(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--positions", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "feature_graph_cpu.json"))
    args = ap.parse_args()
    load_before = os.getloadavg()
    ckpt = ROOT / "checkpoints" / "multi30k-de-en"
    tm = load(ckpt)
    model = tm.model
    dicts = [SparseDictionary.load(d) for d in sorted((ckpt / "features").iterdir()) if d.is_dir()]
    texts = (DATA / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    text = next(t for t in texts if len(tm.encode_source(t)[0]) == 20)
    src = torch.tensor([tm.encode_source(text)[0]])
    out = tm.translate([text], return_tokens=True, beam=1)[0]
    tgt = torch.tensor([[model.cfg.start_id, *out.tokens[:-1]]])
    n = tgt.size(1)
    timed = sorted({round(k * (n - 1) / max(args.positions - 1, 1)) for k in range(args.positions)})
    feature_graph(model, dicts, src, tgt, 0)  # warm: the float64 twin and the dictionaries' first use
    result: dict = {"torch": torch.__version__, "machine": platform.machine(), "sentence": text,
                    "source_tokens": src.size(1), "output_tokens": n, "timed_positions": timed,
                    "dictionaries": [d.cfg.hook_name_out or d.cfg.hook_name for d in dicts], "runs": {}}
    for threads in args.threads:
        torch.set_num_threads(threads)
        rows = []
        for pos in timed:
            t_head, head = best(lambda pos=pos: attribution_graph(model, src, tgt, pos, out.tokens[pos]), args.repeats)
            t_feat, g = best(lambda pos=pos: feature_graph(model, dicts, src, tgt, pos, out.tokens[pos]), args.repeats)
            t = time.perf_counter()
            kept = len(g.prune(0.8))
            t_inf = time.perf_counter() - t
            rows.append({"position": pos, "head_graph_seconds": t_head, "feature_graph_seconds": t_feat,
                         "feature_influence_seconds": t_inf, "head_nodes": len(head.nodes),
                         "feature_graph_nodes": len(g.nodes), "feature_nodes": len(feature_nodes(g)),
                         "kept80": kept,
                         "completeness_rel_error": abs(float(g.adjacency[-1].sum()) - g.logit) / abs(g.logit)})
            print(threads, json.dumps(rows[-1]), flush=True)
        result["runs"][str(threads)] = {
            "positions": rows,
            "head_graph_seconds_mean": statistics.mean(r["head_graph_seconds"] for r in rows),
            "feature_graph_seconds_mean": statistics.mean(r["feature_graph_seconds"] for r in rows),
            "feature_graph_seconds_max": max(r["feature_graph_seconds"] for r in rows),
            "feature_graph_with_influence_seconds_mean": statistics.mean(
                r["feature_graph_seconds"] + r["feature_influence_seconds"] for r in rows),
            "feature_graph_with_influence_seconds_max": max(
                r["feature_graph_seconds"] + r["feature_influence_seconds"] for r in rows)}
    result["loadavg_before_after"] = [list(load_before), list(os.getloadavg())]
    Path(args.out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result["runs"].items()}, indent=1)[:2000])


if __name__ == "__main__":
    main()

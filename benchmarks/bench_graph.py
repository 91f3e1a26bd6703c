"""Attribution graphs on the shipped de->en model: construction time next to the patching sweep that answers the
same question, pruned size over test2016, and faithfulness by intervention.

    .venv/bin/python benchmarks/bench_graph.py [--sentences 1000] [--out benchmarks/results/graph_cpu.json]

Speed: one test2016 sentence of 20 source tokens (EOS included), every output position of its greedy translation.
`graph_seconds`: `attribution_graph` (nodes, every edge, attributions) per output token. The patching sweep that
answers the same question, "which nodes does this logit depend on", zero-ablates each of the graph's removable nodes
(embeddings, head x position, FFN x position) alone in the real model, 64 per batch (`remove_nodes`): one number per
node, no edges. `head_sweep_seconds`: `patching_sweep(sites="head", ablation="zero")`, the heads only.
Coverage: every output token (EOS included) of the greedy translations of the first --sentences test2016 sentences:
nodes kept by `prune(0.8)` (the logit node included), and the completeness error |sum of the logit's edges - logit| /
|logit|. Faithfulness: one output position per sentence (seeded): the real model's logit drop when the 5 nodes with
the largest attribution are zeroed together, next to 5 random removable nodes (10 draws, mean).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from workbench import load
from workbench.analysis.graph import attribution_graph, faithfulness_check, removable, remove_nodes
from workbench.analysis.patching import logit_diff, patching_sweep

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "graph_cpu.json"))
    args = ap.parse_args()
    tm = load(ROOT / "checkpoints" / "multi30k-de-en")
    model = tm.model
    texts = (DATA / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    result: dict = {"torch": torch.__version__, "machine": platform.machine(), "threads": torch.get_num_threads()}

    # -- speed at 20 source tokens
    text = next(t for t in texts if len(tm.encode_source(t)[0]) == 20)
    src = torch.tensor([tm.encode_source(text)[0]])
    out = tm.translate([text], return_tokens=True, beam=1)[0]
    tgt = torch.tensor([[model.cfg.start_id, *out.tokens[:-1]]])
    g_times, sweep_times, head_times, sizes = [], [], [], []
    for pos in range(tgt.size(1)):
        t = time.perf_counter()
        graph = attribution_graph(model, src, tgt, pos, out.tokens[pos])
        g_times.append(time.perf_counter() - t)
        sizes.append(len(graph.nodes))
        cand = removable(graph)
        t = time.perf_counter()
        for start in range(0, len(cand), 64):
            remove_nodes(model, src, tgt, graph, [[j] for j in cand[start: start + 64]])
        sweep_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        patching_sweep(model, src, tgt[:, : pos + 1], sites="head", ablation="zero",
                       metric=logit_diff(pos, out.tokens[pos]), batch_size=64)
        head_times.append(time.perf_counter() - t)
    result["speed"] = {
        "sentence": text, "source_tokens": src.size(1), "output_tokens": tgt.size(1),
        "graph_seconds_mean": statistics.mean(g_times), "graph_seconds_max": max(g_times),
        "node_sweep_seconds_mean": statistics.mean(sweep_times), "head_sweep_seconds_mean": statistics.mean(head_times),
        "nodes_mean": statistics.mean(sizes), "edges_dense_mean": statistics.mean(n * n for n in sizes),
        "ratio_node_sweep_over_graph": statistics.mean(sweep_times) / statistics.mean(g_times),
    }
    print(json.dumps(result["speed"]), flush=True)

    # -- coverage and faithfulness over test2016
    kept, rel_err, secs = [], [], []
    top_drops, rand_drops = [], []
    gen = torch.Generator().manual_seed(0)
    chosen = texts[: args.sentences]
    outs = []
    for start in range(0, len(chosen), 64):
        outs += tm.translate(chosen[start: start + 64], return_tokens=True, beam=1)
    for n, (text, o) in enumerate(zip(chosen, outs)):
        src = torch.tensor([tm.encode_source(text)[0]])
        toks = list(o.tokens)
        tgt = torch.tensor([[model.cfg.start_id, *toks[:-1]]])
        pick = int(torch.randint(len(toks), (1,), generator=gen))
        for pos in range(len(toks)):
            t = time.perf_counter()
            graph = attribution_graph(model, src, tgt, pos, toks[pos])
            secs.append(time.perf_counter() - t)
            kept.append(len(graph.prune(0.8)))
            rel_err.append(abs(float(graph.adjacency[-1].sum()) - graph.logit) / abs(graph.logit))
            if pos == pick:
                f = faithfulness_check(model, src, tgt, graph, 5, random_sets=10, seed=n)
                top_drops.append(f["top_drop"])
                rand_drops.append(f["random_drop"])
        if (n + 1) % 50 == 0 or n + 1 == len(chosen):
            k = torch.tensor(kept, dtype=torch.float64)
            result["coverage"] = {
                "sentences": n + 1, "tokens": len(kept), "share_at_most_100_nodes": float((k <= 100).double().mean()),
                "kept_nodes_median": float(k.median()), "kept_nodes_p90": float(k.quantile(0.9)),
                "kept_nodes_max": int(k.max()), "completeness_rel_error_max": max(rel_err),
                "graph_seconds_mean": statistics.mean(secs)}
            td, rd = statistics.mean(top_drops), statistics.mean(rand_drops)
            result["faithfulness"] = {"graphs": len(top_drops), "top5_drop_mean": td, "random5_drop_mean": rd,
                                      "ratio_of_means": td / rd if rd else None,
                                      "share_top_drop_over_3x_random": statistics.mean(
                                          float(a > 3 * max(b, 0.0)) for a, b in zip(top_drops, rand_drops))}
            print(json.dumps({k: result[k] for k in ("coverage", "faithfulness")}), flush=True)
            Path(args.out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

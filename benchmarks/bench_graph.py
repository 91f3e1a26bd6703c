"""Attribution graphs on the shipped de->en model: construction time next to the patching sweep that answers the
same question, pruned size over test2016, and faithfulness by intervention.

    .venv/bin/python benchmarks/bench_graph.py [--sentences 1000] [--every-token 40] [--positions 5] [--threads 1]
                                               [--skip-speed] [--out benchmarks/results/graph_cpu.json]

Speed: one test2016 sentence of 20 source tokens (EOS included), every output position of its greedy translation
(or --positions of them, evenly spaced). `graph_seconds`: `attribution_graph` (nodes, every edge, attributions) per
output token. The patching sweep that answers the same question, "which nodes does this logit depend on",
zero-ablates each of the graph's removable nodes (embeddings, head x position, FFN x position) alone in the real
model, 64 per batch (`remove_nodes`): one number per node, no edges. `head_sweep_seconds`:
`patching_sweep(sites="head", ablation="zero")`, the heads only. --skip-speed keeps the speed entry of --out.
Coverage, two modes over the greedy translations of test2016: `sampled`, the first --sentences sentences with one
output position each, drawn uniformly (EOS included) with a generator seeded by --seed before anything runs (so a
resumed run draws the same ones); `every`, every output position of the first --every-token sentences. Per graph:
nodes kept by `prune(0.8)` (the logit node included), and the completeness error |sum of the logit's edges - logit| /
|logit|. In sampled mode a graph stands for its sentence's tokens: `share_at_most_100_nodes_token_weighted` weights
each by its sentence's output length, an estimate of the share over every token of the set. Faithfulness: at the
sampled position of each sentence, the real model's logit drop when the 5 nodes with the largest attribution are
zeroed together, next to 5 random removable nodes (10 draws, mean). Each sentence measured appends one JSON line to
--records (default runs/bench_graph/records.jsonl); the same command resumes from it, and --out is rewritten every
25 sentences.
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
from workbench.analysis.attribution.graph import attribution_graph, faithfulness_check, removable, remove_nodes
from workbench.analysis.circuits.patching import logit_diff, patching_sweep

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sentences", type=int, default=1000,
                    help="sampled mode: the first N test2016 sentences, one seeded output position each")
    ap.add_argument("--every-token", type=int, default=40, help="every-token mode: the first N sentences")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sampled positions")
    ap.add_argument("--skip-speed", action="store_true", help="keep the speed entry of --out, time nothing")
    ap.add_argument("--records", default=str(ROOT / "runs" / "bench_graph" / "records.jsonl"),
                    help="one JSON line per measured sentence; a rerun with the same file resumes")
    ap.add_argument("--positions", type=int, default=0, help="time this many output positions (0: all)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "graph_cpu.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tm = load(ROOT / "checkpoints" / "multi30k-de-en")
    model = tm.model
    texts = (DATA / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    result: dict = {"torch": torch.__version__, "machine": platform.machine(), "threads": torch.get_num_threads(),
                    "sampled_seed": args.seed}
    if args.skip_speed:
        old = json.loads(Path(args.out).read_text(encoding="utf-8")) if Path(args.out).exists() else {}
        result["speed"] = old.get("speed")
    else:
        speed(tm, texts, args, result)

    # -- coverage and faithfulness over test2016
    records = Path(args.records)
    records.parent.mkdir(parents=True, exist_ok=True)
    done: dict[tuple[str, int], dict] = {}
    if records.exists():  # resume: one JSON line per (mode, sentence) already measured
        for line in records.read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                done[(r["mode"], r["sentence"])] = r
    gen = torch.Generator().manual_seed(args.seed)
    n_all = max(args.sentences, args.every_token)
    chosen = texts[:n_all]
    # one output position per sentence, drawn before anything runs so that a resumed run draws the same ones
    uniforms = torch.rand(n_all, generator=gen, dtype=torch.float64).tolist()
    todo = [n for n in range(n_all) if (n < args.every_token and ("every", n) not in done)
            or (n < args.sentences and ("sampled", n) not in done)]
    outs: dict[int, list[int]] = {}
    for start in range(0, len(todo), 64):
        batch = todo[start: start + 64]
        for n, o in zip(batch, tm.translate([chosen[n] for n in batch], return_tokens=True, beam=1)):
            outs[n] = list(o.tokens)
    with records.open("a", encoding="utf-8") as log:
        for k, n in enumerate(todo):
            src = torch.tensor([tm.encode_source(chosen[n])[0]])
            toks = outs[n]
            tgt = torch.tensor([[model.cfg.start_id, *toks[:-1]]])
            pick = min(int(uniforms[n] * len(toks)), len(toks) - 1)
            modes = [m for m, lim in (("every", args.every_token), ("sampled", args.sentences))
                     if n < lim and (m, n) not in done]
            positions = range(len(toks)) if "every" in modes else [pick]
            per_pos: dict[int, dict] = {}
            for pos in positions:
                t = time.perf_counter()
                graph = attribution_graph(model, src, tgt, pos, toks[pos])
                row = {"position": pos, "seconds": time.perf_counter() - t, "kept": len(graph.prune(0.8)),
                       "rel_error": abs(float(graph.adjacency[-1].sum()) - graph.logit) / abs(graph.logit)}
                if pos == pick:
                    f = faithfulness_check(model, src, tgt, graph, 5, random_sets=10, seed=n)
                    row.update(top_drop=f["top_drop"], random_drop=f["random_drop"])
                per_pos[pos] = row
            for m in modes:
                rows = list(per_pos.values()) if m == "every" else [per_pos[pick]]
                r = {"mode": m, "sentence": n, "tokens": len(toks), "pick": pick, "rows": rows}
                done[(m, n)] = r
                log.write(json.dumps(r) + "\n")
            log.flush()
            if (k + 1) % 25 == 0 or k + 1 == len(todo):
                summarise(result, done, args)
                Path(args.out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    summarise(result, done, args)
    Path(args.out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def summarise(result: dict, done: dict, args) -> None:
    """Coverage and faithfulness of both modes from the records so far (printed, and into `result`)."""
    for mode, lim in (("every", args.every_token), ("sampled", args.sentences)):
        recs = [done[(mode, n)] for n in range(lim) if (mode, n) in done]
        if not recs:
            continue
        rows = [row for r in recs for row in r["rows"]]
        k = torch.tensor([row["kept"] for row in rows], dtype=torch.float64)
        cov = {"sentences": len(recs), "graphs": len(rows),
               "share_at_most_100_nodes": float((k <= 100).double().mean()),
               "kept_nodes_median": float(k.median()), "kept_nodes_p90": float(k.quantile(0.9)),
               "kept_nodes_max": int(k.max()), "completeness_rel_error_max": max(row["rel_error"] for row in rows),
               "graph_seconds_mean": statistics.mean(row["seconds"] for row in rows)}
        if mode == "sampled":
            # a sentence's one position stands for its len tokens: weighting each graph by its sentence's length
            # estimates the share over all output tokens of the set (every token equally likely)
            w = torch.tensor([r["tokens"] for r in recs], dtype=torch.float64)
            cov["test_tokens"] = int(w.sum())
            cov["share_at_most_100_nodes_token_weighted"] = float((w * (k <= 100).double()).sum() / w.sum())
        faith = [(row["top_drop"], row["random_drop"]) for row in rows if "top_drop" in row]
        td, rd = statistics.mean(a for a, _ in faith), statistics.mean(b for _, b in faith)
        result[f"coverage_{mode}"] = cov
        result[f"faithfulness_{mode}"] = {
            "graphs": len(faith), "top5_drop_mean": td, "random5_drop_mean": rd,
            "ratio_of_means": td / rd if rd else None,
            "share_top_drop_over_3x_random": statistics.mean(float(a > 3 * max(b, 0.0)) for a, b in faith),
            "top5_drop_median": statistics.median(a for a, _ in faith),
            "random5_drop_median": statistics.median(b for _, b in faith)}
        print(mode, json.dumps({"coverage": cov, "faithfulness": result[f"faithfulness_{mode}"]}), flush=True)

def speed(tm, texts: list[str], args, result: dict) -> None:
    model = tm.model
    # -- speed at 20 source tokens
    text = next(t for t in texts if len(tm.encode_source(t)[0]) == 20)
    src = torch.tensor([tm.encode_source(text)[0]])
    out = tm.translate([text], return_tokens=True, beam=1)[0]
    tgt = torch.tensor([[model.cfg.start_id, *out.tokens[:-1]]])
    g_times, sweep_times, head_times, sizes = [], [], [], []
    timed = range(tgt.size(1))
    if args.positions:
        timed = sorted({round(k * (tgt.size(1) - 1) / max(args.positions - 1, 1)) for k in range(args.positions)})
    for pos in timed:
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
        "timed_positions": list(timed),
        "graph_seconds_mean": statistics.mean(g_times), "graph_seconds_max": max(g_times),
        "node_sweep_seconds_mean": statistics.mean(sweep_times), "head_sweep_seconds_mean": statistics.mean(head_times),
        "nodes_mean": statistics.mean(sizes), "edges_dense_mean": statistics.mean(n * n for n in sizes),
        "ratio_node_sweep_over_graph": statistics.mean(sweep_times) / statistics.mean(g_times),
    }
    print(json.dumps(result["speed"]), flush=True)


if __name__ == "__main__":
    main()

"""Circuit discovery time, the whole of it for one contrastive set, one set after the other (issue 31 point 4: at
most 10 minutes on 2 cores).

    .venv/bin/python benchmarks/bench_circuit_discovery.py [--threads 1] [--pairs 16]
                                                           [--out benchmarks/results/circuit_discovery_cpu.json]

Per set (the four of bench_circuits.py): load the model and build the pairs; EAP-IG scores (16 steps) and their
greedy circuit of 5 % of the edges; the iterated-EAP circuit of 5 % (`iterative_circuits`). `uptime` is recorded
before and after, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

from workbench import load
from workbench.analysis.circuits.circuits import EdgeGraph, edge_scores, iterative_circuits
from workbench.analysis.circuits.contrast import GENDER_EN, NUMBER_DE, NUMBER_EN, noun_swaps, word_swaps

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"


def lines(name: str) -> list[str]:
    return (DATA / name).read_text(encoding="utf-8").splitlines()


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--sets", default="number_de,number_en,gender_en,nouns")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "circuit_discovery_cpu.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    de = lines("test_2016_flickr.de") + lines("val.de")
    en = lines("test_2016_flickr.en") + lines("val.en")
    result: dict = {"torch": torch.__version__, "machine": platform.machine(), "threads": torch.get_num_threads(),
                    "pairs": args.pairs, "uptime_before": uptime(), "sets": {}}
    for name in args.sets.split(","):
        t0 = time.perf_counter()
        tm = load(ROOT / "checkpoints" / ("general-en-de" if name.endswith("_en") else "multi30k-de-en"))
        if name == "nouns":
            pairs = noun_swaps(tm, de[:150], max_pairs=args.pairs)
        else:
            swaps = {"number_de": NUMBER_DE, "gender_en": GENDER_EN, "number_en": NUMBER_EN}[name]
            pairs = word_swaps(tm, de if name.endswith("_de") else en, swaps, max_pairs=args.pairs)
        t1 = time.perf_counter()
        graph = EdgeGraph(tm.model)
        n = int(0.05 * graph.n_edges)
        greedy = graph.greedy_edges(edge_scores(tm.model, pairs, method="eap-ig").scores, n)
        t2 = time.perf_counter()
        circuit = iterative_circuits(tm.model, pairs, [n])[n]
        t3 = time.perf_counter()
        result["sets"][name] = {"pairs": len(pairs), "load_and_build_seconds": t1 - t0,
                                "eap_ig_greedy_seconds": t2 - t1, "iterative_seconds": t3 - t2,
                                "total_seconds": t3 - t0, "edges_greedy": len(greedy), "edges_iterative": len(circuit)}
        print(name, json.dumps(result["sets"][name]), flush=True)
    result["uptime_after"] = uptime()
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

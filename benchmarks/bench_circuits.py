"""Circuit discovery on the shipped models: EAP and EAP-IG against exact edge patching, and circuit faithfulness.

    .venv/bin/python benchmarks/bench_circuits.py [--pairs 100] [--heldout 50] [--exact-pairs 6] [--edges 500]
                                                  [--step 0.2] [--threads 1]
                                                  [--out benchmarks/results/circuits_cpu.json]

Four contrastive sets built from Multi30k test2016 (and val where test2016 has too few) with same-length sources:
  nouns      de->en (multi30k-de-en): one German noun swapped (contrast.noun_swaps)
  number_de  de->en: a singular subject and its plural ("Der Mann" / "Die Männer"; contrast.NUMBER_DE)
  gender_en  en->de (general-en-de): "a man" / "a woman" etc.: the German article's gender (contrast.GENDER_EN)
  number_en  en->de: "the dog" / "the dogs" etc.: the German article's number (contrast.NUMBER_EN)
Metric: logit difference of the clean vs the corrupted output token at the first position where the greedy
translations differ. Faithfulness is normalised against the real corrupted run (the model on the corrupted source),
with the frozen-norm corrupted run's normalisation beside it, on the pairs whose corruption flips the prediction
(`analysis.circuits.flips`; the others are counted), with the per-pair median and quartiles. Scores: EAP, EAP-IG over
the input embeddings and EAP-IG over activations; whole-node circuits (heads, FFNs) beside edge circuits.
Per set: EAP and EAP-IG scores over --pairs pairs (timed); the Spearman correlation of each with
exact edge patching (metric with one edge patched minus clean, frozen-norm model) on --edges edges sampled uniformly
from the valid edges, over the first --exact-pairs pairs; normalised faithfulness of circuits of 1, 2, 5, 10 and 20 %
of the edges from five searches, the same rule for every set: `iterative` (`iterative_circuits`, one trajectory
through the five sizes, --step removed per step) and EAP-IG's greedy search on EAP and EAP-IG scores, signed and by
|score|; next to --random random circuits of each size. The same circuits are evaluated again on --heldout further
pairs that took no part in finding them (`heldout`). `discovery_seconds`: the iterated search down to 1 % (passing
every larger size); `eap-ig_seconds` is the greedy circuits' discovery (the search itself takes milliseconds).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from workbench import load
from workbench.analysis.attribution.attribution import spearman
from workbench.analysis.circuits.circuits import (
    EdgeGraph,
    circuit_metric,
    edge_patching,
    edge_scores,
    iterative_circuits,
    node_circuit_of_size,
)
from workbench.analysis.circuits.contrast import GENDER_EN, NUMBER_DE, NUMBER_EN, noun_swaps, word_swaps

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"
FRACTIONS = (0.01, 0.02, 0.05, 0.10, 0.20)


def lines(name: str) -> list[str]:
    return (DATA / name).read_text(encoding="utf-8").splitlines()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--exact-pairs", type=int, default=6)
    ap.add_argument("--heldout", type=int, default=50, help="more pairs, to evaluate the circuits out of sample")
    ap.add_argument("--edges", type=int, default=500)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--step", type=float, default=0.2, help="iterated EAP: share of the circuit removed per step")
    ap.add_argument("--random", type=int, default=5, help="random circuits per size")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--sets", default="nouns,number_de,gender_en,number_en")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "circuits_cpu.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    de_en = load(ROOT / "checkpoints" / "multi30k-de-en")
    en_de = load(ROOT / "checkpoints" / "general-en-de")
    # test2016 and val first; the training text after them, for sets whose words are rare (number_de found 22 pairs
    # in test2016 + val): circuits are measured on contrast pairs, not on held-out translation quality
    de = lines("test_2016_flickr.de") + lines("val.de") + lines("train.de")
    en = lines("test_2016_flickr.en") + lines("val.en") + lines("train.en")
    builders = {
        "nouns": (de_en, lambda: noun_swaps(de_en, de[:1000], max_pairs=args.pairs + args.heldout)),
        "number_de": (de_en, lambda: word_swaps(de_en, de, NUMBER_DE, max_pairs=args.pairs + args.heldout)),
        "gender_en": (en_de, lambda: word_swaps(en_de, en, GENDER_EN, max_pairs=args.pairs + args.heldout)),
        "number_en": (en_de, lambda: word_swaps(en_de, en, NUMBER_EN, max_pairs=args.pairs + args.heldout)),
    }
    result = {"torch": torch.__version__, "machine": platform.machine(), "threads": torch.get_num_threads(),
              "pairs": args.pairs, "heldout": args.heldout, "exact_pairs": args.exact_pairs,
              "sampled_edges": args.edges, "ig_steps": args.steps,
              "iterative_step": args.step,
              "sets": {}}
    for name in args.sets.split(","):
        tm, build = builders[name]
        model = tm.model
        t0 = time.perf_counter()
        pairs = build()
        pairs, heldout = pairs[: args.pairs], pairs[args.pairs:]
        built = time.perf_counter() - t0
        graph = EdgeGraph(model)
        entry = {"model": "multi30k-de-en" if tm is de_en else "general-en-de",
                 "pairs": len(pairs), "heldout_pairs": len(heldout), "build_seconds": built, "edges": graph.n_edges,
                 "examples": [{"clean": p.text, "corrupted": p.corrupted_text, "good": tm.detokenize([p.good]),
                               "bad": tm.detokenize([p.bad])} for p in pairs[:5]]}
        scores = {}
        for method in ("eap", "eap-ig", "eap-ig-activations"):
            t = time.perf_counter()
            scores[method] = edge_scores(model, pairs, method=method, steps=args.steps)
            entry[f"{method}_seconds"] = time.perf_counter() - t
        # agreement with exact edge patching, on the same pairs for both sides
        sub = pairs[: args.exact_pairs]
        g = torch.Generator().manual_seed(0)
        all_edges = graph.edges()
        sample = [all_edges[i] for i in torch.randperm(len(all_edges), generator=g)[: args.edges].tolist()]
        t = time.perf_counter()
        exact = edge_patching(model, sub, sample)
        entry["exact_seconds"] = time.perf_counter() - t
        idx = tuple(torch.tensor(sample).T)
        for method in ("eap", "eap-ig", "eap-ig-activations"):
            est = edge_scores(model, sub, method=method, steps=args.steps).scores[idx]
            entry[f"{method}_spearman"] = float(spearman(est.numpy(), exact.numpy()))
        # circuits: every search at every size and the random circuits, one batched evaluation
        sizes = [max(1, int(frac * graph.n_edges)) for frac in FRACTIONS]
        t = time.perf_counter()
        iterative = iterative_circuits(model, pairs, sizes, step=args.step)
        entry["iterative_seconds"] = time.perf_counter() - t
        searches: dict[str, list[list[tuple[int, int]]]] = {"iterative": [iterative[n] for n in sizes]}
        for method in ("eap", "eap-ig", "eap-ig-activations"):
            for absolute in (False, True):
                searches[method + ("_abs" if absolute else "")] = [
                    graph.greedy_edges(scores[method].scores, n, absolute=absolute) for n in sizes]
        # whole-node circuits (heads and FFNs) from EAP-IG's node scores, as many nodes as fit in each size
        searches["nodes_eap-ig"] = [node_circuit_of_size(scores["eap-ig"], n) for n in sizes]
        g = torch.Generator().manual_seed(0)
        randoms = [[all_edges[j] for j in torch.randperm(len(all_edges), generator=g)[:n].tolist()]
                   for n in sizes for _ in range(args.random)]
        t = time.perf_counter()
        res = circuit_metric(model, pairs, [c for cs in searches.values() for c in cs] + randoms)
        entry["circuit_eval_seconds"] = time.perf_counter() - t
        norm, frozen, quart = res["normalized"].tolist(), res["normalized_frozen"].tolist(), res["quartiles"]
        entry.update(clean=res["clean"], corrupted_frozen=res["corrupted"], corrupted_real=res["real_corrupted"],
                     pairs_used=res["n_pairs"], pairs_not_flipping=int((~res["flipping"]).sum()),
                     flip_rule="clean logit difference > 0 and real corrupted < 0 (analysis.circuits.flips)")
        entry["circuits"] = {}
        for k, (search, cs) in enumerate(searches.items()):
            entry["circuits"][search] = [{"n_edges": len(c), "fraction": len(c) / graph.n_edges,
                                          "faithfulness": norm[k * len(sizes) + j],
                                          "faithfulness_frozen": frozen[k * len(sizes) + j],
                                          "per_pair": quart[k * len(sizes) + j]} for j, c in enumerate(cs)]
        rand = norm[len(searches) * len(sizes):]
        rand_frozen = frozen[len(searches) * len(sizes):]
        entry["circuits"]["random"] = [{"n_edges": n, "fraction": n / graph.n_edges,
                                        "faithfulness": rand[j * args.random: (j + 1) * args.random],
                                        "faithfulness_frozen": rand_frozen[j * args.random: (j + 1) * args.random]}
                                       for j, n in enumerate(sizes)]
        if heldout:  # the same circuits (found on `pairs`) on pairs that took no part in finding them
            res = circuit_metric(model, heldout, [c for cs in searches.values() for c in cs] + randoms)
            norm = res["normalized"].tolist()
            entry["heldout"] = {"clean": res["clean"], "corrupted_frozen": res["corrupted"],
                                "corrupted_real": res["real_corrupted"], "pairs_used": res["n_pairs"]}
            for k, (search, cs) in enumerate(searches.items()):
                entry["heldout"][search] = [norm[k * len(sizes) + j] for j in range(len(cs))]
            rand = norm[len(searches) * len(sizes):]
            entry["heldout"]["random_max"] = [max(rand[j * args.random: (j + 1) * args.random])
                                              for j in range(len(sizes))]
        # discovery: the iterated search down to the smallest size (it passes every larger one on the way)
        entry["discovery_seconds"] = entry["iterative_seconds"]
        entry["top_edges_iterative_5pct"] = [graph.edge_name(e) for e in iterative[sizes[2]]]
        top = graph.greedy_edges(scores["eap-ig"].scores, sizes[2])
        entry["top_edges_eap_ig"] = [graph.edge_name(e) for e in top[:15]]
        result["sets"][name] = entry
        skip = ("examples", "top_edges_eap_ig", "top_edges_iterative_5pct")
        print(name, json.dumps({k: v for k, v in entry.items() if k not in skip}),
              flush=True)
        Path(args.out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    Path(args.out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

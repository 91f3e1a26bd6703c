"""How far the attribution graphs of a checkpoint can be trusted, over test sentences (docs/analysis.md §12).

    python scripts/graph_trust_report.py --checkpoint checkpoints/multi30k-de-en \
        --src ../shared/data/multi30k/test_2016_flickr.de --items 100 --json docs/evidence/graph_trust.json

Items: the first N source sentences, each with one output position of the model's own greedy translation
(position 7·i mod its length, so every part of a sentence is visited). Per target (logit, runner-up, demeaned):
the real logit drop when removing together the graph's top-5 computed nodes (heads, FFNs), the top-5 by
gradient × activation, and 5 random computed nodes; the graph's predicted drop for its own set; and, per item,
the rank correlation of predicted and real single-node removals over the graph's top-20 computed nodes
(`graph_trust`), with the embeddings' predicted vs real effects reported apart. Resumes from the JSON (each
target is written when done), so the same command finishes an interrupted run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from workbench.analysis.attribution.graph import attribution_graph
from workbench.analysis.attribution.graph_trust import graph_trust, top_sets_vs_baselines
from workbench.decoding.translator import load

TARGETS = ("logit", "runner-up", "demeaned")


def items_of(tm, lines: list[str]) -> list[tuple[list[int], list[int], int]]:
    cfg = tm.model.cfg
    out = []
    for i, (line, t) in enumerate(zip(lines, tm.translate(lines, return_tokens=True))):
        tokens = list(t.tokens)
        position = (7 * i) % max(1, len(tokens))
        out.append((tm.encode_source(line)[0], [cfg.start_id, *tokens[:position]], position))
    return out


def trust_summary(model, items, target: str) -> dict:
    rhos, embed_real, embed_pred, top_real, top_pred = [], [], [], [], []
    for src, tgt, position in items:
        graph = attribution_graph(model, src, tgt, position=position, target=target)
        t = graph_trust(model, src, tgt, graph, top=20)
        rhos.append(t.spearman)
        computed = np.array([k != "embed" for k in t.kinds])
        embed_real += list(t.real[~computed])
        embed_pred += list(t.predicted[~computed])
        top_real += list(t.real[computed][:5])
        top_pred += list(t.predicted[computed][:5])
    rhos = np.array(rhos)
    ratio = lambda p, r: float(np.median(np.abs(np.array(p)) / np.maximum(np.abs(np.array(r)), 1e-6)))  # noqa: E731
    return {"spearman_top20_median": float(np.nanmedian(rhos)), "spearman_top20_quartiles":
            [float(np.nanpercentile(rhos, 25)), float(np.nanpercentile(rhos, 75))],
            "top5_nodes_predicted_over_real_median": ratio(top_pred, top_real),
            "embeddings_predicted_over_real_median": ratio(embed_pred, embed_real),
            "embeddings_mean_abs_predicted": float(np.mean(np.abs(embed_pred))),
            "embeddings_mean_abs_real": float(np.mean(np.abs(embed_real)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default="checkpoints/multi30k-de-en")
    ap.add_argument("--src", default="../shared/data/multi30k/test_2016_flickr.de")
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--json", default="docs/evidence/graph_trust.json")
    a = ap.parse_args()
    tm = load(a.checkpoint)
    lines = Path(a.src).read_text(encoding="utf-8").splitlines()[: a.items]
    items = items_of(tm, lines)
    out = Path(a.json)
    report = json.loads(out.read_text()) if out.is_file() else {}
    report.update({"checkpoint": a.checkpoint, "src": a.src, "items": len(items), "k": 5})
    for target in TARGETS:
        if target in report.get("targets", {}):
            continue
        start = time.perf_counter()
        sets = top_sets_vs_baselines(tm.model, items, k=5, target=target)
        sets.pop("per_item")
        entry = {**sets, **trust_summary(tm.model, items, target), "seconds": round(time.perf_counter() - start, 1)}
        report.setdefault("targets", {})[target] = entry
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        tmp.replace(out)
        print(target, json.dumps(entry))


if __name__ == "__main__":
    main()

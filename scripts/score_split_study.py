"""Why the best alignment heads attend where they do: for each decoder position, the head's top source piece
against the runner-up, and which (decoder-stream component, encoder-memory component) pairs make the gap.

    python scripts/score_split_study.py --checkpoint checkpoints/general-en-de --heads 0:0,1:2 \
        --src ../shared/data/alignments/rwth-deen/test.en --tgt ../shared/data/alignments/rwth-deen/test.de \
        --n 50 --out runs/score_split_general.json

Teacher-forced on the reference; rows 1..n (the positions that read a target piece, AWI); EOS left out of the
contest. Margins are summed over all rows of all sentences and reported as shares of the total gap.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from workbench.analysis.alignment.word_align import encode_words, parse_units
from workbench.analysis.attribution.score_split import margin_by_group, split_cross_scores
from workbench.decoding.translator import load


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--heads", required=True, help="LAYER:HEAD,...")
    p.add_argument("--src", required=True)
    p.add_argument("--tgt", required=True)
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    tm = load(args.checkpoint)
    cfg = tm.model.cfg
    src = open(args.src, encoding="utf-8").read().splitlines()[: args.n]
    tgt = open(args.tgt, encoding="utf-8").read().splitlines()[: args.n]
    start = time.perf_counter()
    totals: dict[str, dict[str, float]] = {}
    rows = 0
    for s_line, t_line in zip(src, tgt):
        s = encode_words(tm.src_tokenizer, s_line)
        t = encode_words(tm.tgt_tokenizer, t_line)
        s_ids = torch.tensor([[*s.ids, cfg.eos_id]])
        t_ids = torch.tensor([[cfg.start_id, *t.ids]])
        rows += len(t.ids)
        by_layer = {}
        for layer, head in parse_units(args.heads):
            if layer not in by_layer:
                by_layer[layer] = split_cross_scores(tm.model, s_ids, t_ids, layer)
            m = margin_by_group(by_layer[layer], head, rows=range(1, len(t.ids) + 1))
            acc = totals.setdefault(f"{layer}:{head}", {})
            for (qg, kg), v in m.items():
                acc[f"{qg} x {kg}"] = acc.get(f"{qg} x {kg}", 0.0) + v
    out = {"checkpoint": args.checkpoint, "sentences": len(src), "rows": rows, "seconds": time.perf_counter() - start,
           "heads": {}}
    for unit, acc in totals.items():
        total = sum(acc.values())
        ranked = sorted(acc.items(), key=lambda kv: -abs(kv[1]))
        out["heads"][unit] = {"mean_gap": total / rows,
                              "pairs": [{"pair": k, "mean": v / rows, "share": v / total} for k, v in ranked]}
        print(f"head {unit}: mean gap {total / rows:.2f}")
        for k, v in ranked[:8]:
            print(f"  {k:40s} {v / rows:+.2f}  ({100 * v / total:+.0f} %)")
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()

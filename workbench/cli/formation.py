"""`workbench formation RUN_DIR`: per-head AER, source share and roles at every saved snapshot of a training run.

    workbench formation runs/m30k --gold-src rwth/test.de --gold-tgt rwth/test.en --gold rwth/test.talp \\
        --dataset multi30k --limit 200 --out formation/

Writes formation.json (one record per snapshot, `workbench.analysis.training_dynamics.formation`; measured snapshots
are kept, so rerunning on a growing run measures only the new ones), formation.csv (one row per snapshot and head:
AER for cross-attention heads, the role statistics and the roles) and formation.html (the curves).
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

from ..analysis.training_dynamics.formation import FormationProbe, formation_records
from ..corpus.data import dataset_files, read_parallel


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a training run directory holding step_* checkpoints")
    p.add_argument("--gold-src", required=True, help="gold alignment source lines (whitespace words)")
    p.add_argument("--gold-tgt", required=True, help="gold alignment target lines")
    p.add_argument("--gold", required=True, help="gold alignments, talp form (1-based: i-j sure, ipj possible)")
    p.add_argument("--gold-base", type=int, default=1, help="index of the first word in --gold (talp: 1)")
    p.add_argument("--gold-limit", type=int, default=0, help="first N gold pairs only (0: all)")
    p.add_argument("--shift", choices=("awi", "awo"), default="awi",
                   help="AWI: the row that reads the target word; AWO: the row that predicts it")
    p.add_argument("--dataset", default="multi30k", help="test set for statistics and source shares")
    p.add_argument("--split", default="test")
    p.add_argument("--src-lang", default="de")
    p.add_argument("--tgt-lang", default="en")
    p.add_argument("--limit", type=int, default=200, help="test sentences for head statistics (0: all)")
    p.add_argument("--share-sentences", type=int, default=50, help="test sentences for ALTI+ source shares")
    p.add_argument("--steps", default=None, help="comma-separated steps to measure (default: every snapshot)")
    p.add_argument("--out", default="formation", help="output directory")


def run(args: argparse.Namespace) -> int:
    from ..charts import save_html  # CLI: loaded when run
    from ..charts.evidence import formation_chart  # CLI: loaded when run

    steps = None
    if args.steps:
        try:
            steps = [int(x) for x in args.steps.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--steps must be comma-separated integers, got {args.steps!r}") from None
    src, ref = read_parallel(*dataset_files(args.dataset, args.split, args.src_lang, args.tgt_lang),
                             limit=args.limit)
    probe = FormationProbe.from_files(args.gold_src, args.gold_tgt, args.gold, src, ref, base=args.gold_base,
                                      limit=args.gold_limit, shift=args.shift, share_sentences=args.share_sentences)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def report(n: int, total: int, what: str = "") -> None:
        print(f"  [{n}/{total}] {what} ({time.perf_counter() - start:.0f} s)", flush=True)

    records = formation_records(args.run_dir, probe, steps=steps, cache=out / "formation.json", progress=report)
    with open(out / "formation.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["step", "kind", "layer", "head", "aer", "prev_top", "next_top", "eos", "punct", "rare", "roles"])
        for r in records:
            for name, stats in r["stats"].items():
                kind, layer, head = name.split(":")
                aer = r["head_aer"][int(layer)][int(head)] if kind == "cross" else None
                w.writerow([r["step"], kind, layer, head, aer, *(stats[k] for k in
                            ("prev_top", "next_top", "eos", "punct", "rare")), r["roles"][name]])
    save_html(formation_chart(records), out / "formation.html", title=f"Formation: {args.run_dir}")
    print(f"{len(records)} snapshots -> {out / 'formation.json'}, {out / 'formation.csv'}, {out / 'formation.html'}")
    for r in records:
        share = "-" if r["source_share"] is None else f"{r['source_share']:.3f}"
        print(f"  step {r['step']:>6}: best AER {100 * r['best_aer']:.1f} % ({r['best_head']}), diagonal "
              f"{100 * r['diagonal_aer']:.1f} %, source share {share}")
    return 0

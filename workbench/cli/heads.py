"""`workbench heads`: head statistics of a checkpoint over a test set, as CSV + an offline HTML report.

    workbench heads CHECKPOINT --dataset multi30k --split test --src-lang de --tgt-lang en --out heads/
    workbench heads CHECKPOINT --src test.de --ref test.en --limit 500 --out heads/
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..analysis.head_stats import STATS, corpus_head_stats, punctuation_ids
from ..corpus.data import dataset_files, read_parallel
from ..decoding.translator import load


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a workbench checkpoint directory (own or imported)")
    p.add_argument("--dataset", default=None, help="a named dataset (workbench.corpus.data), e.g. multi30k")
    p.add_argument("--split", default="test")
    p.add_argument("--src-lang", default="de")
    p.add_argument("--tgt-lang", default="en")
    p.add_argument("--src", default=None, help="source file, one sentence a line (instead of --dataset)")
    p.add_argument("--ref", default=None, help="reference file aligned with --src")
    p.add_argument("--limit", type=int, default=0, help="first N sentences only (0: all)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--device", default="cpu")
    p.add_argument("--stat", default="entropy", help="statistic drawn in the report's heatmaps")
    p.add_argument("--out", default="heads", help="output directory for heads.csv and heads.html")


def run(args: argparse.Namespace) -> int:
    # the chart modules load Bokeh and Altair: only when the command runs, so `workbench heads --help` stays light
    from ..charts import save_html  # CLI: loaded when run
    from ..charts.analysis import head_stats_view  # CLI: loaded when run

    if args.stat not in STATS:
        raise ValueError(f"unknown statistic {args.stat!r}; known: {sorted(STATS)}")
    if args.dataset:
        src_path, ref_path = dataset_files(args.dataset, args.split, args.src_lang, args.tgt_lang)
    elif args.src and args.ref:
        src_path, ref_path = Path(args.src), Path(args.ref)
    else:
        raise ValueError("give --dataset, or both --src and --ref")
    src_text, ref_text = read_parallel(src_path, ref_path, limit=args.limit)
    tm = load(args.checkpoint, device=args.device)
    eos = tm.model.cfg.eos_id
    pairs = [(tm.encode_source(s)[0], t) for s, t in zip(src_text, ref_text)]
    pairs = [(s, tm.tgt_tokenizer.encode(t)[: tm.model.cfg.max_positions - 1] + [eos]) for s, t in pairs if s]
    if not pairs:
        raise ValueError(f"no non-empty sentences in {src_path}")
    vocab = [tm.src_tokenizer.pieces([i])[0] for i in range(tm.model.cfg.src_vocab)]
    tgt_vocab = [tm.tgt_tokenizer.pieces([i])[0] for i in range(tm.model.cfg.tgt_vocab)]
    start = time.perf_counter()
    table = corpus_head_stats(tm.model, [s for s, _ in pairs], [t for _, t in pairs], batch_size=args.batch,
                              src_punct=punctuation_ids(vocab), tgt_punct=punctuation_ids(tgt_vocab))
    seconds = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table.summary().to_csv(out / "heads.csv", index=False)
    save_html(head_stats_view(table, args.stat), out / "heads.html", title="Head statistics")
    print(f"{len(pairs)} sentences, {sum(map(table.heads_of, range(len(table.blocks))))} heads in {seconds:.1f} s -> "
          f"{out / 'heads.csv'}, {out / 'heads.html'}")
    for stat, kind in (("prev", "enc_self"), ("eos", "enc_self"), ("monotonic", "cross")):
        top = table.rank(stat, kind=kind).iloc[0]
        print(f"  top {stat} head ({kind}): layer {top['layer']} head {top['head']}: {top[stat]:.3f}")
    return 0

"""`workbench heads`: head statistics of a checkpoint over a test set, as CSV + an offline HTML report, and
every head's roles with the thresholds that decide them (`workbench.analysis.attention.roles`).

    workbench heads CHECKPOINT --dataset multi30k --split test --src-lang de --tgt-lang en --out heads/
    workbench heads CHECKPOINT --src test.de --ref test.en --limit 500 --out heads/
    workbench heads CHECKPOINT --dataset multi30k --gold-src rwth/test.de --gold-tgt rwth/test.en \
        --gold rwth/test.talp       # + per-head AER (aer.csv) and the alignment role
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..analysis.alignment.alignment import read_alignments
from ..analysis.attention.head_stats import STATS, corpus_head_stats, punctuation_ids
from ..analysis.attention.roles import head_roles
from ..analysis.training_dynamics.formation import gold_aer
from ..corpus.data import dataset_files, read_parallel
from ..decoding.evaluate import read_text
from ..decoding.translator import load


def add_corpus_arguments(p: argparse.ArgumentParser) -> None:
    """The checkpoint and the test set (a named dataset's split, or --src/--ref files): shared with `prune`."""
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


def read_corpus(args: argparse.Namespace):
    """(translation model, [(source ids, target ids)], source texts, reference texts, source path) of the test set;
    empty sources are left out (with their references)."""
    if args.dataset:
        src_path, ref_path = dataset_files(args.dataset, args.split, args.src_lang, args.tgt_lang)
    elif args.src and args.ref:
        src_path, ref_path = Path(args.src), Path(args.ref)
    else:
        raise ValueError("give --dataset, or both --src and --ref")
    src_text, ref_text = read_parallel(src_path, ref_path, limit=args.limit)
    tm = load(args.checkpoint, device=args.device)
    eos = tm.model.cfg.eos_id
    pairs, kept_src, kept_ref = [], [], []
    for s, t in zip(src_text, ref_text):
        ids = tm.encode_source(s)[0]
        if ids:
            pairs.append((ids, tm.tgt_tokenizer.encode(t)[: tm.model.cfg.max_positions - 1] + [eos]))
            kept_src.append(s)
            kept_ref.append(t)
    if not pairs:
        raise ValueError(f"no non-empty sentences in {src_path}")
    return tm, pairs, kept_src, kept_ref, src_path


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_corpus_arguments(p)
    p.add_argument("--stat", default="entropy", help="statistic drawn in the report's heatmaps")
    p.add_argument("--gold-src", default=None, help="gold alignment source lines, for the alignment role")
    p.add_argument("--gold-tgt", default=None, help="gold alignment target lines")
    p.add_argument("--gold", default=None, help="gold alignments, talp form (1-based: i-j sure, ipj possible)")
    p.add_argument("--shift", choices=("awi", "awo"), default="awi", help="alignment rows (see workbench align)")
    p.add_argument("--out", default="heads", help="output directory for heads.csv and heads.html")


def run(args: argparse.Namespace) -> int:
    # the chart modules load Bokeh and Altair: only when the command runs, so `workbench heads --help` stays light
    from ..charts import save_html  # CLI: loaded when run
    from ..charts.analysis import head_stats_view  # CLI: loaded when run

    if args.stat not in STATS:
        raise ValueError(f"unknown statistic {args.stat!r}; known: {sorted(STATS)}")
    tm, pairs, _, _, _ = read_corpus(args)
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
        print(f"  top {stat} head: {top['head_id']}: {top[stat]:.3f}")
    aer = diagonal = None
    gold_args = (args.gold_src, args.gold_tgt, args.gold)
    if any(gold_args):
        if not all(gold_args):
            raise ValueError("give all three of --gold-src, --gold-tgt and --gold")
        links = read_alignments(args.gold, base=1)
        aer, diagonal, n = gold_aer(tm, read_text(args.gold_src), read_text(args.gold_tgt), links, shift=args.shift)
        aer.to_csv(out / "aer.csv", index=False)
        best = aer.iloc[0]
        print(f"alignment ({args.shift}, {n} gold pairs): best head {best['head_id']} "
              f"AER {100 * best['aer']:.1f} %, diagonal aligner {100 * diagonal:.1f} %")
    roles = head_roles(table, aer=aer, diagonal_aer=diagonal)
    roles.table.to_csv(out / "roles.csv", index=False)
    print(roles)
    return 0

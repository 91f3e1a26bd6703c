"""Does an alignment head attend to a source piece because of that piece? For each teacher-forced decoder position,
the QK attribution (`analysis.qk_attribution`) of the head's argmax edge, counted by the category of its top
key-side part, against two controls: the same row at a random other source piece, and a random other cross head's
argmax edge at the same row.

    python scripts/qk_alignment_study.py --checkpoint checkpoints/multi30k-de-en --head 0:2 --n 50 \
        --out runs/qk_alignment.json [--dictionary checkpoints/multi30k-de-en/features/hook_memory]

Sentences: the first n of Multi30k test2016 (the checkpoint's language pair), teacher-forced on the reference.
With --dictionary (an SAE on hook_memory, with its stats.safetensors), the key side is its features.
With --gold-src/--gold-tgt/--gold (a talp file, 1-based, source word first unless --swap), the first n lines of that
set instead, encoded word by word (`word_align.encode_words`), and the head's argmax edges split into those gold links
(a possible or sure link between the source piece's word and the word of the piece the row reads, AWI) and the rest:

    python scripts/qk_alignment_study.py --head 0:2 --n 100 --out runs/qk_alignment_gold.json \
        --gold-src ../shared/data/alignments/rwth-deen/test.de --gold-tgt ../shared/data/alignments/rwth-deen/test.en \
        --gold ../shared/data/alignments/rwth-deen/test.talp
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from workbench.analysis.alignment.alignment import read_alignments
from workbench.analysis.alignment.word_align import encode_words
from workbench.analysis.attribution.qk_attribution import GROUPS, OFF_GOLD, OWN, READINGS, own_word_check
from workbench.core.batching import decoder_input
from workbench.corpus.data import dataset_files
from workbench.decoding.translator import load
from workbench.features.dictionary import SparseDictionary
from workbench.features.stats import FeatureStats


def sentences(tm, n: int):
    src_f, ref_f = dataset_files("multi30k", "test", tm.meta.get("src_lang", "de"), tm.meta.get("tgt_lang", "en"),
                                 download=False)
    src = src_f.read_text(encoding="utf-8").splitlines()[:n]
    ref = ref_f.read_text(encoding="utf-8").splitlines()[:n]
    cfg = tm.model.cfg
    for s, r in zip(src, ref):
        out = [*tm.tgt_tokenizer.encode(r), cfg.eos_id]
        yield tm.encode_source(s)[0], decoder_input(out, cfg.start_id)


def gold_sentences(tm, src_path: str, tgt_path: str, gold_path: str, n: int, swap: bool):
    """(source ids, decoder input ids, {(row, source piece)} gold links) per line, word by word as word_align does."""
    cfg = tm.model.cfg
    src = Path(src_path).read_text(encoding="utf-8").splitlines()[:n]
    tgt = Path(tgt_path).read_text(encoding="utf-8").splitlines()[:n]
    gold = read_alignments(gold_path, base=1, swap=swap)[:n]
    for s_line, t_line, (_, possible) in zip(src, tgt, gold):
        sw, tw = encode_words(tm.src_tokenizer, s_line), encode_words(tm.tgt_tokenizer, t_line)
        if not sw.ids or not tw.ids:
            continue
        src_ids = [*sw.ids, cfg.eos_id]
        out = [*tw.ids, cfg.eos_id]
        linked = {(k + 1, p) for i, j in possible for k, tj in enumerate(tw.word_of) if tj == j
                  for p, si in enumerate(sw.word_of) if si == i}  # row k + 1 reads target piece k (AWI)
        yield src_ids, decoder_input(out, cfg.start_id), linked


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", default="checkpoints/multi30k-de-en")
    p.add_argument("--head", default="0:2", help="LAYER:HEAD of the cross-attention head")
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--dictionary", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--gold-src")
    p.add_argument("--gold-tgt")
    p.add_argument("--gold")
    p.add_argument("--swap", action="store_true", help="the gold file writes target words first")
    p.add_argument("--no-contrast", action="store_true", help="skip the contrast reading (it attributes every piece)")
    args = p.parse_args()
    torch.set_num_threads(1)
    tm = load(args.checkpoint)
    layer, head = (int(x) for x in args.head.split(":"))
    dic = stats = None
    if args.dictionary:
        dic = SparseDictionary.load(args.dictionary)
        stats = FeatureStats.load(Path(args.dictionary) / "stats.safetensors")
    start = time.perf_counter()
    lines = (gold_sentences(tm, args.gold_src, args.gold_tgt, args.gold, args.n, args.swap) if args.gold
             else sentences(tm, args.n))
    check = own_word_check(tm.model, lines, layer=layer, head=head, dictionary=dic, stats=stats, seed=args.seed,
                           contrast=not args.no_contrast)
    groups = [*GROUPS, OFF_GOLD] if OFF_GOLD in check.edges else list(GROUPS)
    readings = READINGS if not args.no_contrast else READINGS[:-1]
    seconds = time.perf_counter() - start
    own = ("source token at s", "word feature") if dic is not None else OWN
    report = {"checkpoint": args.checkpoint, "head": args.head, "sentences": check.sentences, "edges": check.edges,
              "dictionary": args.dictionary, "own_categories": list(own), "seconds": seconds,
              "gold": args.gold,
              "own_share": {g: {r: check.share(g, own, r) for r in readings} for g in groups},
              "token_share": {g: {r: check.share(g, ("source token at s",), r) for r in readings}
                              for g in groups},
              "feature_chance": check.feature_chance,
              "counts": check.counts}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("edges", "own_share", "token_share", "feature_chance", "seconds")},
                     indent=1))
    print(check.frame().to_string())


if __name__ == "__main__":
    main()

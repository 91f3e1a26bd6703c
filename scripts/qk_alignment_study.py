"""Does an alignment head attend to a source piece because of that piece? For each teacher-forced decoder position,
the QK attribution (`analysis.qk_attribution`) of the head's argmax edge, counted by the category of its top
key-side part, against two controls: the same row at a random other source piece, and a random other cross head's
argmax edge at the same row.

    python scripts/qk_alignment_study.py --checkpoint checkpoints/multi30k-de-en --head 0:2 --n 50 \
        --out runs/qk_alignment.json [--dictionary checkpoints/multi30k-de-en/features/hook_memory]

Sentences: the first n of Multi30k test2016 (the checkpoint's language pair), teacher-forced on the reference.
With --dictionary (an SAE on hook_memory, with its stats.safetensors), the key side is its features.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from workbench.analysis.qk_attribution import GROUPS, OWN, READINGS, own_word_check
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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", default="checkpoints/multi30k-de-en")
    p.add_argument("--head", default="0:2", help="LAYER:HEAD of the cross-attention head")
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--dictionary", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    tm = load(args.checkpoint)
    layer, head = (int(x) for x in args.head.split(":"))
    dic = stats = None
    if args.dictionary:
        dic = SparseDictionary.load(args.dictionary)
        stats = FeatureStats.load(Path(args.dictionary) / "stats.safetensors")
    start = time.perf_counter()
    check = own_word_check(tm.model, sentences(tm, args.n), layer=layer, head=head, dictionary=dic, stats=stats,
                           seed=args.seed)
    seconds = time.perf_counter() - start
    own = ("source token at s", "word feature") if dic is not None else OWN
    report = {"checkpoint": args.checkpoint, "head": args.head, "sentences": check.sentences, "edges": check.edges,
              "dictionary": args.dictionary, "own_categories": list(own), "seconds": seconds,
              "own_share": {g: {r: check.share(g, own, r) for r in READINGS} for g in GROUPS},
              "token_share": {g: {r: check.share(g, ("source token at s",), r) for r in READINGS}
                              for g in GROUPS},
              "feature_chance": check.feature_chance,
              "counts": check.counts}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("edges", "own_share", "token_share", "feature_chance", "seconds")},
                     indent=1))
    print(check.frame().to_string())


if __name__ == "__main__":
    main()

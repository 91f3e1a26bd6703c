"""ALTI+ source share of shipped models' outputs: mean by output position over 500 test sentences, and
low-share flags (hallucination candidates) on clean, corrupted and out-of-domain sources.

    python scripts/source_share_study.py --checkpoint checkpoints/multi30k-de-en \
        --src ../shared/data/multi30k/test_2016_flickr.de --ood ../shared/data/wmt-news/newstest2014.de \
        --out runs/source_share_multi30k.json

Thresholds (5 % quantile of clean tokens, per word start / continuation, and of clean sentences' mean share)
are fitted on the first half of the test lines and applied to the second half, to its sources with the words
shuffled, and to --ood lines.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from workbench.analysis.attribution.source_share import (
    LowShareThresholds,
    by_position,
    output_source_shares,
    sentence_share,
)
from workbench.decoding.translator import load


def shares_of(tm, lines, beam):
    rs = tm.translate(lines, return_tokens=True, beam=beam)
    shares = output_source_shares(tm.model, [r.source_tokens for r in rs], [r.tokens for r in rs])
    return rs, shares


def summary(thr, rs, shares):
    flags = [thr.flag(s, r.pieces) for r, s in zip(rs, shares)]
    tokens = sum(len(f) - 1 for f in flags)
    flagged = sum(sum(f) for f in flags)
    return {"sentences": len(rs), "tokens": tokens, "flagged_tokens": flagged,
            "flag_rate": flagged / max(tokens, 1),
            "sentences_with_2plus_flags": sum(sum(f) >= 2 for f in flags) / len(rs),
            "sentences_flagged": sum(thr.flag_sentence(s) for s in shares) / len(rs),
            "lowest_sentences": [[round(sentence_share(s), 3), r.text] for s, r in
                                 sorted(zip(shares, rs), key=lambda p: sentence_share(p[0]))[:3]],
            "mean_source_share": float(np.mean([s[:-1].mean() for s in shares if len(s) > 1]))}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--ood", required=True)
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--example", action="append", default=[])
    args = p.parse_args()
    tm = load(args.checkpoint)
    start = time.perf_counter()
    lines = [line.strip() for line in open(args.src, encoding="utf-8")][: args.n]
    rs, shares = shares_of(tm, lines, args.beam)
    half = len(lines) // 2
    thr = LowShareThresholds.fit(shares[:half], [r.pieces for r in rs[:half]])
    rng = random.Random(0)
    shuffled = []
    for line in lines[half:]:
        words = line.split()
        rng.shuffle(words)
        shuffled.append(" ".join(words))
    ood = [line.strip() for line in open(args.ood, encoding="utf-8")][: len(lines) - half]
    out = {"checkpoint": args.checkpoint, "src": args.src, "beam": args.beam, "thresholds": str(thr),
           "threshold_start": thr.start, "threshold_continuation": thr.continuation,
           "by_position": {t: {"mean": m, "tokens": n} for t, (m, n) in by_position(shares).items()},
           "clean_held_out": summary(thr, rs[half:], shares[half:])}
    rs_s, sh_s = shares_of(tm, shuffled, args.beam)
    out["shuffled_words"] = summary(thr, rs_s, sh_s)
    rs_o, sh_o = shares_of(tm, ood, args.beam)
    out["out_of_domain"] = summary(thr, rs_o, sh_o) | {"file": args.ood}
    examples = []
    for text in args.example:
        r, s = shares_of(tm, [text], args.beam)
        f = thr.flag(s[0], r[0].pieces)
        examples.append({"source": text, "output": r[0].text, "sentence_share": sentence_share(s[0]),
                         "sentence_flagged": thr.flag_sentence(s[0]),
                         "tokens": [[piece, round(float(v), 3), flag] for piece, v, flag in zip(r[0].pieces, s[0], f)]})
    out["examples"] = examples
    out["seconds"] = time.perf_counter() - start
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1, ensure_ascii=False)
    print(json.dumps({k: v for k, v in out.items() if k not in ("by_position", "examples")}, indent=1))
    for e in examples:
        print(e["output"], [t[0] for t in e["tokens"] if t[2]])


if __name__ == "__main__":
    main()

"""Word alignments from two translation directions combined as maps (`word_align.combine_directions`): a teacher
for `scripts/train_alignment_layer.py --teacher-links`, or a dev-line grid to choose its weight.

    # the weight alpha chosen on gold lines 1-150 only (prints every alpha's AER there; writes nothing)
    python scripts/two_direction_teacher.py --checkpoint checkpoints/general-en-de --other runs/de_en_4700 \
        --other-method layer --src R/test.en --tgt R/test.de --gold R/test.talp --swap-gold --lines 1-150
    # the teacher over a training text, at the chosen alpha
    python scripts/two_direction_teacher.py --checkpoint checkpoints/general-en-de --other runs/de_en_4700 \
        --other-method layer --src runs/europarl_tok/train.en --tgt runs/europarl_tok/train.de --alpha 0.7 \
        -o runs/europarl_tok/twodir.links

`--checkpoint` translates --src into --tgt and `--other` the other way; each reads its word maps with its own
aligner (alignment.json, else the fallback; `--other-method layer` takes the other checkpoint's alignment layer),
and the pair's links are the argmax both ways of forward^alpha * backward^T^(1 - alpha) with grow-diag, EOS
dropped. With `-o` the lines are punctuation-split as `train_alignment_layer.py` splits them, so the links index
the words it trains on; with `--gold` they are read as they are (the gold indexes their whitespace words). A line
either model cannot take whole gets the first model's own links (none when it cannot take it either). `-o` is
written in chunks and resumed from its last whole chunk when the same command runs again.
docs/analysis.md §10 ("Teaching from both translation directions") has what it gave.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from workbench.analysis.alignment.alignment import format_pharaoh, read_alignments, score_alignments
from workbench.analysis.alignment.word_align import (
    aligner,
    alignment_maps,
    argmax_links,
    combine_directions,
    encode_words,
    split_punctuation,
    too_long,
)
from workbench.decoding.translator import load

ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def model_aligner(path: str, method: str | None):
    tm = load(path)
    spec, _ = aligner(tm.model, tm.alignment or None, method, directory=tm.meta.get("path"))
    return tm, spec.check(tm.model)


def maps_of(tm, spec, sources, targets):
    maps = alignment_maps(tm.model, sources, targets, method=spec.method, shift=spec.shift,
                          heads=spec.needs_heads, layer=spec.layer)
    return [m.combined(spec.units) for m in maps], maps


def pair_maps(first, other, src, tgt):
    """(forward, backward) maps of each line pair both models take whole, else None, and the first model's own
    links of every line it takes."""
    (t1, s1), (t2, s2) = first, other
    e1 = [encode_words(t1.src_tokenizer, x) for x in src]
    d1 = [encode_words(t1.tgt_tokenizer, x) for x in tgt]
    d2 = [encode_words(t2.src_tokenizer, x) for x in tgt]
    e2 = [encode_words(t2.tgt_tokenizer, x) for x in src]
    one = [k for k in range(len(src)) if e1[k].ids and d1[k].ids and not too_long(t1.model, e1[k], d1[k])]
    both = [k for k in one if d2[k].ids and e2[k].ids and not too_long(t2.model, d2[k], e2[k])]
    f, raw = maps_of(t1, s1, [e1[k] for k in one], [d1[k] for k in one])
    own = [set() for _ in src]
    forward = {}
    for k, m, r in zip(one, f, raw):
        own[k], forward[k] = s1.links_of(r), m
    b, _ = maps_of(t2, s2, [d2[k] for k in both], [e2[k] for k in both])
    pairs: list = [None] * len(src)
    for k, m in zip(both, b):
        pairs[k] = (forward[k], m)
    return pairs, own


def links_at(pairs, own, alpha: float) -> list[set]:
    return [own[k] if p is None else argmax_links(combine_directions(*p, alpha=alpha), symmetrize="grow-diag")
            for k, p in enumerate(pairs)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="the model translating --src into --tgt")
    ap.add_argument("--other", required=True, help="the model translating --tgt into --src")
    ap.add_argument("--other-method", choices=["layer"], default=None,
                    help="layer: the other checkpoint's alignment layer (default: its own aligner)")
    ap.add_argument("--src", required=True)
    ap.add_argument("--tgt", required=True)
    ap.add_argument("--alpha", type=float, default=None, help="weight of --checkpoint's map (0-1)")
    ap.add_argument("--gold", help="score every alpha against this gold file instead of writing links")
    ap.add_argument("--swap-gold", action="store_true", help="GOLD writes the --tgt word first")
    ap.add_argument("--lines", default=None, help="A-B: score (or write) only these lines, 1-based")
    ap.add_argument("-o", "--output")
    ap.add_argument("--chunk", type=int, default=500)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if (args.gold is None) == (args.output is None):
        ap.error("give --gold (choose alpha) or -o (write the teacher), one of them")
    if args.output and args.alpha is None:
        ap.error("-o needs --alpha (chosen with --gold on dev lines)")
    src = Path(args.src).read_text(encoding="utf-8").splitlines()
    tgt = Path(args.tgt).read_text(encoding="utf-8").splitlines()
    if len(src) != len(tgt):
        ap.error(f"--src has {len(src)} lines, --tgt {len(tgt)}: one per pair")
    lo, hi = 0, len(src)
    if args.lines:
        a, _, b = args.lines.partition("-")
        lo, hi = int(a) - 1, int(b)
    first, other = model_aligner(args.checkpoint, None), model_aligner(args.other, args.other_method)
    print(f"{args.checkpoint}: {first[1].label()}; {args.other}: {other[1].label()}", flush=True)
    if args.gold:
        gold = read_alignments(args.gold, base=1, swap=args.swap_gold)[lo:hi]
        pairs, own = pair_maps(first, other, src[lo:hi], tgt[lo:hi])
        print(f"lines {lo + 1}-{hi}: {args.checkpoint} alone {100 * score_alignments(own, gold).aer:.2f} %")
        for alpha in (args.alpha,) if args.alpha is not None else ALPHAS:
            print(f"alpha {alpha}: {100 * score_alignments(links_at(pairs, own, alpha), gold).aer:.2f} %")
        return 0
    out = Path(args.output)
    done = len(out.read_text(encoding="utf-8").splitlines()) if out.exists() else 0
    with out.open("a", encoding="utf-8") as fh:
        for start in range(lo + done, hi, args.chunk):
            end = min(start + args.chunk, hi)
            pairs, own = pair_maps(first, other, [split_punctuation(x) for x in src[start:end]],
                                   [split_punctuation(x) for x in tgt[start:end]])
            fh.writelines(format_pharaoh(x) + "\n" for x in links_at(pairs, own, args.alpha))
            fh.flush()
            print(f"{end - lo} of {hi - lo} lines ({sum(p is None for p in pairs)} of this chunk from "
                  f"{args.checkpoint} alone)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

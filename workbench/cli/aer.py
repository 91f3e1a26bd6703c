"""`workbench aer GOLD HYP`: alignment error rate, precision and recall of an alignment file against gold.

    workbench aer rwth-deen/test.talp hyp.txt                      # gold talp 1-based, hyp Pharaoh 0-based
    workbench aer gold.txt hyp.txt --gold-base 0 --swap-hyp        # other index bases, target-first columns

Gold: one line per sentence pair, `i-j` sure and `ipj` (or `i?j`) possible links, source word first
(the talp form of the RWTH, Hansards and WPT gold files: 1-based). Hypotheses: the same form, by default
0-based Pharaoh as `workbench align` and fast_align/awesome-align write; possible marks in a hypothesis
count as links. AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|), counts summed over the corpus (Och & Ney 2003).
The hypothesis is also scored with its columns the other way round; when that is lower by more than 10 AER
points, a one-line hint on stderr says so (the score printed stays the one asked for).
"""

from __future__ import annotations

import argparse
import json
import sys

from ..analysis.alignment.alignment import read_alignments, score_alignments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("gold", help="gold alignments (talp: 'i-j' sure, 'ipj' possible)")
    p.add_argument("hyp", help="hypothesis alignments (Pharaoh 'i-j')")
    p.add_argument("--gold-base", type=int, choices=[0, 1], default=1, help="index of the first word in GOLD (1)")
    p.add_argument("--hyp-base", type=int, choices=[0, 1], default=0, help="index of the first word in HYP (0)")
    p.add_argument("--swap-gold", action="store_true", help="GOLD writes the target word first")
    p.add_argument("--swap-hyp", action="store_true", help="HYP writes the target word first")
    p.add_argument("--lines", default=None, metavar="A-B",
                   help="score only lines A..B (1-based, inclusive), e.g. 151-508")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def line_range(spec: str | None, n: int) -> slice:
    """'A-B' (1-based, inclusive) as a slice of n lines; None: all."""
    if spec is None:
        return slice(0, n)
    parts = spec.split("-")
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or not 1 <= int(parts[0]) <= int(parts[1]) <= n:
        raise ValueError(f"--lines must be A-B with 1 <= A <= B <= {n}, got {spec!r}")
    return slice(int(parts[0]) - 1, int(parts[1]))


# A swapped reading this much lower (in AER points) is taken as the files' columns disagreeing: a correct
# alignment read the wrong way round scores 60-80 %, the same one the right way round 20-30 % (RWTH).
SWAP_HINT_MARGIN = 0.10


def run(args: argparse.Namespace) -> int:
    gold = read_alignments(args.gold, base=args.gold_base, swap=args.swap_gold)
    hyp = read_alignments(args.hyp, base=args.hyp_base, swap=args.swap_hyp)
    if len(gold) != len(hyp):
        raise ValueError(f"{args.gold} has {len(gold)} lines but {args.hyp} has {len(hyp)}: one line per sentence "
                         "pair in both")
    rows = line_range(args.lines, len(gold))
    score = score_alignments([p for _, p in hyp[rows]], gold[rows])
    # the other reading costs one more pass over the links: say so when it scores far better
    swapped = score_alignments([{(j, i) for i, j in p} for _, p in hyp[rows]], gold[rows])
    if swapped.aer < score.aer - SWAP_HINT_MARGIN:
        print(f"workbench aer: hint: with one file's columns read the other way round (toggle --swap-hyp or "
              f"--swap-gold) AER is {100 * swapped.aer:.1f} %, not {100 * score.aer:.1f} %: does one file write "
              "the target word first?", file=sys.stderr)
    if args.json:
        print(json.dumps({k: getattr(score, k) for k in score.__dataclass_fields__}))
    else:
        print(score)
    return 0

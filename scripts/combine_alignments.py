"""Combine two word alignments of the same line pairs into one (Och & Ney 2003; Koehn et al. 2003), line by line.

    python scripts/combine_alignments.py en_de.links de_en.links --swap-b --how grow-diag -o combined.links

Both files are Pharaoh lines ("i-j", 0-based), one per line pair. `--swap-b` reads the second file's pairs as
target-source, as a model of the other translation direction writes them (its source is this pair's target), so
both files then say (source word, target word) of the first file's direction. `--how`: intersect, union,
grow-diag or grow-diag-final (`word_align.symmetrize_links`). The output is what `scripts/train_alignment_layer.py
--teacher-links` reads. Prints the links per line of each input and of the result, and how much the two agree.
"""

from __future__ import annotations

import argparse
import sys

from workbench.analysis.alignment.alignment import format_pharaoh, read_alignments
from workbench.analysis.alignment.word_align import SYMMETRIZE, symmetrize_links


def combine(a: list[set], b: list[set], how: str) -> list[set]:
    if len(a) != len(b):
        raise ValueError(f"the files have {len(a)} and {len(b)} lines: one per line pair in both")
    return [symmetrize_links(x, y, how) for x, y in zip(a, b)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", help="Pharaoh links, source-target")
    ap.add_argument("b", help="Pharaoh links of the same line pairs (target-source with --swap-b)")
    ap.add_argument("--swap-b", action="store_true", help="the second file writes target-source")
    ap.add_argument("--how", default="grow-diag", choices=[h for h in SYMMETRIZE if h != "none"])
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    try:
        a = [sure for sure, _ in read_alignments(args.a)]
        b = [sure for sure, _ in read_alignments(args.b, swap=args.swap_b)]
        out = combine(a, b, args.how)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with open(args.output, "w", encoding="utf-8") as fh:
        fh.writelines(format_pharaoh(links) + "\n" for links in out)
    n = max(len(out), 1)
    both = sum(len(x & y) for x, y in zip(a, b))
    print(f"{len(out)} lines; links per line: a {sum(map(len, a)) / n:.2f}, b {sum(map(len, b)) / n:.2f}, "
          f"{args.how} {sum(map(len, out)) / n:.2f}; both agree on {both / max(sum(map(len, a)), 1):.1%} of a's")
    return 0


if __name__ == "__main__":
    sys.exit(main())

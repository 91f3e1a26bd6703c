"""`workbench graph CHECKPOINT SENTENCE --out DIR`: attribution graphs of a translation's output tokens as files
other tools read.

    workbench graph checkpoints/multi30k-de-en "Ein Hund läuft über die Wiese." --out graph_files
    workbench graph CKPT "Ein Hund läuft." --reference "A dog runs." --position 2 --target runner-up --out g
    circuit-tracer start-server --graph_file_dir graph_files     # circuit-tracer's viewer, one graph per token

`--export circuit-tracer` (the one format so far) writes circuit-tracer's graph JSON, one `SLUG-POSITION.json` per
output token, pruned as circuit-tracer prunes (`--node-threshold`, `--edge-threshold`), and indexes them in
`graph-metadata.json` (docs/analysis.md, "Graphs as files other tools read").
"""

from __future__ import annotations

import argparse
import sys

from ..analysis.attribution.graph import TARGETS
from ..analysis.attribution.graph_export import export_sentence
from ..core.protocols import print_progress
from ..decoding.translator import load


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint")
    p.add_argument("sentence", help="the source sentence")
    p.add_argument("--out", required=True, help="directory for the graph files (created)")
    p.add_argument("--export", choices=["circuit-tracer"], default="circuit-tracer", help="file format")
    p.add_argument("--reference", default=None, help="teacher-force this translation (default: the model's own)")
    p.add_argument("--position", type=int, action="append", default=None,
                   help="output token to explain, 0-based (repeat for several; default: every one)")
    p.add_argument("--target", choices=TARGETS, default="logit",
                   help="the token's logit, its difference to the runner-up, or to the mean logit")
    p.add_argument("--node-threshold", dest="node_threshold", type=float, default=0.8,
                   help="keep the fewest nodes holding this share of the influence (circuit-tracer's default)")
    p.add_argument("--edge-threshold", dest="edge_threshold", type=float, default=0.98,
                   help="keep the fewest edges holding this share of the edge influence (circuit-tracer's default)")
    p.add_argument("--slug", default=None, help="file name stem (default: from the sentence)")


def run(args: argparse.Namespace) -> int:
    tm = load(args.checkpoint)
    paths = export_sentence(tm, args.sentence, args.out, reference=args.reference, positions=args.position,
                            slug=args.slug, target=args.target, node_threshold=args.node_threshold,
                            edge_threshold=args.edge_threshold, progress=print_progress)
    print(f"{len(paths)} graph files in {args.out}; view them with: circuit-tracer start-server --graph_file_dir "
          f"{args.out}", file=sys.stderr)
    return 0

"""`workbench views TRACE.safetensors -o DIR`: write a saved trace's views as offline HTML files.

One page per view (model view, a head view per kind with every layer, the combined source+target head view,
and a heatmap per kind for the chosen layer), each self-contained: open them from disk, mail them, no server.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.heads import KINDS
from ..core.trace import Trace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", type=Path, help="a trace saved with Trace.save (safetensors)")
    parser.add_argument("-o", "--out", type=Path, required=True, help="folder for the HTML files")
    parser.add_argument("--batch", type=int, default=0, help="which sentence of the traced batch")
    parser.add_argument("--layer", type=int, default=-1, help="layer for the heatmaps (-1: the last)")
    parser.add_argument("--words", action="store_true", help="merge sub-word pieces into words")
    parser.add_argument("--min-weight", type=float, default=0.01, help="head view: hide lines below this weight")


def run(args: argparse.Namespace) -> int:
    # the chart modules load Bokeh and Altair: only when the command runs, so `workbench views --help` stays light
    from ..charts.export import save_html  # CLI: loaded when run
    from ..charts.head_view import head_view  # CLI: loaded when run
    from ..charts.heatmap import attention_heatmap  # CLI: loaded when run
    from ..charts.model_view import model_view  # CLI: loaded when run

    if not args.trace.is_file():
        raise FileNotFoundError(f"no trace file at {args.trace}")
    trace = Trace.load(args.trace)
    kinds = [k for k in KINDS if trace.layers(k)]
    if not kinds:
        raise ValueError(f"{args.trace} holds no attention probabilities (*.hook_probs)")
    args.out.mkdir(parents=True, exist_ok=True)
    pages = {"model_view": model_view(trace, kinds, batch=args.batch, words=args.words)}
    for kind in kinds:
        layer = args.layer % trace.layers(kind)
        pages[f"head_view_{kind}"] = head_view(trace, kind, batch=args.batch, words=args.words,
                                               min_weight=args.min_weight)
        pages[f"heatmap_{kind}_layer{layer}"] = attention_heatmap(trace, kind, layer, batch=args.batch,
                                                                  words=args.words)
    if set(kinds) == set(KINDS):
        pages["head_view_combined"] = head_view(trace, "combined", batch=args.batch, words=args.words,
                                                min_weight=args.min_weight)
    for name, view in pages.items():
        path = save_html(view, args.out / f"{name}.html", title=f"{name} - {args.trace.name}")
        print(f"{path}  {path.stat().st_size / 1e6:.2f} MB")
    return 0

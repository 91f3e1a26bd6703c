"""Check that each live feature's top raised output token is one the model predicts there: its clean probability,
averaged over the feature's top contexts, is at least --min-p (issue 38's check of the dashboards' ranking).

    python scripts/check_feature_effects.py checkpoints/multi30k-de-en [--sites hook_memory ...] [--sample 200]

Live: fires at least once in the dictionary's stats.safetensors. `--sample N` checks a seeded sample of N live
features per site (0: all of them). Prints one line per site and writes --out (JSON: per site the features
checked, those below --min-p with their top token, and the seconds taken).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from workbench.decoding.translator import load
from workbench.features.dashboard import FeatureData


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("--sites", nargs="*", default=None, help="dictionary folders under features/ (default: all)")
    p.add_argument("--sample", type=int, default=0)
    p.add_argument("--contexts", type=int, default=8)
    p.add_argument("--min-p", dest="min_p", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    tm = load(args.checkpoint)
    root = Path(args.checkpoint) / "features"
    sites = args.sites or sorted(d.name for d in root.iterdir() if (d / "cfg.json").is_file())
    report, bad_total = {}, 0
    for site in sites:
        fd = FeatureData.load(tm, root / site)
        live = (fd.stats.count > 0).nonzero().flatten()
        if args.sample:
            live = live[torch.randperm(live.numel(), generator=torch.Generator().manual_seed(args.seed))[: args.sample]]
        t0 = time.perf_counter()
        below = []
        for f in sorted(live.tolist()):
            tokens = fd.output_effects(f, contexts=args.contexts, heads=False)["tokens"]
            top = tokens[0] if tokens else None
            if top is None or top["p_clean"] < args.min_p:
                below.append({"feature": f, "top": top})
        seconds = time.perf_counter() - t0
        report[site] = {"checked": live.numel(), "live": int((fd.stats.count > 0).sum()), "below": below,
                        "seconds": round(seconds, 1)}
        bad_total += len(below)
        print(f"{site}: {live.numel() - len(below)}/{live.numel()} checked features raise a token with clean p >= "
              f"{args.min_p} ({seconds:.0f} s)", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"min_p": args.min_p, "contexts": args.contexts, "sample": args.sample,
                                              "sites": report}, indent=1, ensure_ascii=False) + "\n",
                                  encoding="utf-8")
    return 1 if bad_total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The Markdown table of docs/analysis.md §11 from a `workbench formation` JSON (one row per measured snapshot).

    python scripts/formation_table.py runs/formation_m30k/formation.json [--steps 50,100,...]
"""

from __future__ import annotations

import argparse
import json


def row(r: dict) -> str:
    head_aer = r["head_aer"]
    below = sum(v < r["diagonal_aer"] for layer in head_aer for v in layer)
    total = sum(len(layer) for layer in head_aer)
    by_pos = r["source_share_by_position"]
    at = " / ".join(f"{by_pos[t]:.2f}" if t < len(by_pos) else "–" for t in (0, 5, 10))
    roles = r["role_counts"]
    counts = ", ".join(str(sum(roles[kind][role] for kind in roles)) for role in ("eos", "punct", "alignment"))
    return (f"| {r['step']} | {100 * r['best_aer']:.1f} % | `{r['best_head']}` | {below} of {total} | "
            f"{r['source_share']:.3f} | {at} | {counts} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json")
    ap.add_argument("--steps", default="", help="comma-separated steps to show (default: every measured one)")
    args = ap.parse_args()
    records = sorted(json.load(open(args.json, encoding="utf-8")), key=lambda r: r["step"])
    keep = {int(s) for s in args.steps.split(",") if s}
    print("| step | best head AER | best head | heads below the diagonal | mean source share | source share at "
          "output positions 0 / 5 / 10 | roles (eos, punct, alignment) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in records:
        if not keep or r["step"] in keep:
            print(row(r))


if __name__ == "__main__":
    main()

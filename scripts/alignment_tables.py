"""Markdown AER tables from `workbench align --choose ... --report FILE.json` reports (docs/analysis.md).

    python scripts/alignment_tables.py runs/align/general-en-de.json [--symmetrize none] [--eos drop]

One row per decoder layer and head (and each layer's whole-layer map), one column per method and shift:
AER % on the held-out lines (those not used to choose), argmax per target word with the given EOS rule and
symmetrization. Then the best configuration per method and shift, as chosen on the chosen lines.
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("report")
    p.add_argument("--symmetrize", default="none")
    p.add_argument("--eos", default="drop")
    args = p.parse_args()
    r = json.load(open(args.report, encoding="utf-8"))
    configs = [c for c in r["configs"] if c["eos"] == args.eos and c["symmetrize"] == args.symmetrize]
    cols = [(c["method"], c["shift"]) for c in configs]
    units = list(configs[0]["single_held_out"])

    def name(u):
        layer, head = u.split(":")
        return f"L{layer} " + ("layer" if head == "" else f"H{head}")

    print(f"AER % on {r['held_out_lines']} held-out lines; eos {args.eos}, symmetrize {args.symmetrize}\n")
    print("| unit | " + " | ".join(f"{m} {s.upper()}" for m, s in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    best = {c: min(x["single_held_out"].values()) for c, x in zip(cols, configs)}
    for u in units:
        cells = []
        for c, x in zip(cols, configs):
            v = x["single_held_out"][u]
            cells.append(f"**{100 * v:.1f}**" if v == best[c] else f"{100 * v:.1f}")
        print(f"| {name(u)} | " + " | ".join(cells) + " |")
    print("\nChosen on the choice lines (best units averaged), per method, shift, EOS rule and symmetrization:\n")
    print("| method | shift | eos | symmetrize | units | AER chosen lines | AER held out |")
    print("|---|---|---|---|---|---:|---:|")
    for c in sorted(r["configs"], key=lambda c: c["dev_aer"]):
        units = ",".join(f"{a}" if b is None else f"{a}:{b}" for a, b in c["units"])
        print(f"| {c['method']} | {c['shift'].upper()} | {c['eos']} | {c['symmetrize']} | {units} | "
              f"{100 * c['dev_aer']:.1f} | {100 * c['held_out_aer']:.1f} |")


if __name__ == "__main__":
    main()

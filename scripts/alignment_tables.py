"""Markdown AER tables from `workbench align --choose ... --report FILE.json` reports (docs/analysis.md), and
the merge of several reports (one per `--methods`, run in parallel) into the checkpoint's alignment.json.

    python scripts/alignment_tables.py runs/align/general-{weights,norms,alti}.json [--save checkpoints/general-en-de]

Tables: one row per decoder layer and head (and each layer's whole-layer map), one column per method and
shift: AER % on the held-out lines (those not used to choose), plain argmax per target word (EOS dropped),
then the same with grow-diag symmetrization. Then every searched configuration, best first by its AER on the
chosen lines. `--save DIR`: the best configuration over all reports (by AER on the chosen lines only) becomes
DIR/alignment.json, exactly as `workbench align --choose --save` writes it for one report.
"""

from __future__ import annotations

import argparse
import json
import re

from workbench.checkpoint.format import save_alignment


def unit_name(u: str) -> str:
    layer, head = u.split(":")
    return f"L{layer} " + ("layer" if head == "" else f"H{head}")


def table(configs, sym: str, held: int) -> None:
    configs = [c for c in configs if c["eos"] == "drop" and c["symmetrize"] == sym]
    cols = [(c["method"], c["shift"]) for c in configs]
    units = list(dict.fromkeys(u for c in configs for u in c["single_held_out"]))
    units.sort(key=lambda u: (int(u.split(":")[0]), u.split(":")[1] == "", u.split(":")[1]))
    print(f"\nAER % on the {held} held-out lines; argmax per target word, EOS dropped, symmetrize {sym} "
          "(bold: the column's best)\n")
    print("| unit | " + " | ".join(f"{m} {s.upper()}" for m, s in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    best = {c: min(x["single_held_out"].values()) for c, x in zip(cols, configs)}
    for u in units:
        cells = []
        for c, x in zip(cols, configs):
            v = x["single_held_out"].get(u)
            cells.append("–" if v is None else f"**{100 * v:.1f}**" if v == best[c] else f"{100 * v:.1f}")
        print(f"| {unit_name(u)} | " + " | ".join(cells) + " |")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("reports", nargs="+")
    p.add_argument("--save", default=None, metavar="DIR")
    args = p.parse_args()
    reports = [json.load(open(f, encoding="utf-8")) for f in args.reports]
    order = {"weights": 0, "norms": 1, "alti": 2}
    configs = sorted((c for r in reports for c in r["configs"]), key=lambda c: (order[c["method"]], c["shift"]))
    held = reports[0]["held_out_lines"]
    print(f"checkpoint {reports[0]['checkpoint']}, gold {reports[0]['gold']}, chosen on {reports[0]['chosen_on']}")
    for sym in ("none", "grow-diag"):
        table(configs, sym, held)
    print("\nEvery configuration, best first by AER on the chosen lines (units: the heads/layers averaged)\n")
    print("| method | shift | eos | symmetrize | units | AER chosen lines | AER held out |")
    print("|---|---|---|---|---|---:|---:|")
    for c in sorted(configs, key=lambda c: c["dev_aer"]):
        units = ",".join(f"{a}" if b is None else f"{a}:{b}" for a, b in c["units"])
        print(f"| {c['method']} | {c['shift'].upper()} | {c['eos']} | {c['symmetrize']} | {units} | "
              f"{100 * c['dev_aer']:.1f} | {100 * c['held_out_aer']:.1f} |")
    winner = min(reports, key=lambda r: min(c["dev_aer"] for c in r["configs"]))
    chosen = json.loads(json.dumps(winner["chosen"]))
    methods = "/".join(m for r in reports for m in r.get("methods", []))
    chosen["provenance"]["searched"] = re.sub(r"^methods \S+", f"methods {methods}",
                                              chosen["provenance"]["searched"])
    if len(reports) > 1:
        chosen["provenance"]["merged_from"] = f"{len(reports)} --choose reports, one per method"
    print(f"\nchosen: {json.dumps(chosen)}")
    if args.save:
        print(f"saved {save_alignment(args.save, chosen)}")


if __name__ == "__main__":
    main()

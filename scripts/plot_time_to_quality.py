"""Draw benchmarks/results/time_to_quality_cpu.json as BLEU against wall minutes (docs/time_to_quality.png).

    .venv/bin/python scripts/plot_time_to_quality.py [--json FILE] [--out docs/time_to_quality.png]

Lines: greedy test2016 BLEU of each checkpoint (ours: every saved checkpoint, placed at the minute it was
written; reference: its own evaluations every second epoch). Points: the final score of each run (beam 5), at
the minute it was known. A rule at 40 BLEU and one at 20 minutes mark the goal (raw minutes: the goal's
20 are on a 150 GFLOP/s scale, which the JSON gives beside each run's wall time).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import altair as alt
import pandas as pd
import vl_convert as vlc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="benchmarks/results/time_to_quality_cpu.json")
    ap.add_argument("--fast", default="benchmarks/results/time_to_quality_fast_cpu.json",
                    help="a run of the fast recipe with its curve (its 'ours', and its 'ref' when the reference ran "
                         "beside it), drawn too when the file exists")
    ap.add_argument("--out", default="docs/time_to_quality.png")
    args = ap.parse_args()
    def day(res: dict) -> str:
        return res.get("meta", {}).get("date_utc", "")[:10]

    first = json.loads(Path(args.json).read_text())
    sides = [(first, "ours", f"workbench: multi30k_de_en.toml ({day(first)})"),
             (first, "ref", f"reference: ref_multi30k.py ({day(first)})")]
    if Path(args.fast).exists():  # its own reference, when it has one, replaces the other day's
        fast = json.loads(Path(args.fast).read_text())
        sides = [sides[0], (fast, "ours", f"workbench: multi30k_de_en_fast.toml ({day(fast)})")]
        sides.append((fast, "ref", f"reference: ref_multi30k.py ({day(fast)})") if "ref" in fast else
                     (first, "ref", f"reference: ref_multi30k.py ({day(first)})"))
    rows, finals = [], []
    for res, side, name in sides:
        if side not in res:
            continue
        for p in res[side]["curve"]:
            rows.append({"run": name, "minute": p["minute"], "BLEU": p["test2016_greedy"]})
        f = res[side]["final"]
        minute = res[side]["wall_min_total"] if side == "ours" else f["minute"]
        finals.append({"run": name, "minute": minute, "BLEU": f["test2016_beam5"]})
    color = alt.Color("run:N", title=None, legend=alt.Legend(orient="bottom-right", labelLimit=400))
    x = alt.X("minute:Q", title="wall minutes since launch (2 CPU cores)")
    y = alt.Y("BLEU:Q", title="test2016 BLEU (cased, sacreBLEU 13a)", scale=alt.Scale(domain=[0, 45]))
    lines = alt.Chart(pd.DataFrame(rows)).mark_line(point=True).encode(x=x, y=y, color=color)
    points = alt.Chart(pd.DataFrame(finals)).mark_point(shape="diamond", size=160, filled=True).encode(
        x=x, y=y, color=color, tooltip=["run", "minute", "BLEU"])
    labels = alt.Chart(pd.DataFrame(finals)).mark_text(dx=8, dy=-10, align="left").encode(
        x=x, y=y, text=alt.Text("BLEU:Q", format=".2f"), color=color)
    goal = alt.Chart(pd.DataFrame({"BLEU": [40.0]})).mark_rule(strokeDash=[4, 4], color="gray").encode(y="BLEU:Q")
    limit = alt.Chart(pd.DataFrame({"minute": [20.0]})).mark_rule(strokeDash=[4, 4], color="gray").encode(x="minute:Q")
    chart = (lines + points + labels + goal + limit).properties(
        width=640, height=340, title="Multi30k de→en: greedy BLEU of checkpoints (lines), final beam-5 score (◆)")
    Path(args.out).write_bytes(vlc.vegalite_to_png(chart.to_json(), scale=1.5))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Write the table of shipped dictionaries into docs/features.md from their cards (eval.json, training.json).

    python scripts/features_table.py [CHECKPOINT_DIR ...]     # default: every checkpoint with a features/ folder
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "features.md"


def rows(checkpoint: Path) -> list[str]:
    out = []
    for site in sorted((checkpoint / "features").glob("*/eval.json")):
        e = json.loads(site.read_text(encoding="utf-8"))
        t = json.loads((site.parent / "training.json").read_text(encoding="utf-8"))
        cfg = json.loads((site.parent / "cfg.json").read_text(encoding="utf-8"))
        arch = cfg["metadata"]["workbench"]["architecture"]
        tc = ("skip transcoder" if "skip" in cfg["architecture"] else "transcoder") if cfg.get("d_out") else "SAE"
        kind = f"{'TopK' if arch == 'topk' else 'ReLU'} {tc}"
        k = f", k {cfg['k']}" if "k" in cfg else ""
        bleu = (f"{e['bleu_clean']:.2f} → {e['bleu_spliced']:.2f}" if "bleu_clean" in e else "not measured")
        out.append(f"| `{checkpoint.name}` | [`{e['site']}`]({site.parent.relative_to(ROOT)}/README.md) | {kind}, "
                   f"{cfg['d_sae']} features{k} | {e['fvu']:.3f} | {e['l0']:.1f} | {e['dead_frac']:.1%} | "
                   f"{e['ce_recovered']:.1%} | {bleu} | {t['activations']:,} | {t['train_seconds'] / 60:.0f} min / "
                   f"{t.get('train_cpu_seconds', float('nan')) / 60:.1f} CPU-min |")
    return out


def main(argv: list[str]) -> int:
    checkpoints = [Path(a) for a in argv] or sorted(p.parent for p in (ROOT / "checkpoints").glob("*/features"))
    lines = ["| checkpoint | site | dictionary | FVU | L0 | dead | CE recovered | test2016 BLEU clean → spliced | "
             "activations | training wall / CPU |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in checkpoints:
        lines += rows(c)
    table = "\n".join(lines)
    text = DOC.read_text(encoding="utf-8")
    new = re.sub(r"<!-- features-table -->.*<!-- /features-table -->",
                 lambda _m: f"<!-- features-table -->\n{table}\n<!-- /features-table -->", text, flags=re.S)
    DOC.write_text(new, encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Write the tables of shipped dictionaries from their cards (eval.json, training.json, cfg.json): the full one into
docs/features.md, the one beside its baselines into README.md, each between its markers.

    python scripts/features_table.py            # rewrite both (every checkpoint with a features/ folder)
    python scripts/features_table.py --check    # exit 1 when a file's table differs from the cards
    python scripts/features_table.py --print-readme   # rewrite docs/features.md only; print README's table

tests/features/test_features_baselines.py checks that both files hold what the cards say.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from workbench.features.dictionary import ARCHITECTURE_NAMES, THRESHOLDED

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "features.md"
README = ROOT / "README.md"
MARK = "features-table"


def _cards(checkpoint: Path):
    for site in sorted((checkpoint / "features").glob("*/eval.json")):
        e = json.loads(site.read_text(encoding="utf-8"))
        t = json.loads((site.parent / "training.json").read_text(encoding="utf-8"))
        cfg = json.loads((site.parent / "cfg.json").read_text(encoding="utf-8"))
        arch = cfg["metadata"]["workbench"]["architecture"]
        tc = ("skip transcoder" if "skip" in cfg["architecture"] else "transcoder") if cfg.get("d_out") else "SAE"
        k = f", k {cfg['k']}" if "k" in cfg else ""
        if arch in THRESHOLDED:
            k = f", k {cfg['metadata']['workbench'].get('k')}" if arch == "batchtopk" else ""
        kind = f"{ARCHITECTURE_NAMES.get(arch, arch)} {tc}, {cfg['d_sae']} features{k}"
        if t.get("finetuned_from"):
            kind += ", KL + CE fine-tuned" if t.get("config", {}).get("finetune_ce") else ", KL fine-tuned"
        yield site.parent, e, t, kind


def doc_rows(checkpoint: Path) -> list[str]:
    out = []
    for site, e, t, kind in _cards(checkpoint):
        bleu = (f"{e['bleu_clean']:.2f} → {e['bleu_spliced']:.2f}" if "bleu_clean" in e else "not measured")
        dense = f"{e['dense_frac']:.1%}" if "dense_frac" in e else "–"
        counted = f"{e['density_tokens']:,}" if "density_tokens" in e else f"{e['tokens']:,}"
        delta = f"{e['delta_ce']:.4f}" if "delta_ce" in e else "–"
        out.append(f"| `{checkpoint.name}` | [`{e['site']}`]({site.relative_to(ROOT)}/README.md) | {kind} | "
                   f"{e['fvu']:.3f} | {e['l0']:.1f} | {delta} | {e['dead_frac']:.1%} | {dense} | {counted} | "
                   f"{e['ce_recovered']:.1%} | {bleu} | {_training_cost(t)} |")
    return out


def _training_cost(t: dict) -> str:
    """Activations and wall / CPU minutes; a fine-tuned dictionary's include its start's training (all stages)."""
    runs = [t]
    while runs[-1].get("finetuned_from", {}).get("training"):  # a fine-tune of a fine-tune: every stage
        runs.append(runs[-1]["finetuned_from"]["training"])
    acts, wall = sum(r["activations"] for r in runs), sum(r["train_seconds"] for r in runs)
    cpu = sum(r.get("train_cpu_seconds", float("nan")) for r in runs)
    return f"{acts:,} | {wall / 60:.0f} min / {cpu / 60:.1f} CPU-min"


def readme_rows(checkpoint: Path) -> list[str]:
    out = []
    for site, e, _t, kind in _cards(checkpoint):
        b = e.get("baselines", {})
        pca, rnd = b.get("pca"), b.get("random")
        fvu = " / ".join(f"{x['fvu']:.3f}" if x else "–" for x in (e, pca, rnd))
        dce = " / ".join(f"{x['delta_ce']:.4f}" if x and "delta_ce" in x else "–" for x in (e, pca, rnd))
        ffn = f" (FFN: {b['ffn_neurons']['l0']:.1f} neurons)" if "ffn_neurons" in b else ""
        mean = f"{e['ce_recovered_mean']:.1%}" if "ce_recovered_mean" in e else "–"
        spread = (e.get("seeds") or {}).get("spread") or {}
        seeds = (f"{spread['delta_ce']['mean']:.4f} ± {spread['delta_ce']['sd']:.4f} ({e['seeds']['count']})"
                 if "delta_ce" in spread else "one seed")
        out.append(f"| [`{e['site']}`]({site.relative_to(ROOT)}/README.md) | {kind} | {e['l0']:.0f}{ffn} | {fvu} | "
                   f"{dce} | {seeds} | {e['ce_recovered']:.1%} / {mean} |")
    return out


def tables(checkpoints: list[Path]) -> dict[Path, str]:
    doc = ["| checkpoint | site | dictionary | FVU | L0 | ΔCE (nats) | dead | dense (> 10 %) | counted on (tokens) | "
           "CE recovered | test2016 BLEU clean → spliced | activations | training wall / CPU |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    readme = ["| site | dictionary | L0 | FVU: dictionary / PCA / random | ΔCE nats: dictionary / PCA / random | "
              "ΔCE over seeds: mean ± s.d. (seeds) | CE recovered vs zero / mean ablation |",
              "|---|---|---|---|---|---|---|"]
    for c in checkpoints:
        doc += doc_rows(c)
        readme += [r.replace("| [`", f"| `{c.name}`: [`", 1) if len(checkpoints) > 1 else r for r in readme_rows(c)]
    return {DOC: "\n".join(doc), README: "\n".join(readme)}


def between_markers(text: str) -> str | None:
    m = re.search(rf"<!-- {MARK} -->\n?(.*?)\n?<!-- /{MARK} -->", text, flags=re.S)
    return m[1] if m else None


def main(argv: list[str]) -> int:
    check = "--check" in argv
    print_readme = "--print-readme" in argv
    args = [a for a in argv if a not in ("--check", "--print-readme")]
    checkpoints = [Path(a).resolve() for a in args] or sorted(p.parent for p in (ROOT / "checkpoints").glob(
        "*/features"))
    bad = 0
    for path, table in tables(checkpoints).items():
        text = path.read_text(encoding="utf-8")
        if between_markers(text) is None:
            sys.exit(f"{path}: no <!-- {MARK} --> ... <!-- /{MARK} --> markers")
        if check:
            if between_markers(text) != table:
                print(f"{path.relative_to(ROOT)}: the table differs from the cards (run scripts/features_table.py)")
                bad = 1
            continue
        if print_readme and path == README:
            print(f"{path.relative_to(ROOT)} (not written; between its {MARK} markers):\n{table}\n")
            continue
        block = f"<!-- {MARK} -->\n{table}\n<!-- /{MARK} -->"
        new = re.sub(rf"<!-- {MARK} -->.*?<!-- /{MARK} -->", lambda _m, b=block: b, text, flags=re.S)
        path.write_text(new, encoding="utf-8")
        print(f"{path.relative_to(ROOT)}:\n{table}\n")
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

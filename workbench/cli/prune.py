"""`workbench prune`: BLEU and chrF as heads are removed in order of importance, per attention kind.

    workbench prune CHECKPOINT --dataset multi30k --split test --limit 500 --out prune/
    workbench prune CHECKPOINT --src test.de --ref test.en --kinds enc_self --steps 0,4,8,12,16

Writes pruning.csv (one row per kind and heads removed), pruning.json (the same, the importance table, the
baseline, the test set and the time taken) and pruning.html (the curves); prints, per kind, how many heads go
at <= --max-loss BLEU (`workbench.analysis.circuits.pruning` says how importance is measured and what is reused).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..analysis.circuits.pruning import pruning_curve
from ..core.heads import KINDS
from .heads import add_corpus_arguments, read_corpus


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_corpus_arguments(p)
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated attention kinds ({', '.join(KINDS)})")
    p.add_argument("--steps", default=None, help="comma-separated numbers of heads removed (default: 0 to all)")
    p.add_argument("--max-loss", type=float, default=0.5, help="BLEU loss allowed when counting removable heads")
    p.add_argument("--out", default="prune", help="output directory")


def _ints(text: str | None, what: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from ..charts import save_html  # CLI: loaded when run
    from ..charts.evidence import pruning_chart  # CLI: loaded when run

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown kinds {bad}; known: {', '.join(KINDS)}")
    steps = _ints(args.steps, "--steps")
    tm, pairs, _, refs, src_path = read_corpus(args)
    start = time.perf_counter()
    curve = pruning_curve(tm.model, [s for s, _ in pairs], [t for _, t in pairs], detokenize=tm.detokenize,
                          references=refs, kinds=kinds, steps=steps, batch_size=args.batch)
    seconds = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    curve.table.to_csv(out / "pruning.csv", index=False)
    removable = {k: dict(zip(("heads", "share"), curve.removable(k, args.max_loss))) for k in kinds}
    (out / "pruning.json").write_text(json.dumps({
        "checkpoint": str(args.checkpoint), "source": str(src_path), "limit": args.limit,
        "sentences": curve.sentences, "decoding": "greedy", "seconds": round(seconds, 1),
        "baseline": curve.baseline, "max_loss": args.max_loss, "removable": removable,
        "curve": curve.table.to_dict(orient="records"),
        "importance": curve.importance[["head_id", "kind", "layer", "head_index", "d_ref_log_prob"]]
                                      .to_dict(orient="records"),
    }, indent=1), encoding="utf-8")
    save_html(pruning_chart(curve.table), out / "pruning.html", title="Pruning curve")
    print(f"{curve.sentences} sentences of {src_path}, greedy; unpruned BLEU {curve.baseline['bleu']:.2f} chrF "
          f"{curve.baseline['chrf']:.2f}; {seconds:.0f} s -> {out / 'pruning.csv'}, {out / 'pruning.html'}")
    for kind, r in removable.items():
        print(f"  {kind}: {r['heads']} of {int(curve.table[curve.table['kind'] == kind]['total'].iloc[0])} heads "
              f"removable at <= {args.max_loss} BLEU loss ({r['share']:.0%})")
    return 0

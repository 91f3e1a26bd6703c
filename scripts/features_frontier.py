"""Sweep dictionary architectures and L0 on a few sites and draw the frontier (FVU and ΔCE against L0) beside PCA.

    python scripts/features_frontier.py                                   # the sweep, resumable: finished runs skip
    python scripts/features_frontier.py --plot-only                       # redraw the figure, print the table

Every run trains on the site's activations over Multi30k train, read once into memory (`CachedActivations`), for
`--activations` rows (a few minutes on one core), and is then measured on Multi30k valid with teacher forcing:
FVU, L0, ΔCE (spliced minus clean cross-entropy per target token, nats) and dead/dense shares counted on the valid
split's tokens (the shipped cards count them on 200k training tokens: `workbench features eval`). PCA with as many
components as each target L0 is fit on the first `--pca-rows` rows of the training cache (not the valid split)
and measured the same way. Results go to `--out` (JSON, rewritten after every run) and `--png` (Altair + vl-convert).
A run killed part-way resumes from its state in `--runs`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from workbench import load
from workbench.corpus.data import ParallelData, load_dataset
from workbench.features.baselines import Moments, PCABaseline
from workbench.features.sites import resolve_site, site_rows, splice_hooks
from workbench.features.stats import DENSE
from workbench.features.train import CachedActivations, FeatureTrainConfig, FeatureTrainer

ROOT = Path(__file__).resolve().parents[1]


@torch.no_grad()
def measure(tm, data: ParallelData, site, fn, *, encode=None, n_codes: int = 0, clean_ce: float | None = None,
            max_tokens: int = 4096) -> dict:
    """FVU, L0, dead/dense shares (on these tokens) and spliced CE of `fn` (site input rows -> site output rows)."""
    model = tm.model.eval()
    err2 = s2 = 0.0
    s1 = None
    rows = active = 0
    fired = torch.zeros(n_codes, dtype=torch.long)
    nll = ntok = 0
    for idx in data.batches(max_tokens, shuffle=False):
        batch = data.collate(idx, model.cfg).to(model.device)
        x, y = site_rows(model, batch, site)
        target = x if y is None else y
        err2 += float((target - (target if fn is None else fn(x))).double().pow(2).sum())
        s1 = target.double().sum(0) if s1 is None else s1 + target.double().sum(0)
        s2 += float(target.double().pow(2).sum())
        rows += x.size(0)
        if encode is not None:
            nz = encode(x) != 0
            active += int(nz.sum())
            fired += nz.sum(0)
        with model.hooks(splice_hooks(site, fn) if fn is not None else []):
            logits = model(batch.src, batch.tgt_in)
        mask = batch.tgt_out != model.cfg.pad_id
        nll += float(torch.nn.functional.cross_entropy(logits[mask].float(), batch.tgt_out[mask], reduction="sum"))
        ntok += int(mask.sum())
    ce = nll / ntok
    out = {"fvu": err2 / (s2 - float((s1 * s1).sum()) / rows), "ce": ce, "tokens": rows}
    if clean_ce is not None:
        out["delta_ce"] = ce - clean_ce
    if encode is not None:
        out |= {"l0": active / rows, "dead_frac": float((fired == 0).double().mean()),
                "dense_frac": float((fired.double() / rows > DENSE).double().mean()), "counted_tokens": rows}
    return out


def plot(results: dict, png: Path) -> None:
    import altair as alt
    import pandas as pd
    import vl_convert as vlc

    rows = []
    for site, r in results["sites"].items():
        for k, p in r["pca"].items():
            rows.append({"site": site, "method": "PCA (L0 components)", "target L0": int(k), "L0": p["l0"],
                         "FVU": p["fvu"], "ΔCE (nats)": p["delta_ce"]})
        for run in r["runs"].values():
            rows.append({"site": site, "method": run["architecture"], "target L0": run["k"], "L0": run["l0"],
                         "FVU": run["fvu"], "ΔCE (nats)": run["delta_ce"]})
    df = pd.DataFrame(rows)
    per_site = []
    for site in df["site"].unique():
        sub = df[df["site"] == site]
        pair = []
        for metric in ("FVU", "ΔCE (nats)"):
            pair.append(alt.Chart(sub, title=f"{site}: {metric} against L0").mark_line(point=True).encode(
                x=alt.X("L0:Q", scale=alt.Scale(type="log", base=2), title="L0 (features active per token)"),
                y=alt.Y(f"{metric}:Q", scale=alt.Scale(type="log"), title=metric),
                color=alt.Color("method:N", title="dictionary"), tooltip=list(sub.columns),
            ).properties(width=300, height=210))
        per_site.append(alt.hconcat(*pair))
    chart = alt.vconcat(*per_site)
    png.write_bytes(vlc.vegalite_to_png(chart.to_json(), scale=1.5))


def table(results: dict) -> str:
    """The frontier as a markdown table: per site and L0, each architecture's FVU / ΔCE beside PCA's."""
    lines = ["| site | L0 | PCA: FVU / ΔCE | " + " | ".join(f"{a}: FVU / ΔCE (L0)" for a in ARCHS) + " |",
             "|---|---|---|" + "---|" * len(ARCHS)]
    for site, r in results["sites"].items():
        for k in sorted(r["pca"], key=int):
            p = r["pca"][k]
            cells = []
            for a in ARCHS:
                run = r["runs"].get(f"{a}_k{k}")
                cells.append(f"{run['fvu']:.3f} / {run['delta_ce']:.3f} ({run['l0']:.1f})" if run else "–")
            lines.append(f"| `{site}` | {k} | {p['fvu']:.3f} / {p['delta_ce']:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


ARCHS = ("topk", "batchtopk", "jumprelu")


def card_frontier(tm, valid, card: Path, points: list[Path]) -> None:
    """Measure `points` (other dictionaries of the card's site) on the valid split and write them, with the card's own
    dictionary, as the card's frontier (eval.json's `frontier`, drawn beside the FFN's neurons by `write_card`)."""
    from workbench.features import SparseDictionary, site_of
    from workbench.features.evaluate import write_card

    result = json.loads((card / "eval.json").read_text(encoding="utf-8"))
    rows = []
    for path in points:
        d = SparseDictionary.load(path)
        site = site_of(d)
        clean = measure(tm, valid, site, None)["ce"]
        m = measure(tm, valid, site, d, encode=d.encode, n_codes=d.cfg.d_sae, clean_ce=clean)
        t = json.loads((path / "training.json").read_text(encoding="utf-8")) if (path / "training.json").is_file() \
            else {}
        c = t.get("config", {})
        name = (f"{d.cfg.architecture} {'skip ' if d.cfg.skip else ''}transcoder, {d.cfg.d_sae} features, k {d.cfg.k}"
                + (", Fisher-weighted" if c.get("fisher") else "")
                + (f", dense cap {c['dense_cap']:g}" if c.get("dense_cap") else "")
                + (f", rare floor {c['rare_floor']:g} x {c['rare_rate']:g}" if c.get("rare_floor") else "")
                + (f", AuxK {c['k_aux']} x {c['aux_coef']:g}" if c.get("k_aux") else "")
                + f", {t.get('activations', 0):,} activations")
        rows.append({"name": name, "l0": m["l0"], "fvu": m["fvu"], "delta_ce": m["delta_ce"],
                     "dead_frac": m["dead_frac"], "dense_frac": m["dense_frac"],
                     "measured_on": f"{result['split']}, {m['tokens']:,} tokens (dead/dense too)"})
        print(rows[-1], flush=True)
    rows.append({"name": "this card's dictionary", "l0": result["l0"], "fvu": result["fvu"],
                 "delta_ce": result["delta_ce"], "dead_frac": result["dead_frac"], "dense_frac": result["dense_frac"],
                 "measured_on": f"{result['split']}; dead/dense on {result['density_tokens']:,} tokens"})
    result["frontier"] = {"points": sorted(rows, key=lambda r: r["l0"]),
                          "note": "Other trainings of this site (`scripts/features_frontier.py --card-frontier`), "
                                  "each measured on the evaluation split with teacher forcing."}
    write_card(card, result)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "multi30k-de-en"))
    p.add_argument("--sites", nargs="+", default=["hook_memory", "dec.1.cross_attn.hook_out"])
    p.add_argument("--architectures", nargs="+", default=["topk", "batchtopk", "jumprelu"])
    p.add_argument("--l0", nargs="+", type=int, default=[8, 16, 32])
    p.add_argument("--d-sae", dest="d_sae", type=int, default=2048)
    p.add_argument("--activations", type=int, default=1_200_000)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--pca-rows", dest="pca_rows", type=int, default=200_000)
    p.add_argument("--valid-limit", dest="valid_limit", type=int, default=0,
                   help="measure on the first N sentences of Multi30k valid (0: all 1014)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", default=str(ROOT / "runs" / "frontier"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "features_frontier.json"))
    p.add_argument("--png", default=str(ROOT / "docs" / "features_frontier.png"))
    p.add_argument("--plot-only", dest="plot_only", action="store_true")
    p.add_argument("--card-frontier", dest="card_frontier", default=None,
                   help="a dictionary card directory: measure --points and write them into it as its frontier")
    p.add_argument("--points", nargs="*", default=[])
    args = p.parse_args()
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.is_file() else {"sites": {}}
    if args.plot_only:
        plot(results, Path(args.png))
        print(table(results))
        return
    torch.set_num_threads(args.threads)
    tm = load(args.checkpoint)
    src_lang, tgt_lang = tm.meta.get("src_lang", "de"), tm.meta.get("tgt_lang", "en")

    def encoded(split, limit=0):
        s, t = load_dataset("multi30k", split, src_lang, tgt_lang, limit=limit)
        return ParallelData.encode(s, t, tm.src_tokenizer, tm.tgt_tokenizer, max_len=tm.model.cfg.max_positions - 1)

    if args.card_frontier:
        card_frontier(tm, encoded("valid", args.valid_limit), Path(args.card_frontier), [Path(p) for p in args.points])
        return
    train, valid = encoded("train"), encoded("valid", args.valid_limit)
    results |= {"checkpoint": Path(args.checkpoint).name, "d_sae": args.d_sae, "activations": args.activations,
                "lr": args.lr,
                "eval_split": f"multi30k:valid[:{args.valid_limit}]" if args.valid_limit else "multi30k:valid",
                "pca_fit": f"first {args.pca_rows} rows of the "
                "training cache (multi30k:train, corpus order)", "threads": args.threads,
                "note": "dead/dense counted on the valid split's tokens; ΔCE: teacher-forced, nats per target token"}

    def save() -> None:
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
        os.replace(tmp, out)

    for site_name in args.sites:
        site = resolve_site(tm.model, site_name)
        r = results["sites"].setdefault(site_name, {"pca": {}, "runs": {}})
        t = time.time()
        cache = CachedActivations.read(tm.model, train, site)
        print(f"{site_name}: {cache.rows.size(0):,} cached rows in {time.time() - t:.0f} s", flush=True)
        if "clean_ce" not in r:
            r["clean_ce"] = measure(tm, valid, site, None)["ce"]
        if any(str(k) not in r["pca"] for k in args.l0):
            m = Moments(tm.model.cfg.d_model, tm.model.cfg.d_model if site.transcoder else None)
            fit = cache.rows[: args.pca_rows]
            d = tm.model.cfg.d_model
            m.update(fit[:, :d], fit[:, d:] if site.transcoder else None)
            for k in args.l0:
                pca = PCABaseline.fit(m, k)
                r["pca"][str(k)] = measure(tm, valid, site, pca, clean_ce=r["clean_ce"]) | {"l0": float(k)}
                print(f"  PCA-{k}: FVU {r['pca'][str(k)]['fvu']:.4f}  ΔCE {r['pca'][str(k)]['delta_ce']:.4f}",
                      flush=True)
            save()
        for k in sorted(args.l0, key=lambda k: (k != 16, k)):  # L0 16 first: the shipped dictionaries' choice
            for arch in args.architectures:
                name = f"{arch}_k{k}"
                if name in r["runs"]:
                    continue
                cfg = FeatureTrainConfig(checkpoint=args.checkpoint, site=site_name,
                                         out_dir=str(Path(args.runs) / site_name / name), architecture=arch,
                                         d_sae=args.d_sae, k=k, activations=args.activations, lr=args.lr,
                                         warmup=min(50, args.activations // 4096 // 5),
                                         dead_after=200_000, log_every=100, progress="plain", threads=args.threads,
                                         cache=True, extra={"command": "scripts/features_frontier.py"})
                trainer = FeatureTrainer(cfg, translation_model=tm, data=train, cache=cache)
                d = trainer.fit().eval()
                if trainer.interrupted:
                    return
                with torch.no_grad():
                    m = measure(tm, valid, site, d, encode=d.encode, n_codes=d.cfg.d_sae, clean_ce=r["clean_ce"])
                r["runs"][name] = m | {"architecture": arch, "k": k, "d_sae": args.d_sae,
                                       "train_seconds": round(trainer.elapsed, 1),
                                       "train_cpu_seconds": round(trainer.cpu, 1), "steps": trainer.step}
                print(f"  {name}: FVU {m['fvu']:.4f}  L0 {m['l0']:.1f}  ΔCE {m['delta_ce']:.4f}  dead "
                      f"{m['dead_frac']:.1%}  dense {m['dense_frac']:.1%}  ({trainer.elapsed:.0f} s)", flush=True)
                save()
    plot(results, Path(args.png))
    print(table(results))


if __name__ == "__main__":
    main()

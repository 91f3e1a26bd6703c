"""Patching speed on the shipped de->en model: a full head x position sweep, batched vs one site at a time,
and attribution patching vs real patching (time and rank agreement).

    .venv/bin/python benchmarks/bench_why.py [--device cpu|cuda] [--pairs 20] [--out benchmarks/results/why_cpu.json]

The clean/corrupted pair swaps one source noun (workbench.analysis.circuits.contrast.noun_swaps) in a Multi30k test2016
sentence of 20 source tokens (EOS included); the metric is the logit difference between the clean and the
corrupted output token at the first position where the two greedy translations differ. All in one run:
  - sweep, batched:   patching_sweep(sites="head"), every head of all three kinds x every query position
  - one at a time:    the same sites through `patch_effect` (the old API: clean, donor and patched runs per
                      site, 4 forwards), and through patching_sweep(batch_size=1) (cached clean/corrupted
                      runs, one forward per site)
  - attribution patching on the same sites, and its Spearman correlation with the real sweep's effects
Then, over --pairs sentence pairs, the Spearman correlation of attribution patching with real patching for
the head, resid_enc, resid_dec and cross_kv families (effects = patched metric - clean metric, noising, over
the sites where either is non-zero), and the mean
per-step Spearman agreement of six source attributions of the clean output (attention, saliency, input x
gradient, integrated gradients, occlusion, memory patching: workbench.analysis.attribution.attribute).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from workbench import load
from workbench.analysis import (
    attribution_agreement,
    attribution_patching,
    logit_diff,
    patch_effect,
    patching_sweep,
    spearman,
)
from workbench.analysis.circuits.contrast import noun_swaps
from workbench.corpus.data import dataset_files

ROOT = Path(__file__).resolve().parents[1]


def timed(fn, repeats: int = 1):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times), out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def effects(res) -> np.ndarray:
    v = res.values.numpy()
    return (v[~np.isnan(v)] - res.clean_metric).ravel()


def agreement(est, real) -> tuple[float, int]:
    """Spearman of estimated and real effects over the sites where either is non-zero: sites that cannot
    matter (the decoder after the measured position, an unchanged target embedding) would tie at exactly 0
    in both and inflate the correlation."""
    e, r = effects(est), effects(real)
    keep = (np.abs(e) > 1e-6) | (np.abs(r) > 1e-6)
    return float(spearman(e[keep], r[keep])), int(keep.sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "multi30k-de-en"))
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--length", type=int, default=20, help="source tokens of the timed sentence (EOS included)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--ig-steps", type=int, default=None, help="midpoint steps (default: the adaptive rule)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tm = load(args.checkpoint, device=args.device)
    model = tm.model.eval()
    de, _ = dataset_files("multi30k", "test", "de", "en", download=False)
    lines = Path(de).read_text(encoding="utf-8").splitlines()
    exact = [t for t in lines if len(tm.encode_source(t)[0]) == args.length]
    timed_pair = noun_swaps(tm, exact, max_pairs=1)[0]
    p = timed_pair
    metric = logit_diff(p.position, p.good, p.bad)
    kw = dict(corrupted_src=p.corrupted_src, sites="head", metric=metric)
    patching_sweep(model, p.src, p.tgt, batch_size=args.batch, **kw)  # warm-up
    t_batched, batched = timed(lambda: patching_sweep(model, p.src, p.tgt, batch_size=args.batch, **kw), 3)
    t_single, single = timed(lambda: patching_sweep(model, p.src, p.tgt, batch_size=1, **kw))
    n_sites = int((~batched.values.isnan()).sum())

    def old_loop():
        out = []
        for r, row in enumerate(batched.rows):
            kind, layer, head = row.split(":")
            block = {"enc_self": "enc.{}.self_attn", "dec_self": "dec.{}.self_attn",
                     "cross": "dec.{}.cross_attn"}[kind].format(layer)
            for col in range(batched.values.size(1)):
                if np.isnan(batched.values[r, col].item()):
                    continue
                lp = patch_effect(model, f"{block}.hook_result", p.src, p.tgt, p.corrupted_src, p.tgt,
                                  positions=[col], heads=[int(head)])["patched"]
                out.append(float(metric(lp)[0]))  # log-softmax shifts both logits equally: same difference
        return out

    t_old, old_vals = timed(old_loop)
    t_atp, atp = timed(lambda: attribution_patching(model, p.src, p.tgt, **kw), 3)
    agree = np.abs(np.array(old_vals) - batched.values[~batched.values.isnan()].numpy()).max()
    rho_timed, n_rho = agreement(atp, batched)

    log(f"timed sweep done: {t_batched:.2f} s batched, {t_single:.2f} s cached one at a time, {t_old:.2f} s "
        f"patch_effect loop, {t_atp:.3f} s attribution patching")
    pairs = noun_swaps(tm, lines, max_pairs=args.pairs)
    log(f"{len(pairs)} pairs")
    per_family: dict[str, list[float]] = {"head": [], "resid_enc": [], "resid_dec": [], "cross_kv": []}
    sites_used: dict[str, list[int]] = {k: [] for k in per_family}
    for q in pairs:
        m = logit_diff(q.position, q.good, q.bad)
        for fam in per_family:
            real = patching_sweep(model, q.src, q.tgt, corrupted_src=q.corrupted_src, sites=fam, metric=m,
                                  batch_size=args.batch)
            est = attribution_patching(model, q.src, q.tgt, corrupted_src=q.corrupted_src, sites=fam, metric=m)
            rho, used = agreement(est, real)
            per_family[fam].append(rho)
            sites_used[fam].append(used)
    eos = torch.full((1, 1), model.cfg.eos_id, device=model.device)
    t0 = time.perf_counter()
    table = attribution_agreement(model, [(q.src, q.tgt, torch.cat([q.tgt[:, 1:], eos], 1)) for q in pairs],
                                  steps=args.ig_steps)
    log(f"attribution agreement: {time.perf_counter() - t0:.1f} s")
    print(table.round(3).to_string())
    result = {
        "device": str(model.device), "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(), "checkpoint": Path(args.checkpoint).name,
        "sentence": p.text, "corrupted": p.corrupted_text, "source_tokens": int(p.src.size(1)),
        "target_tokens": int(p.tgt.size(1)), "sites": n_sites, "rows": len(batched.rows),
        "sweep_batched": {"seconds": t_batched, "forward_passes": batched.forward_passes, "batch": args.batch},
        "sweep_one_at_a_time_cached": {"seconds": t_single, "forward_passes": single.forward_passes},
        "patch_effect_loop": {"seconds": t_old, "forward_passes": 4 * n_sites, "max_abs_diff_vs_sweep": float(agree)},
        "attribution_patching": {"seconds": t_atp, "forward_passes": 2, "backward_passes": 1,
                                 "spearman_vs_sweep": rho_timed, "spearman_sites": n_rho},
        "speedup_batched_vs_patch_effect_loop": t_old / t_batched,
        "speedup_batched_vs_cached_one_at_a_time": t_single / t_batched,
        "speedup_attribution_vs_batched_sweep": t_batched / t_atp,
        "speedup_attribution_vs_patch_effect_loop": t_old / t_atp,
        "agreement_over_pairs": {fam: {"pairs": len(v), "median_spearman": statistics.median(v),
                                       "mean_spearman": statistics.fmean(v), "min_spearman": min(v),
                                       "mean_sites_compared": statistics.fmean(sites_used[fam])}
                                 for fam, v in per_family.items() if v},
        "attribution_agreement": {"sentences": table.attrs["sentences"], "steps": table.attrs["steps"],
                                  "ig_steps": args.ig_steps, "mean_step_spearman": table.round(4).to_dict()},
    }
    print(json.dumps(result, indent=2))
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"why_{model.device.type}.json")
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Dictionary training throughput: the workbench's trainer next to a plain PyTorch loop on cached activations.

    .venv/bin/python benchmarks/bench_features.py [--site hook_memory] [--architecture topk] [--steps 40] [--out F]

The same TopK dictionary (d_sae, k, Adam, the same normalised-MSE loss, unit-norm decoder rows) is trained, in one
process, three ways, each for --steps steps of --batch activations, after one warm-up step:
  - plain:            activations of the site collected once from the corpus into one tensor (the cache), then a
                      textbook loop: random batches from the cache, `SparseDictionary.forward` (dense encoder,
                      torch.topk, scatter, dense decoder), autograd, Adam. This is the loop one writes by hand, and
                      what SAELens's TopK training does (dense activations, decoder by matmul).
  - streaming:        `FeatureTrainer` with the real `ActivationStream`: the model runs on the corpus as training
                      goes (teacher forcing, stopped at the site), rows pass through the shuffle buffer, and the
                      step uses the k-sparse backward (`training_forward`). The model's forward passes are counted
                      in its time; the initial buffer fill (one cycle's worth of reading) is excluded from both
                      rates and reported apart.
  - sparse on cache:  the workbench's step on the cached activations, to split the ratio into its two causes.
  - cached trainer:   `FeatureTrainer` with `cache=True`'s stream (`CachedStream`: a permutation of the cache per
                      epoch) and its step: what `workbench features train --cache` runs, on the same cache.
--architecture batchtopk / jumprelu trains those instead; the plain loop is then the textbook dense form
(BatchTopK: torch.topk over the flattened (B, d_sae) ReLU activations; JumpReLU: dense straight-through JumpReLU and
L0 penalty, as SAELens's training classes), the workbench's the sparse path over each row's 4k largest.
Rates are activations per second of wall-clock time and per second of the process's CPU time (one thread: the
work done, less disturbed when other jobs share the cores); the runs alternate (--repeats) and the medians are
reported with the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from workbench import load
from workbench.corpus.data import ParallelData, load_dataset
from workbench.features import SparseDictionary, site_rows
from workbench.features.dictionary import _JumpReLU, _Step  # the workbench's STE functions (tested against SAELens)
from workbench.features.train import CachedActivations, FeatureTrainConfig, FeatureTrainer

ROOT = Path(__file__).resolve().parents[1]


def normalized_mse(target: torch.Tensor, recon: torch.Tensor) -> torch.Tensor:
    return (target - recon).pow(2).sum() / (target - target.mean(0)).pow(2).sum()


def dense_forward(d: SparseDictionary, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook dense training forward of each architecture: (reconstruction, sparsity term)."""
    arch, k = d.cfg.architecture, d.cfg.k
    if arch == "topk":
        return d(x), torch.zeros(())
    pre = d.pre_activations(x)
    if arch == "batchtopk":
        acts = pre.relu().flatten()
        top = acts.topk(k * x.size(0))
        feats = torch.zeros_like(acts).scatter(-1, top.indices, top.values).view_as(pre)
        return d.decode(feats), torch.zeros(())
    feats = _JumpReLU.apply(pre, d.threshold, 0.05)
    return d.decode(feats), _Step.apply(pre, d.threshold, 0.05).sum(-1).mean() / k


def plain_loop(d: SparseDictionary, cache: torch.Tensor, steps: int, batch: int, lr: float) -> float:
    opt = torch.optim.Adam(d.parameters(), lr=lr, betas=(0.9, 0.999), eps=6.25e-10)
    g = torch.Generator().manual_seed(0)

    def step() -> None:
        idx = torch.randint(0, cache.size(0), (batch,), generator=g)
        x = cache[idx]
        recon, sparsity = dense_forward(d, x)
        loss = normalized_mse(x, recon) + 1e-3 * sparsity
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        d.normalize_decoder()

    step()
    t, c = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    return rates(steps * batch, t, c)


def rates(n: int, t: float, c: float) -> tuple[float, float]:
    """Activations per second of wall-clock time and per second of this process's CPU time."""
    return n / (time.perf_counter() - t), n / (time.process_time() - c)


def sparse_on_cache(trainer: FeatureTrainer, cache: torch.Tensor, steps: int, batch: int) -> float:
    g = torch.Generator().manual_seed(0)
    trainer.train_step(cache[torch.randint(0, cache.size(0), (batch,), generator=g)], None)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(steps):
        trainer.train_step(cache[torch.randint(0, cache.size(0), (batch,), generator=g)], None)
    return rates(steps * batch, t, c)


def cached_trainer(trainer: FeatureTrainer, steps: int, batch: int) -> tuple[float, float]:
    x, y = trainer.stream.next_batch()
    trainer.train_step(x, y)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(steps):
        x, y = trainer.stream.next_batch()
        trainer.train_step(x, y)
    return rates(steps * batch, t, c)


def streaming(trainer: FeatureTrainer, steps: int, batch: int) -> tuple[tuple[float, float], float]:
    t = time.perf_counter()
    x, y = trainer.stream.next_batch()  # fills the buffer
    trainer.train_step(x, y)
    fill = time.perf_counter() - t
    t, c = time.perf_counter(), time.process_time()
    for _ in range(steps):
        x, y = trainer.stream.next_batch()
        trainer.train_step(x, y)
    return rates(steps * batch, t, c), fill


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "multi30k-de-en"))
    p.add_argument("--site", default="hook_memory")
    p.add_argument("--architecture", default="topk", choices=["topk", "batchtopk", "jumprelu"])
    p.add_argument("--no-streaming", dest="streaming", action="store_false",
                   help="skip the streaming trainer (its model passes dominate on a loaded machine)")
    p.add_argument("--d-sae", dest="d_sae", type=int, default=2048)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--buffer", type=int, default=32768)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cache-rows", dest="cache_rows", type=int, default=262144)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "features_cpu.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    tm = load(args.checkpoint)
    src, tgt = load_dataset("multi30k", "train", "de", "en")
    data = ParallelData.encode(src, tgt, tm.src_tokenizer, tm.tgt_tokenizer, max_len=255)

    def trainer(cached: CachedActivations | None = None) -> FeatureTrainer:
        cfg = FeatureTrainConfig(checkpoint=args.checkpoint, site=args.site, out_dir="/nonexistent", d_sae=args.d_sae,
                                 k=args.k, batch=args.batch, buffer=args.buffer, progress="none",
                                 architecture=args.architecture, activations=args.batch * 10**6)
        return FeatureTrainer(cfg, resume=False, translation_model=tm, data=data, cache=cached)

    # the cache: the site's activations over the corpus, in corpus order, up to --cache-rows
    t = time.perf_counter()
    site = trainer().site
    rows, n = [], 0
    for idx in data.batches(4096, shuffle=False):
        x, _ = site_rows(tm.model, data.collate(idx, tm.model.cfg), site)
        rows.append(x)
        n += x.size(0)
        if n >= args.cache_rows:
            break
    cache = torch.cat(rows)[: args.cache_rows]
    cache_seconds = time.perf_counter() - t

    modes = ("plain", "cached_trainer", "sparse_on_cache") + (("streaming",) if args.streaming else ())
    results: dict[str, list] = {m: [] for m in modes} | {"buffer_fill_s": []}
    cached = CachedActivations(cache, tm.model.cfg.d_model, site.transcoder)
    for _ in range(args.repeats):
        tr = trainer()
        d = SparseDictionary(tr.dictionary.cfg)
        d.load_state_dict(tr.dictionary.state_dict())
        with torch.no_grad():  # the trainer's first step sets these from its batch; the plain loop gets the same
            d.b_dec.copy_(cache.mean(0))
            if args.architecture == "jumprelu":
                acts = d.pre_activations(cache[: args.batch]).relu().flatten()
                d.threshold.fill_(float(acts.topk(args.k * args.batch).values.min()))
        results["plain"].append(plain_loop(d, cache, args.steps, args.batch, 1e-3))
        if args.streaming:
            rate, fill = streaming(tr, args.steps, args.batch)
            results["streaming"].append(rate)
            results["buffer_fill_s"].append(fill)
        results["sparse_on_cache"].append(sparse_on_cache(trainer(), cache, args.steps, args.batch))
        results["cached_trainer"].append(cached_trainer(trainer(cached), args.steps, args.batch))
    wall = {k: statistics.median(r[0] for r in results[k]) for k in modes}
    cpu = {k: statistics.median(r[1] for r in results[k]) for k in modes}
    out = {
        "device": "cpu", "torch": torch.__version__, "machine": platform.machine(), "threads": args.threads,
        "cpus": os.cpu_count(), "load_average_before": load0, "load_average_after": os.getloadavg(),
        "checkpoint": Path(args.checkpoint).name, "site": args.site, "architecture": args.architecture,
        "d_sae": args.d_sae, "k": args.k,
        "batch": args.batch, "buffer": args.buffer, "steps": args.steps, "repeats": args.repeats,
        "cache_rows": int(cache.size(0)), "cache_build_seconds": round(cache_seconds, 2),
        "activations_per_s": {k: round(v) for k, v in wall.items()},
        "activations_per_cpu_s": {k: round(v) for k, v in cpu.items()},
        "runs": results,
        "ratio_cached_trainer_vs_plain": round(wall["cached_trainer"] / wall["plain"], 3),
        "ratio_cached_trainer_vs_plain_cpu": round(cpu["cached_trainer"] / cpu["plain"], 3),
        "ratio_sparse_on_cache_vs_plain": round(wall["sparse_on_cache"] / wall["plain"], 3),
        "ratio_sparse_on_cache_vs_plain_cpu": round(cpu["sparse_on_cache"] / cpu["plain"], 3),
    }
    if args.streaming:
        out |= {"buffer_fill_seconds": round(statistics.median(results["buffer_fill_s"]), 2),
                "ratio_streaming_vs_plain": round(wall["streaming"] / wall["plain"], 3),
                "ratio_streaming_vs_plain_cpu": round(cpu["streaming"] / cpu["plain"], 3)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Decoding speed beside ../shared/bench/peers.py's decode workload: interleaved, on the same weights.

The workload is peers.py's: 64 random source sentences of 32 tokens, beam 5, a fixed output of
64 tokens (EOS suppressed), batched; the model sizes of peers.CONFIGS, fp32 on CPU and bf16 weights
on CUDA. The workbench runs its own `beam_search` with min_len = max_len = 64, so it produces 64
tokens and then the forced EOS: 65 decoder steps against the peers' 64 (counted against us).

Same weights: the workbench model is the `hf-marian-sdpa` peer's MarianMTModel converted by our
Marian importer, so HF `generate` and our search run one function. The `naive` peer (peers.py's
plain cached loop over its own NaiveSeq2Seq) has its own random weights of the same sizes: it is
timed, not compared.

Interleaved: every repetition runs each decoder once, in an order that rotates between repetitions
(ABC, BCA, CAB, ...), so drift of a shared machine reaches every peer alike. Reported per decoder:
median, min and max seconds; per peer: the paired ratio peer_time / our_time of each repetition,
its median, min and max, in wall time and in the process's CPU time (which a shared machine's
other jobs disturb less: it does not count time spent waiting for a core).

`--shipped`: greedy and beam 5 on the shipped checkpoints' test sets, text in and text out
(`TranslationModel.translate`: tokenizing, length-sorted batches of `max_tokens`, detokenizing),
each checkpoint with its own decoding defaults (length penalty, no-repeat guard); greedy and beam
runs interleaved, median sentences per second with min and max. Multi30k test2016 for both de->en
models; general-en-de translates test2016's English side (its own newstest2014 and Tatoeba sets are
not in ../shared/data).

Checked before timing, in fp32 on the CPU for the first --check-sents sentences (the run fails otherwise): our
best outputs equal, token for token, those of peers.py's `beam_search` (the plain loop: top-K of (B, K·V) each
step, no cache) driving our model's full forward over the whole prefix: the naive search on the same weights. On
the timed device the agreement is recorded, not required: on a GPU, and in bf16, the cached and the full-prefix
kernels sum in other orders, which turns near-ties of random weights into other beams (an H100 at base size:
59/64 equal in fp32, one sentence's outputs 0.37 nats apart after diverging at a tie). Whether HF `generate`'s
outputs equal ours is recorded too (it is a different program over the same weights).

    python benchmarks/bench_decode.py --config tiny --threads 1 --json benchmarks/results/decode_tiny_cpu.json
    python benchmarks/bench_decode.py --config base --device cuda   # H100
    python benchmarks/bench_decode.py --shipped --threads 1 --json benchmarks/results/decode_shipped_cpu.json
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "shared" / "bench"))

import peers  # noqa: E402

from workbench.core.model import Transformer  # noqa: E402
from workbench.decoding.search import beam_search  # noqa: E402
from workbench.importers.marian import convert_marian  # noqa: E402


def workbench_from_hf(hf_model) -> Transformer:
    """Our Transformer holding the HF peer's weights (the Marian importer's conversion)."""
    sd = {k: v.detach().float().cpu() for k, v in hf_model.state_dict().items()}
    model, _ = convert_marian(sd, hf_model.config.to_dict(), source="peers.py hf-marian-sdpa")
    return model


class FullPrefixAdapter:
    """peers.beam_search's adapter protocol over our model with no cache: the whole prefix every step."""

    def __init__(self, model: Transformer) -> None:
        self.m = model

    def start(self, src: torch.Tensor, K: int) -> None:
        index = torch.arange(src.size(0), device=src.device).repeat_interleave(K)
        self.encoded = self.m.encode(src).index_select(index)

    def step(self, ys: torch.Tensor) -> torch.Tensor:
        return self.m.decode(ys, self.encoded)[0][:, -1]

    def reorder(self, sel: torch.Tensor) -> None:
        pass  # memory rows are the same within a sentence's beams


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


SHIPPED_TESTS = {  # checkpoint -> source side of Multi30k test2016
    "multi30k-de-en": "test_2016_flickr.de",
    "multi30k-de-en-early": "test_2016_flickr.de",
    "general-en-de": "test_2016_flickr.en",
}


def shipped_speed(args) -> dict:
    """Greedy and beam-5 sentences per second on each shipped checkpoint's test set (interleaved reps)."""
    import workbench

    data = ROOT.parent / "shared" / "data" / "multi30k"
    out = {}
    for name, test in SHIPPED_TESTS.items():
        tm = workbench.load(ROOT / "checkpoints" / name, device=args.device)
        lines = (data / test).read_text(encoding="utf-8").splitlines()
        runs = {"greedy": dict(beam=1), "beam5": dict(beam=5)}
        tm.translate(lines[:64], beam=5)  # warm-up
        wall = {k: [] for k in runs}
        cpu = {k: [] for k in runs}
        for r in range(args.shipped_reps):
            for k in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                t0, c0 = time.perf_counter(), time.process_time()
                tm.translate(lines, **runs[k])
                wall[k].append(time.perf_counter() - t0)
                cpu[k].append(time.process_time() - c0)
        d = tm.decode_config
        out[name] = {"test_set": f"multi30k/{test}", "sentences": len(lines),
                     "defaults": {"length_penalty": d.length_penalty, "alpha": d.alpha,
                                  "no_repeat_ngram": d.no_repeat_ngram, "max_tokens": d.max_tokens}}
        for k in runs:
            w = spread(wall[k])
            out[name][k] = {"sentences_per_s": len(lines) / w["median"],
                            "sentences_per_s_min": len(lines) / w["max"], "sentences_per_s_max": len(lines) / w["min"],
                            "sentences_per_cpu_s": len(lines) / statistics.median(cpu[k]),
                            "wall_s": wall[k], "cpu_s": cpu[k]}
            r = out[name][k]
            print(f"{name:22s} {k:6s} {r['sentences_per_s']:7.1f} sent/s [{r['sentences_per_s_min']:.1f}, "
                  f"{r['sentences_per_s_max']:.1f}], {r['sentences_per_cpu_s']:.1f} per CPU second "
                  f"({len(lines)} sentences, {args.shipped_reps} reps)", flush=True)
    return out


def profile_search(run, dev: torch.device, out: Path) -> None:
    """Where one run of our search spends its time: torch.profiler's ops by self host time and, on CUDA, the
    device's busy time against the wall time (a search whose device idles most of the wall is host-bound)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    peers.sync(dev)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        run()
        peers.sync(dev)
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    host = sum(e.self_cpu_time_total for e in events) / 1e6
    device = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e6
    table = events.table(sort_by="self_cpu_time_total", row_limit=40)
    if dev.type == "cuda":
        table += "\n\n" + events.table(sort_by="self_device_time_total", row_limit=25)
    out.write_text(table + "\n")
    totals = {"wall_s_under_profiler": wall, "ops_self_host_s": host, "kernels_device_s": device,
              "device_busy_fraction": device / wall if wall else None}
    out.with_suffix(".json").write_text(json.dumps(totals, indent=1) + "\n")
    print("profile", json.dumps(totals), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--config", choices=sorted(peers.CONFIGS), default="tiny")
    ap.add_argument("--peers", default="hf-marian-sdpa,naive",
                    help="peers.py peers timed beside ours (hf-marian-sdpa supplies the weights and is always built)")
    ap.add_argument("--decode-sents", type=int, default=64)
    ap.add_argument("--decode-len", type=int, default=32)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--reps", type=int, default=7, help="interleaved repetitions (at least 5)")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--check-sents", type=int, default=8, help="sentences checked against the naive search (CPU)")
    ap.add_argument("--check-every", type=int, default=None, help="host sync interval of our search")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--json", default=None)
    ap.add_argument("--shipped", action="store_true", help="sentences/s of greedy and beam 5 on the shipped models")
    ap.add_argument("--shipped-reps", type=int, default=3)
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="after the timing, profile one run of our search (torch.profiler) and write where its host "
                         "and device time go to FILE (a text table, plus FILE's .json twin with the totals)")
    args = ap.parse_args()
    if args.shipped:
        if args.threads:
            torch.set_num_threads(args.threads)
        results = shipped_speed(args)
        if args.json:
            meta = {"command": "python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
                    "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "torch": torch.__version__, "device": args.device, "threads": torch.get_num_threads(),
                    "load_average": os.getloadavg(),
                    "timing": "TranslationModel.translate over the whole file; greedy and beam runs interleaved"}
            Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
        return
    if args.reps < 5:
        raise SystemExit(f"--reps ({args.reps}) must be at least 5: fewer cannot show the spread")
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cfg = peers.CONFIGS[args.config]
    src = peers.random_tokens(args.decode_sents, args.decode_len, cfg["vocab"], dev, args.seed + 4)
    K, steps = args.beam, args.decode_steps

    hf = peers.Peer("hf-marian-sdpa", cfg, dev, args.seed)
    hf.model.float().eval()
    ours = workbench_from_hf(hf.model).to(dev).float().eval()
    # correctness in fp32 on the CPU, on the first --check-sents sentences: a cached and a full-prefix search sum in
    # other orders, and on a GPU (other kernels per shape) or in bf16 that turns near-ties of these random weights
    # into other beams; what the search does is device-independent, so it is checked where the sums are
    # reproducible, and the agreement on the timed device is recorded beside it
    check_src = src[: args.check_sents].cpu()
    cpu_model = copy.deepcopy(ours).cpu().float()
    fp32_gen = beam_search(cpu_model, check_src, beam=K, min_len=steps, max_len=steps)
    fp32_got = torch.stack([torch.tensor(h.tokens[:steps]) for h in fp32_gen.best])
    fp32_naive = peers.beam_search(FullPrefixAdapter(cpu_model), check_src, K, steps)[0][:, 1:]
    same_naive_fp32 = int((fp32_got == fp32_naive).all(1).sum())
    del cpu_model
    hf.model.to(dtype)
    ours = ours.to(dtype)
    decoders = {"workbench": lambda: beam_search(ours, src, beam=K, min_len=steps, max_len=steps,
                                                 check_every=args.check_every)}
    outputs = {}
    names = [n for n in args.peers.split(",") if n]
    for name in names:
        peer = hf if name == "hf-marian-sdpa" else peers.Peer(name, cfg, dev, args.seed)
        peer.model.to(dtype).eval()
        decoders[name] = (lambda fn: lambda: fn(src, K, steps))(peer.decoders(K, steps)[""])

    # correctness, before any timing
    gen = decoders["workbench"]()
    got = torch.stack([torch.tensor(h.tokens[:steps]) for h in gen.best])  # (B, steps); EOS follows
    ok_len = all(h.length == steps + 1 and h.tokens[-1] == peers.EOS and peers.EOS not in h.tokens[:-1]
                 for h in gen.best)
    naive_ref = peers.beam_search(FullPrefixAdapter(ours), src, K, steps)[0][:, 1:].cpu()
    same_naive = int((got == naive_ref).all(1).sum())
    checks = {"fixed_length_ok": ok_len,
              "equal_to_naive_search_same_weights_fp32_cpu": f"{same_naive_fp32}/{len(check_src)}",
              f"equal_to_naive_search_same_weights_{str(dtype).split('.')[-1]}": f"{same_naive}/{len(got)}"}
    if "hf-marian-sdpa" in decoders:
        hf_out = decoders["hf-marian-sdpa"]()[:, 1:].cpu()
        checks["equal_to_hf_generate_same_weights"] = f"{int((got == hf_out).all(1).sum())}/{len(got)}"
    print("checks", json.dumps(checks), flush=True)
    if not ok_len or same_naive_fp32 != len(check_src):
        raise SystemExit("our beam search disagrees with the naive search on the same weights (fp32): not timing it")

    # interleaved timing: one warm-up each, then `reps` rounds, each decoder once per round, rotating the order
    order = list(decoders)
    for fn in decoders.values():
        fn()
    times: dict[str, list[float]] = {n: [] for n in order}
    cpu: dict[str, list[float]] = {n: [] for n in order}  # process CPU time: blind to waiting for a shared core
    for r in range(args.reps):
        for name in order[r % len(order):] + order[: r % len(order)]:
            peers.sync(dev)
            t0, c0 = time.perf_counter(), time.process_time()
            outputs[name] = decoders[name]()
            peers.sync(dev)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)

    n = args.decode_sents
    results = {}
    for name in order:
        s = spread(times[name])
        results[name] = {"seconds": s, "sentences_per_s": n / s["median"], "times": times[name],
                         "cpu_seconds": spread(cpu[name]), "cpu_times": cpu[name]}
    for name in order[1:]:
        results[name]["workbench_speedup"] = spread([p / w for p, w in zip(times[name], times["workbench"])])
        results[name]["workbench_speedup_cpu"] = spread([p / w for p, w in zip(cpu[name], cpu["workbench"])])
    print(f"\n{args.config} on {dev.type}, beam {K}, {n} sentences x {steps} steps, {args.reps} interleaved reps, "
          f"{torch.get_num_threads()} threads")
    for name in order:
        s = results[name]["seconds"]
        line = (f"{name:16s} {results[name]['sentences_per_s']:7.1f} sent/s  median {s['median'] * 1e3:7.1f} ms  "
                f"[{s['min'] * 1e3:.1f}, {s['max'] * 1e3:.1f}]")
        if name != "workbench":
            q, c = results[name]["workbench_speedup"], results[name]["workbench_speedup_cpu"]
            line += (f"   workbench x{q['median']:.2f} [{q['min']:.2f}, {q['max']:.2f}]"
                     f"  (CPU time x{c['median']:.2f} [{c['min']:.2f}, {c['max']:.2f}])")
        print(line)
    if args.profile:
        profile_search(decoders["workbench"], dev, Path(args.profile))
    if args.json:
        meta = {"command": "python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
                "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "python": platform.python_version(), "torch": torch.__version__,
                "transformers": __import__("transformers").__version__, "device": str(dev),
                "threads": torch.get_num_threads(), "dtype": str(dtype).replace("torch.", ""),
                "load_average": os.getloadavg(), "config": cfg, "sentences": n, "src_len": args.decode_len,
                "beam": K, "out_steps": steps, "reps": args.reps,
                "timing": "interleaved, order rotating per repetition; wall clock around a device sync",
                "speedup": "per repetition, peer seconds / workbench seconds; median, min, max over repetitions",
                "weights": "workbench = hf-marian-sdpa's weights through importers.marian; naive has its own"}
        Path(args.json).write_text(json.dumps({"meta": meta, "checks": checks, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Training throughput of the workbench trainer next to ../shared/bench/peers.py's peers, same pairs, same run.

    python benchmarks/bench_train.py                         # CPU: tiny config
    python benchmarks/bench_train.py --config base --compile # GPU: the paper's base model, bf16

peers.py times one optimiser step on a fixed batch of random pairs (a third of it padding). Here
the *same* pairs (peers.make_train_batch, same seed) go through the real trainer step
(`Trainer._train_step`): length-bucketed micro-batches under a token budget, accumulated into one
optimiser step, so each step does the peers' work: the same sentences, one update. Reported:
real (non-pad) target tokens/s, padding share, and MFU with peers.py's analytic FLOP count over the
same non-pad lengths, so MFU stays proportional to tokens/s across all rows.

The peak is measured in the same run unless --peak-tflops is given: the median rate of a 2048^3 fp32
matmul (CPU; bf16 8192^3 on CUDA) with the run's thread count, so "share of peak" means the share of
what this machine's BLAS reaches on a large square product at that moment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_adapter import install, load_peers, measure_peak, workbench_config  # noqa: E402

from workbench.core.model import Transformer  # noqa: E402
from workbench.corpus.data import ParallelData, padding_fraction  # noqa: E402
from workbench.training.config import TrainConfig  # noqa: E402
from workbench.training.trainer import Trainer, _Accumulator  # noqa: E402


def pairs_from_peers(peers, cfg, spec, seed):
    """The peers' batch as id lists: source without its EOS, target without its EOS."""
    src, _, labels, src_lens, tgt_lens = peers.make_train_batch(cfg, spec, torch.device("cpu"), seed)
    s = [src[i, : n - 1].tolist() for i, n in enumerate(src_lens)]
    t = [labels[i, : n - 1].tolist() for i, n in enumerate(tgt_lens)]
    return ParallelData(s, t), src_lens, tgt_lens


def time_trainer(peers, args, compiled: bool) -> dict:
    cfg = peers.CONFIGS[args.config]
    spec = dict(peers.TRAIN_BATCH[args.config])
    data, src_lens, tgt_lens = pairs_from_peers(peers, cfg, spec, args.seed + 1)
    plan = data.batches(args.max_tokens, seed=args.seed)
    train_cfg = TrainConfig(dataset="files", train_files=["-", "-"], max_steps=10**9, max_tokens=args.max_tokens,
                            accum=len(plan), schedule="constant", lr=1e-4, warmup=0, label_smoothing=0.1,
                            weight_decay=0.01, device=args.device, compile=compiled, out_dir="/tmp/bench_train",
                            bleu=False, amp="auto")
    torch.manual_seed(args.seed)
    model = Transformer(workbench_config(peers, cfg))
    trainer = Trainer(train_cfg, train_data=data, model=model, resume=False, progress="none")
    acc = _Accumulator(trainer.device)
    dev = trainer.device
    first = time.perf_counter()
    trainer._train_step(plan, acc)
    peers.sync(dev)
    first_s = time.perf_counter() - first
    times = peers.timed(lambda: trainer._train_step(plan, acc), dev, max(args.warmup - 1, 0), args.steps)
    med = statistics.median(times)
    T, S = sum(tgt_lens), sum(src_lens)
    dense, attn = peers.forward_flops(cfg, src_lens, tgt_lens)
    flops = 3 * (dense + attn)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else (989e12 if dev.type == "cuda" else None)
    loss = float(acc.sums[0] / acc.sums[2])
    return {
        "peer": "workbench-trainer" + ("+compile" if compiled else ""), "workload": "train", "config": args.config,
        "pairs": len(data), "tgt_tokens": T, "src_tokens": S, "micro_batches": len(plan),
        "max_tokens": args.max_tokens, "tgt_padding": round(padding_fraction(data, plan), 4),
        "step_ms_median": med * 1e3, "first_step_s": first_s, "tgt_tokens_per_s": T / med,
        "achieved_tflops": flops / med / 1e12, "mfu": flops / med / peak if peak else None,
        "mean_loss": loss, "amp_bf16": trainer.amp, "fused_adam": dev.type == "cuda",
    }


def _trainer_step(peers, args, max_tokens: int):
    """(step function, real target tokens) of the workbench trainer on the peers' pairs at a micro-batch budget."""
    cfg = peers.CONFIGS[args.config]
    data, _, tgt_lens = pairs_from_peers(peers, cfg, dict(peers.TRAIN_BATCH[args.config]), args.seed + 1)
    plan = data.batches(max_tokens, seed=args.seed)
    train_cfg = TrainConfig(dataset="files", train_files=["-", "-"], max_steps=10**9, max_tokens=max_tokens,
                            accum=len(plan), schedule="constant", lr=1e-4, warmup=0, label_smoothing=0.1,
                            weight_decay=0.01, device=args.device, out_dir="/tmp/bench_train", bleu=False, amp="auto")
    torch.manual_seed(args.seed)
    trainer = Trainer(train_cfg, train_data=data, model=Transformer(workbench_config(peers, cfg)), resume=False,
                      progress="none")
    acc = _Accumulator(trainer.device)
    return (lambda: trainer._train_step(plan, acc)), sum(tgt_lens)


def _peer_step(peers, args, name: str):
    """(step function, real target tokens) of a peers.py peer: its `Runner.train` step, built the same way."""
    import torch.nn.functional as F  # noqa: PLC0415

    cfg, dev = peers.CONFIGS[args.config], torch.device(args.device)
    peer = peers.Peer(name, cfg, dev, args.seed)
    peer.model.train()
    opt = torch.optim.AdamW(peer.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01)
    src, tgt_in, labels, _, tgt_lens = peers.make_train_batch(cfg, dict(peers.TRAIN_BATCH[args.config]), dev,
                                                              args.seed + 1)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else contextlib.nullcontext():
            logits = peer.train_logits(src, tgt_in)
        F.cross_entropy(logits.reshape(-1, cfg["vocab"]), labels.reshape(-1), ignore_index=peers.PAD,
                        label_smoothing=0.1).backward()
        opt.step()

    return step, sum(tgt_lens)


def interleaved(peers, args) -> dict:
    """Every trainer (ours at each --budgets micro-batch budget, and each peer) timed `args.steps` steps per
    round, the order rotating between rounds, so a machine's drift reaches all alike; per round tokens/s and our
    best budget's ratio to the fastest peer of that round, then medians and spreads over rounds."""
    runs = {f"workbench-trainer@{b}": _trainer_step(peers, args, b) for b in args.budgets}
    runs |= {name: _peer_step(peers, args, name) for name in args.peers.split(",") if name}
    names = list(runs)
    for fn, _ in runs.values():  # warm-up
        for _ in range(args.warmup):
            fn()
    per_round: list[dict] = []
    for r in range(args.interleave):
        row = {}
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn, tokens = runs[name]
            t = time.perf_counter()
            for _ in range(args.steps):
                fn()
            row[name] = tokens * args.steps / (time.perf_counter() - t)
        per_round.append(row)
        print(f"round {r + 1}: " + ", ".join(f"{n} {v:.0f}" for n, v in row.items()), flush=True)

    def spread(xs):
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}

    peers_named = [n for n in names if not n.startswith("workbench")]
    out = {"rounds": per_round, "tgt_tokens_per_s": {n: spread([row[n] for row in per_round]) for n in names}}
    out["ratio_to_fastest_peer_of_round"] = {
        n: spread([row[n] / max(row[p] for p in peers_named) for row in per_round])
        for n in names if n.startswith("workbench")} if peers_named else {}
    for n, s in out["ratio_to_fastest_peer_of_round"].items():
        print(f"{n} / fastest peer of each round: median x{s['median']:.2f} [{s['min']:.2f}, {s['max']:.2f}]")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--config", default="tiny", choices=["tiny", "base", "big"])
    ap.add_argument("--max-tokens", type=int, default=None, help="micro-batch budget (default 16384 cuda, 2048 cpu)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 20 cuda, 5 cpu)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true", help="also torch.compile (trainer and peers)")
    ap.add_argument("--peers", default="torch,hf-marian-sdpa", help="peers.py peers to time in the same run")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=None, help="default: measured in this run (measure_peak)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                    help="instead: ROUNDS interleaved rounds of --steps steps of every trainer (ours at each of "
                         "--budgets, and the peers), the order rotating; medians and spreads over rounds")
    ap.add_argument("--budgets", default="1024,2048,4096",
                    help="with --interleave: our micro-batch budgets (target tokens) to time")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    if args.interleave:
        args.budgets = [int(b) for b in args.budgets.split(",") if b]
        args.steps = args.steps or 5
        peers = load_peers()
        install(peers)
        peak_before = measure_peak(torch.device(args.device))
        out = interleaved(peers, args)
        out["meta"] = {"command": " ".join(sys.argv), "torch": torch.__version__, "threads": torch.get_num_threads(),
                       "peak_gflops_before": peak_before * 1e3,
                       "peak_gflops_after": measure_peak(torch.device(args.device)) * 1e3,
                       "steps_per_round": args.steps}
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
        return
    args.max_tokens = args.max_tokens or (16384 if cuda else 2048)
    args.steps = args.steps or (20 if cuda else 10)
    peak_measured = args.peak_tflops is None
    if peak_measured:
        args.peak_tflops = measure_peak(torch.device(args.device))
        print(f"measured matmul peak: {args.peak_tflops * 1e3:.1f} GFLOP/s "
              f"({'bf16 8192^3' if cuda else 'fp32 2048^3'}, {torch.get_num_threads()} threads)", flush=True)

    peers = load_peers()
    install(peers)
    results = [time_trainer(peers, args, False)]
    print("RESULT " + json.dumps(results[-1]), flush=True)
    if args.compile:
        results.append(time_trainer(peers, args, True))
        print("RESULT " + json.dumps(results[-1]), flush=True)
    if not args.no_peers:
        pargs = argparse.Namespace(device=args.device, config=args.config, workload="train", json=None,
                                   peers=args.peers, compile=args.compile, compile_only=False, seed=args.seed,
                                   pairs=None, steps=args.steps, warmup=args.warmup + 2, peak_tflops=args.peak_tflops,
                                   selfcheck=False, measure_peak=False, reps=5, cap_warmup=1,
                                   capture_shapes="1x64", decode_sents=8, decode_len=8, decode_steps=8,
                                   decode_reps=1, beam=5)
        runner = peers.Runner(pargs)
        runner.run()
        results += runner.results
    print("\nside by side (same pairs; real target tokens per second):")
    for r in results:
        if "tgt_tokens_per_s" in r:
            mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
            print(f"  {r['peer']:26s} {r['tgt_tokens_per_s']:>10.0f} tok/s  "
                  f"step {r['step_ms_median']:9.1f} ms  MFU {mfu}")
    ours = max((r for r in results if r["peer"].startswith("workbench")), key=lambda r: r["tgt_tokens_per_s"])
    others = [r for r in results if "tgt_tokens_per_s" in r and not r["peer"].startswith("workbench")]
    ratio = None
    if others:
        fastest = max(others, key=lambda r: r["tgt_tokens_per_s"])
        ratio = ours["tgt_tokens_per_s"] / fastest["tgt_tokens_per_s"]
        print(f"  {ours['peer']} / fastest peer ({fastest['peer']}): {ratio:.2f}x")
    if args.json:
        meta = {"command": " ".join(sys.argv), "torch": torch.__version__, "threads": torch.get_num_threads(),
                "peak_tflops": args.peak_tflops, "peak_measured_in_run": peak_measured,
                "max_tokens": args.max_tokens, "steps": args.steps, "ratio_to_fastest_peer": ratio}
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Decoding speed side by side with ../shared/bench/peers.py's decode workload, in one run.

The workload is peers.py's: 64 random source sentences of 32 tokens, beam 5, a fixed output of
64 tokens (EOS suppressed), batched; the same model sizes (peers.CONFIGS), fp32 on CPU and bf16
weights on CUDA. The workbench runs its own `beam_search` with min_len = max_len = 64, so it
produces 64 tokens and then the forced EOS: 65 decoder steps against the peers' 64 (counted
against us, not corrected for).

    python benchmarks/bench_decode.py --config tiny                 # CPU
    python benchmarks/bench_decode.py --config base --device cuda   # H100: compare with HF generate
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "shared" / "bench"))

import peers  # noqa: E402

from workbench import ModelConfig, Transformer  # noqa: E402
from workbench.decoding.search import beam_search  # noqa: E402


def workbench_model(cfg: dict) -> Transformer:
    """The peers' architecture in our config: post-norm, sinusoidal, one shared embedding."""
    mc = ModelConfig(src_vocab=cfg["vocab"], tgt_vocab=cfg["vocab"], d_model=cfg["d_model"], n_heads=cfg["heads"],
                     d_ff=cfg["d_ff"], enc_layers=cfg["enc_layers"], dec_layers=cfg["dec_layers"],
                     tie_embeddings="all", max_positions=peers.MAX_POS)
    return Transformer(mc)


def measure_workbench(args, runner) -> dict:
    dev = runner.dev
    cfg = peers.CONFIGS[args.config]
    torch.manual_seed(args.seed)
    model = workbench_model(cfg).to(dev).to(runner.infer_dtype).eval()
    src = peers.random_tokens(args.decode_sents, args.decode_len, cfg["vocab"], dev, args.seed + 4)
    holder = {}

    def run():
        gen = beam_search(model, src, beam=args.beam, min_len=args.decode_steps, max_len=args.decode_steps,
                          check_every=args.check_every)
        holder["gen"] = gen

    times = peers.timed(run, dev, 1, args.decode_reps)
    best = holder["gen"].best
    med = statistics.median(times)
    ok = all(h.length == args.decode_steps + 1 and peers.EOS not in h.tokens[:-1] for h in best)
    result = {
        "peer": "workbench", "workload": "decode", "config": args.config, "sentences": args.decode_sents,
        "src_len": args.decode_len, "beam": args.beam, "out_steps": args.decode_steps,
        "fixed_length_ok": ok, "ms_median": med * 1e3, "ms_min": min(times) * 1e3, "ms_max": max(times) * 1e3,
        "sentences_per_s": args.decode_sents / med, "tokens_per_s": args.decode_sents * args.decode_steps / med,
        "reps": args.decode_reps, "dtype": str(runner.infer_dtype).replace("torch.", ""),
        "method": "workbench.decoding.search.beam_search: KV cache, cross K/V once, 2K candidates with a finished "
                  "pool, min_len=max_len=steps (+1 forced EOS step)",
    }
    runner.record(result)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--config", choices=sorted(peers.CONFIGS), default="tiny")
    ap.add_argument("--peers", default="naive,hf-marian-sdpa", help="peers.py peers to run beside ours")
    ap.add_argument("--decode-sents", type=int, default=64)
    ap.add_argument("--decode-len", type=int, default=32)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--decode-reps", type=int, default=None)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--check-every", type=int, default=None, help="host sync interval of our search")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.decode_reps is None:
        args.decode_reps = 5 if args.device.startswith("cuda") else 2
    # the fields peers.Runner reads; the rest of peers.py's options do not affect decoding
    full = argparse.Namespace(**vars(args), workload="decode", compile=False, compile_only=False, pairs=None,
                              steps=0, warmup=0, reps=1, cap_warmup=0, capture_shapes="", peak_tflops=None,
                              selfcheck=False, measure_peak=False)
    runner = peers.Runner(full)
    for name in runner.peers():
        print(f"== decode {name}", flush=True)
        runner.decode(name)
    print("== decode workbench", flush=True)
    measure_workbench(args, runner)
    runner.summary()
    rates = {r["peer"]: r["sentences_per_s"] for r in runner.results if "sentences_per_s" in r}
    if "workbench" in rates:
        for peer, rate in rates.items():
            if peer != "workbench":
                print(f"workbench / {peer}: {rates['workbench'] / rate:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": runner.meta, "results": runner.results}, indent=1))


if __name__ == "__main__":
    main()

"""Core speed: the workbench model next to ../shared/bench/peers.py's peers, in one run.

    python benchmarks/bench_core.py --device cpu --config tiny --workload train
    python benchmarks/bench_core.py --device cuda --config base --workload all --json out.json
    python benchmarks/bench_core.py --device cpu --config tiny --workload capture --interleave --rounds 7

Every option of peers.py is accepted (see `--help`); `--peers` defaults to workbench,torch,naive.
Reports forward+backward target tokens/s (train), capture-vs-plain forward ratio (capture), and
peak memory on CUDA, exactly as peers.py measures its own peers.

`--interleave` (capture only) times the same forwards as peers.py's capture workload, on the same inputs and
checks, but round-robin: each round runs every peer's plain forward and then its capture once, so a load
swing on a shared machine hits every peer and both sides of each ratio alike (peers.py runs all of one
peer's repetitions before the next peer's). It reports the median over `--rounds` rounds and the spread of the
per-round ratios, in wall time and in this process's CPU time, plus `workbench[one head]`: capturing
`dec_self:1:0` alone (`run_with_cache(heads=...)`), whose cost should be a head's, not a model's.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peer_adapter import install, load_peers  # noqa: E402

from workbench.core.heads import Head  # noqa: E402

ONE_HEAD = "dec_self:1:0"


def interleaved_capture(peers, argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--peers", default="workbench,torch,naive")
    ap.add_argument("--capture-shapes", default="1x64,1x512,32x64,32x512")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a, _ = ap.parse_known_args(argv)
    dev, cfg = torch.device(a.device), peers.CONFIGS[a.config]
    names = a.peers.split(",")
    built = {n: peers.Peer(n, cfg, dev, a.seed) for n in names}
    for peer in built.values():
        peer.model.eval()
    runs = {n: (built[n].plain_forward, built[n].capture_forward) for n in names}
    if "workbench" in built and "heads" in inspect.signature(built["workbench"].model.run_with_cache).parameters:
        model = built["workbench"].model
        runs["workbench[one head]"] = (model, lambda s, t: model.run_with_cache(s, t, heads=[ONE_HEAD]))
    meta = {"command": "python " + " ".join([os.path.relpath(sys.argv[0]), "--interleave", *argv]),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "torch": torch.__version__, "device": a.device,
            "config_name": a.config, "config": cfg, "cpu_threads": torch.get_num_threads(),
            "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
            "protocol": "round-robin: per round, each peer's plain forward then its capture (previous outputs "
                        "released first), 1 warm-up round; medians over rounds; ratio_round_* = spread of the "
                        "per-round capture/plain ratios; cpu_* = this process's CPU time (user + system)",
            "load_avg_start": os.getloadavg()}
    results = []
    expect = cfg["enc_layers"] + 2 * cfg["dec_layers"]
    for shape in a.capture_shapes.split(","):
        b, length = (int(x) for x in shape.split("x"))
        src = peers.random_tokens(b, length, cfg["vocab"], dev, a.seed + 2)
        tgt_in = peers.random_tokens(b, length, cfg["vocab"], dev, a.seed + 3, eos_last=False)
        tgt_in[:, 0] = peers.BOS
        wall = {n: ([], []) for n in runs}
        cpu = {n: ([], []) for n in runs}
        holder: dict = {}
        with torch.inference_mode():
            for r in range(a.rounds + 1):
                for n, fns in runs.items():
                    for side, fn in enumerate(fns):
                        holder.clear()  # release the previous call's tensors first, as peers.py does
                        peers.sync(dev)
                        t, c = time.perf_counter(), time.process_time()
                        holder["out"] = fn(src, tgt_in)
                        peers.sync(dev)
                        if r:  # round 0 warms up
                            wall[n][side].append(time.perf_counter() - t)
                            cpu[n][side].append(time.process_time() - c)
                    if n == "workbench[one head]":
                        head = Head.parse(ONE_HEAD)
                        got = holder["out"][1].attention(head.kind, head.layer, head.head)
                        complete = got.shape == (b, length, length)
                        row_err = float((got.float().sum(-1) - 1).abs().max())
                    else:
                        _, rec = holder["out"]
                        tensors = [x for k in ("enc_self", "dec_self", "cross") for x in rec[k]]
                        complete = len(tensors) == expect and all(x.dim() == 4 and x.size(1) == cfg["heads"]
                                                                  for x in tensors)
                        row_err = max(float((x.float().sum(-1) - 1).abs().max()) for x in tensors)
                holder.clear()
        for n in runs:
            (pw, cw), (pc, cc) = wall[n], cpu[n]
            per_round = [c / p for p, c in zip(pw, cw)]
            rec = {"peer": n, "workload": "capture", "config": a.config, "batch": b, "len": length,
                   "plain_ms": statistics.median(pw) * 1e3, "capture_ms": statistics.median(cw) * 1e3,
                   "ratio": statistics.median(cw) / statistics.median(pw),
                   "ratio_round_median": statistics.median(per_round), "ratio_round_min": min(per_round),
                   "ratio_round_max": max(per_round),
                   "plain_ms_min": min(pw) * 1e3, "plain_ms_max": max(pw) * 1e3,
                   "capture_ms_min": min(cw) * 1e3, "capture_ms_max": max(cw) * 1e3,
                   "cpu_plain_ms": statistics.median(pc) * 1e3, "cpu_capture_ms": statistics.median(cc) * 1e3,
                   "cpu_ratio": statistics.median(cc) / statistics.median(pc),
                   "complete": complete, "row_sum_max_err": row_err, "rounds": a.rounds}
            rec = {k: (round(v, 5) if isinstance(v, float) else v) for k, v in rec.items()}
            results.append(rec)
            print(f"capture  {n:20s} B={b:<3d} L={length:<4d} plain {rec['plain_ms']:8.2f} ms  capture "
                  f"{rec['capture_ms']:8.2f} ms  x{rec['ratio']:.2f} (rounds {rec['ratio_round_min']:.2f}-"
                  f"{rec['ratio_round_max']:.2f})  cpu x{rec['cpu_ratio']:.2f}  complete={complete}", flush=True)
        meta["load_avg_end"] = os.getloadavg()
        if a.json:
            Path(a.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")


def main() -> None:
    peers = load_peers()
    install(peers)
    argv = sys.argv[1:]
    if not any(a.startswith("--peers") for a in argv):
        argv += ["--peers", "workbench,torch,naive"]
    if "--interleave" in argv:
        interleaved_capture(peers, [a for a in argv if a != "--interleave"])
        return
    sys.argv = [sys.argv[0], *argv]
    peers.main()


if __name__ == "__main__":
    main()

"""Time to quality on Multi30k de->en: our config and the plain reference trainer, one after the other, same machine.

    .venv/bin/python benchmarks/bench_time_to_quality.py                   # both (about 75 minutes on 2 cores)
    .venv/bin/python benchmarks/bench_time_to_quality.py --only ours       # one side; the JSON keeps the other's
    .venv/bin/python benchmarks/bench_time_to_quality.py --only ref --ref-minutes 35

Ours: the wall clock starts when `workbench train CONFIG` is launched (sentencepiece training, encoding, training,
validations, checkpoint averaging all inside) and stops when the test score of the shipped decoding settings is
known: beam 5, the length-penalty exponent chosen on *val* from --alphas (one `workbench evaluate` per value), then
test2016 at that value. That total is the "time to quality". The curve: every checkpoint the run wrote
(`keep_last` is raised so none is pruned) is scored afterwards with greedy decoding on test2016 and placed at the
wall minute its directory was written; that after-the-fact scoring is not counted in any time.

A recipe with `target_bleu` (configs/multi30k_de_en_fast.toml) stops at the first validation whose greedy BLEU on
val reaches it, not at a fixed minute count: the JSON records why it stopped, the steps and target tokens to that
point, every validation, and beside the raw wall time that time scaled to a machine with a 150 GFLOP/s fp32 matmul
peak (wall x measured peak / 150; `wall_min_total_at_150_gflops`), the scale the goal is stated on. One --alphas
value fixes the length-penalty exponent (no val decoding); several choose it on val, inside the timed total.

Reference: ../shared/bench/ref_multi30k.py with the recipe in ../shared/bench/results/cpu-multi30k-ref.json (the
same model size, joint 8k BPE, inverse-sqrt, fp32 on CPU), stopped at --ref-minutes; its curve is its own
greedy test2016 scores every second epoch at its own elapsed minutes (its evaluations included in its time), and
its final point is the average of its last 5 epoch snapshots with beam 5 at its end.

Throughput of both: target tokens per second of training (each counts its own tokenizer's pieces: the same
sentencepiece settings, so nearly the same counts) and training sentence pairs per second, which no tokenizer
choice changes. Share of peak: training FLOPs per pair (3x peers.py's analytic forward count on our tokenizer's
lengths of every training pair, padding not counted; the reference has the same model and nearly the same
lengths) times pairs/s, over the fp32 matmul peak measured just before that side's run
(peer_adapter.measure_peak: 2048^3, median of 10). Results go to --json (default
benchmarks/results/time_to_quality_cpu.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_adapter import load_peers, measure_peak  # noqa: E402

from workbench.checkpoint.format import load_checkpoint  # noqa: E402
from workbench.corpus.data import load_dataset  # noqa: E402

REFERENCE_PEAK_GFLOPS = 150.0
ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DATA = SHARED / "data" / "multi30k"
REF_SCRIPT = SHARED / "bench" / "ref_multi30k.py"
# the recipe of ../shared/bench/results/cpu-multi30k-ref.json, fp32
REF_ARGS = ["--src", "de", "--tgt", "en", "--vocab", "8000", "--sp_type", "bpe", "--d", "128", "--ff", "256",
            "--heads", "4", "--enc", "4", "--dec", "4", "--dropout", "0.3", "--lr", "5e-3", "--warmup", "2000",
            "--wd", "1e-4", "--ls", "0.1", "--max_tokens", "4096", "--eval_every", "2", "--avg", "5", "--beam", "5",
            "--lenpen", "1.0", "--seed", "1", "--amp", "0"]


def python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def evaluate(checkpoint: Path, split: str, *, beam: int, alpha: float = 1.0) -> dict:
    src, ref = DATA / f"{split}.de", DATA / f"{split}.en"
    out = subprocess.run([python(), "-m", "workbench.cli", "evaluate", "--checkpoint", str(checkpoint), "--beam",
                          str(beam), "--alpha", str(alpha), "--src", str(src), "--ref", str(ref), "--json"],
                         cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def scaled(minutes: float, peak_gflops: float) -> float:
    """Minutes on this machine as minutes on a 150 GFLOP/s one (fp32 matmul peak): the machine's speed varies from
    day to day (155 and 96 GFLOP/s on two days here), and a time-to-quality goal is stated on that scale."""
    return minutes * peak_gflops / REFERENCE_PEAK_GFLOPS


def run_ours(args) -> dict:
    out_dir = Path(args.work) / "ours"
    if out_dir.exists():
        raise SystemExit(f"{out_dir} exists: remove it (a time-to-quality run must start from nothing)")
    cmd = [python(), "-m", "workbench.cli", "train", args.config, f"--out_dir={out_dir}", "--keep_last=1000"]
    print("ours:", " ".join(cmd), flush=True)
    t0 = time.time()
    subprocess.run(cmd, cwd=ROOT, check=True)
    t_trained = time.time()
    final = out_dir / "average"
    if not final.exists():
        final = out_dir / "latest"
    alphas = {}
    for alpha in args.alphas if len(args.alphas) > 1 else []:  # one value: nothing to choose, no val decoding
        alphas[alpha] = evaluate(final, "val", beam=5, alpha=alpha)["bleu"]
        print(f"  val beam 5 alpha {alpha}: {alphas[alpha]:.2f}", flush=True)
    best_alpha = max(alphas, key=alphas.get) if alphas else args.alphas[0]
    test = evaluate(final, "test_2016_flickr", beam=5, alpha=best_alpha)
    t_done = time.time()
    print(f"ours: test2016 {test['bleu']:.2f} (alpha {best_alpha}) after {(t_done - t0) / 60:.2f} min", flush=True)

    last = sorted(out_dir.glob("step_*"))[-1]
    log = [json.loads(line) for line in (last / "train_log.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in log if r.get("kind") == "train"]
    train_s = max(r["time"] for r in train)
    tokens = sum(r["tokens"] for r in train)
    cfg = json.loads((last / "meta.json").read_text())["train_config"]
    steps = max(r["step"] for r in train)
    target = cfg.get("target_bleu", 0.0)
    hit = next((r for r in log if target and r.get("kind") == "valid" and r.get("valid_bleu", -1) >= target), None)
    validations = [{"step": r["step"], "valid_bleu_greedy": r.get("valid_bleu"), "valid_loss": r.get("valid_loss")}
                   for r in log if r.get("kind") == "valid"]
    ckpt = load_checkpoint(final)
    sources, targets = load_dataset("multi30k", "train", "de", "en", str(DATA.parent))
    src_lens = [len(ckpt.src_tokenizer.encode(t)) + 1 for t in sources]  # + EOS, as the trainer counts
    tgt_lens = [len(ckpt.tgt_tokenizer.encode(t)) + 1 for t in targets]
    per_pair = sum(tgt_lens) / len(tgt_lens)
    c = ckpt.config
    dims = {"d_model": c.d_model, "enc_layers": c.enc_layers, "dec_layers": c.dec_layers, "heads": c.n_heads,
            "d_ff": c.d_ff, "vocab": c.tgt_vocab}
    dense, attn = load_peers().forward_flops(dims, src_lens, tgt_lens)
    flops_per_pair = 3 * (dense + attn) / len(tgt_lens)
    curve = []
    for ckpt in sorted(out_dir.glob("step_*")) if args.curve else []:
        minute = (ckpt.stat().st_mtime - t0) / 60
        curve.append({"minute": round(minute, 3), "step": int(ckpt.name.split("_")[1]),
                      "test2016_greedy": round(evaluate(ckpt, "test_2016_flickr", beam=1)["bleu"], 2)})
        print(f"  curve {curve[-1]}", flush=True)
    return {
        "command": " ".join(cmd[1:]), "config": args.config, "train_config": cfg,
        "wall_min_to_trained": round((t_trained - t0) / 60, 3), "wall_min_total": round((t_done - t0) / 60, 3),
        "final": {"checkpoint": final.name, "val_beam5_by_alpha": alphas, "alpha": best_alpha,
                  "test2016_beam5": test["bleu"], "test2016_detail": test["bleu_detail"],
                  "signature": test["bleu_signature"]},
        "stop": ({"why": "validation target" + (" (at the schedule's last step)" if hit["step"] == cfg.get("max_steps")
                                                 else ""), "target_valid_bleu_greedy": target, "step": hit["step"],
                  "valid_bleu_greedy": hit["valid_bleu"]} if hit else
                 {"why": "a limit of the config", "target_valid_bleu_greedy": target or None, "step": steps}),
        "steps_to_stop": steps, "tgt_tokens_to_stop": tokens, "validations": validations,
        "train_s": round(train_s, 1), "steps": steps, "epochs_started": max(r["epoch"] for r in train),
        "tgt_tokens_per_s": round(tokens / train_s, 1), "tgt_tokens_per_pair": round(per_pair, 3),
        "pairs_per_s": round(tokens / train_s / per_pair, 2), "train_flops_per_pair": round(flops_per_pair),
        "curve": curve,
    }


def run_ref(args) -> dict:
    out = Path(args.work) / "ref"
    out.mkdir(parents=True, exist_ok=True)
    cmd = [python(), str(REF_SCRIPT), "--data", str(DATA), "--out", str(out), "--tag", "ref",
           "--max_minutes", str(args.ref_minutes), *REF_ARGS]
    print("ref:", " ".join(cmd), flush=True)
    t0 = time.time()
    subprocess.run(cmd, cwd=ROOT, check=True)
    wall = (time.time() - t0) / 60
    log = json.loads((out / "ref.json").read_text())
    epochs = log["epochs"]
    train_s = sum(e["epoch_train_s"] for e in epochs)
    tgt_tokens = log["tgt_tok_per_sent"] * log["train_pairs"] + log["train_pairs"]  # + EOS per sentence
    avg = next(k for k in log["final"] if k.startswith("avg") and "beam" in k and k.endswith("test2016"))
    return {
        "command": " ".join(cmd[1:]), "wall_min_total": round(wall, 3), "train_s": round(train_s, 1),
        "epochs": len(epochs), "steps": epochs[-1]["step"],
        "tgt_tokens_per_s": round(tgt_tokens * len(epochs) / train_s, 1),
        "tgt_tokens_per_pair": round(tgt_tokens / log["train_pairs"], 3),
        "pairs_per_s": round(log["train_pairs"] * len(epochs) / train_s, 2),
        "final": {"which": avg, "test2016_beam5": log["final"][avg]["bleu"], "minute": log["total_min"]},
        "curve": [{"minute": e["elapsed_min"], "step": e["step"], "test2016_greedy": e["test2016_greedy"]}
                  for e in epochs if "test2016_greedy" in e],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/multi30k_de_en.toml")
    ap.add_argument("--only", choices=["ours", "ref"], default=None)
    ap.add_argument("--ref-minutes", type=float, default=35.0, help="the reference's max_minutes")
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.6, 1.0, 1.4, 1.8])
    ap.add_argument("--work", default="runs/time_to_quality", help="run directories")
    ap.add_argument("--no-curve", dest="curve", action="store_false",
                    help="skip scoring each checkpoint on test2016 afterwards (not timed; a minute per 20 checkpoints)")
    ap.add_argument("--json", default="benchmarks/results/time_to_quality_cpu.json")
    args = ap.parse_args()
    os.chdir(ROOT)
    path = Path(args.json)
    results = json.loads(path.read_text()) if path.exists() else {}
    import torch  # noqa: PLC0415  (versions for the record only)

    results.setdefault("meta", {}).update({
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
    })
    for side in ("ours", "ref"):
        if args.only not in (None, side):
            continue
        peak = measure_peak(torch.device("cpu"))  # before each side: this machine's speed drifts
        print(f"fp32 matmul peak before {side}: {peak * 1e3:.1f} GFLOP/s", flush=True)
        results[side] = run_ours(args) if side == "ours" else run_ref(args)
        results[side]["peak_gflops_measured_before"] = round(peak * 1e3, 1)
        results[side]["wall_min_total_at_150_gflops"] = round(scaled(results[side]["wall_min_total"], peak * 1e3), 3)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1))
    if "ours" in results and "ref" in results:
        o, r = results["ours"], results["ref"]
        results["ratios"] = {"tgt_tokens_per_s": round(o["tgt_tokens_per_s"] / r["tgt_tokens_per_s"], 3),
                             "pairs_per_s": round(o["pairs_per_s"] / r["pairs_per_s"], 3)}
        for side in (o, r):  # the same FLOPs per pair (same model, same tokenizer settings)
            gflops = side["pairs_per_s"] * o["train_flops_per_pair"] / 1e9
            side["achieved_gflops"] = round(gflops, 1)
            peak = side.get("peak_gflops_measured_before", o["peak_gflops_measured_before"])
            side["share_of_peak"] = round(gflops / peak, 3)
        path.write_text(json.dumps(results, indent=1))
        print(json.dumps(results["ratios"]))


if __name__ == "__main__":
    main()

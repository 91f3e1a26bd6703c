"""Training throughput on Multi30k: the workbench trainer with configs/multi30k_de_en.toml next to the reference
trainer's step (../shared/bench/ref_multi30k.py), interleaved in one process so machine-speed drift hits both.

    .venv/bin/python benchmarks/bench_train_multi30k.py [--rounds 4] [--steps 20] [--json FILE]

Both train the same model size (4+4 layers, d=128, ff=256, 4 heads, post-norm, tied 8k joint BPE embeddings)
on the same Multi30k training pairs tokenized by one sentencepiece model (the config's: 8k BPE, trained here),
with the same 4096-token budget, dropout 0.3, label smoothing 0.1, AdamW. The reference step is its own code:
`Seq2Seq` and `make_batches` imported from ref_multi30k.py, its loss (`F.cross_entropy(label_smoothing=)`)
and, as its __main__ does on CPU, the math SDPA kernel. Ours is `Trainer._train_step` on its own batch plan.
Each round times --steps steps of one, then of the other (alternating which goes first), each from its own
epoch-0 plan continuing where the last round stopped, so both see the same mix of batch shapes. Reported:
real target tokens (EOS included) per second and training pairs per second, per round and in total, the
ratio, and the fp32 matmul peak measured before and after (peer_adapter.measure_peak).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_adapter import PEERS_DIR, measure_peak  # noqa: E402

from workbench.corpus.data import ParallelData, load_dataset  # noqa: E402
from workbench.training.config import TrainConfig  # noqa: E402
from workbench.training.setup import train_tokenizers  # noqa: E402
from workbench.training.trainer import Trainer, _Accumulator  # noqa: E402


def reference_module():
    sys.path.insert(0, str(PEERS_DIR))
    import ref_multi30k  # noqa: PLC0415  (the reference's own file, next to peers.py)

    return ref_multi30k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/multi30k_de_en.toml")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per trainer per round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default="benchmarks/results/train_multi30k_cpu.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    peak_before = measure_peak(torch.device("cpu"))
    cfg = TrainConfig.load(ROOT / args.config)
    cfg = dataclasses.replace(cfg, out_dir="/tmp/bench_train_multi30k", device="cpu",
                              model={**cfg.model, "dropout": 0.3})  # the reference's dropout
    src, tgt = load_dataset("multi30k", "train", cfg.src_lang, cfg.tgt_lang, cfg.data_root)
    tok, _ = train_tokenizers(cfg, src, tgt)
    data = ParallelData.encode(src, tgt, tok, tok, max_len=cfg.max_pair_len)
    trainer = Trainer(cfg, train_data=data, src_tokenizer=tok, tgt_tokenizer=tok, resume=False, progress="none")
    ours_plan = data.batches(cfg.max_tokens, seed=cfg.seed)
    acc = _Accumulator(trainer.device)

    ref = reference_module()
    m = cfg.model
    ref_args = argparse.Namespace(d=m["d_model"], ff=m["d_ff"], heads=m["n_heads"], enc=m["enc_layers"],
                                  dec=m["dec_layers"], dropout=0.3, attn_dropout=0.0, act_dropout=0.0,
                                  prenorm=False)
    # the same sentences and pieces; the reference's EOS/BOS ids (3/2) around them, its PAD (0) as ours
    ref_src = [list(s) + [ref.EOS] for s in data.src]
    ref_tgt = [list(t) for t in data.tgt]
    torch.manual_seed(1)
    ref_model = ref.Seq2Seq(tok.vocab_size, ref_args)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=1e-4)
    ref_plan = ref.make_batches(ref_src, ref_tgt, cfg.max_tokens, random.Random(1))
    ref_model.train()

    def ref_step(bi):
        s = ref.pad_batch([ref_src[i] for i in bi], "cpu")
        tin = ref.pad_batch([[ref.BOS] + ref_tgt[i] for i in bi], "cpu")
        tout = ref.pad_batch([ref_tgt[i] + [ref.EOS] for i in bi], "cpu")
        with sdpa_kernel([SDPBackend.MATH]):
            logits = ref_model(s, tin)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tout.flatten(), ignore_index=ref.PAD,
                               label_smoothing=0.1)
        ref_opt.zero_grad(set_to_none=True)
        loss.backward()
        ref_opt.step()
        return sum(len(ref_tgt[i]) + 1 for i in bi), len(bi)

    def ours_step(idx):
        trainer._train_step([idx], acc)
        return int(data.tgt_lens[idx].sum()) + len(idx), len(idx)

    runners = {"workbench": (ours_step, ours_plan), "reference": (ref_step, ref_plan)}
    position = {name: 0 for name in runners}
    totals = {name: [0.0, 0, 0] for name in runners}  # seconds, target tokens, pairs
    rounds = []
    for name, (step, plan) in runners.items():  # warm-up, untimed
        for _ in range(args.warmup):
            step(plan[position[name]])
            position[name] += 1
    for r in range(args.rounds):
        order = list(runners) if r % 2 == 0 else list(reversed(runners))
        record = {"round": r + 1, "order": order}
        for name in order:
            step, plan = runners[name]
            seconds, tokens, pairs = 0.0, 0, 0
            for _ in range(args.steps):
                idx = plan[position[name] % len(plan)]
                position[name] += 1
                t0 = time.perf_counter()
                n_tok, n_pairs = step(idx)
                seconds += time.perf_counter() - t0
                tokens, pairs = tokens + n_tok, pairs + n_pairs
            record[name] = round(tokens / seconds, 1)
            totals[name][0] += seconds
            totals[name][1] += tokens
            totals[name][2] += pairs
        record["ratio"] = round(record["workbench"] / record["reference"], 3)
        rounds.append(record)
        print(json.dumps(record), flush=True)
    peak_after = measure_peak(torch.device("cpu"))
    out = {"command": " ".join(sys.argv), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "peak_gflops_before": round(peak_before * 1e3, 1), "peak_gflops_after": round(peak_after * 1e3, 1),
           "rounds": rounds}
    for name, (seconds, tokens, pairs) in totals.items():
        out[name] = {"tgt_tokens_per_s": round(tokens / seconds, 1), "pairs_per_s": round(pairs / seconds, 2),
                     "seconds": round(seconds, 2), "tgt_tokens": tokens, "pairs": pairs}
    ours, theirs = out["workbench"], out["reference"]
    out["ratio_tgt_tokens_per_s"] = round(ours["tgt_tokens_per_s"] / theirs["tgt_tokens_per_s"], 3)
    out["ratio_pairs_per_s"] = round(ours["pairs_per_s"] / theirs["pairs_per_s"], 3)
    print(json.dumps({k: out[k] for k in ("workbench", "reference", "ratio_tgt_tokens_per_s", "ratio_pairs_per_s",
                                          "peak_gflops_before", "peak_gflops_after")}, indent=1))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

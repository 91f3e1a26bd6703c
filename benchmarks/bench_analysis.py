"""Head statistics for every head over Multi30k test2016 (1,000 sentences): seconds on CPU (and GPU).

    .venv/bin/python benchmarks/bench_analysis.py [--device cpu|cuda] [--checkpoint DIR] [--batch 128]

Without --checkpoint the model is the shipped small size (d_model 128, 4+4 layers, 4 heads, d_ff 512,
8k shared vocabulary) with random weights, and the text is cut by an 8k sentencepiece model trained
here on Multi30k train (de+en, first 30k lines each); random weights change the statistics' values,
not their cost. Timed: `corpus_head_stats` end to end (batching, the model's forward with attention
captured, all statistics in float64, aggregation), teacher-forced on the references, after one warm-up
batch. Median and best of --repeats runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from workbench import Transformer
from workbench.analysis import corpus_head_stats
from workbench.core.config import ModelConfig
from workbench.corpus.data import dataset_files, read_parallel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--checkpoint", default=None, help="a workbench checkpoint folder (else random weights)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--spm", default="/tmp/bench_analysis_8k.spm.model",
                    help="sentencepiece model to use, trained and written there when missing")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    src_path, tgt_path = dataset_files("multi30k", "test", "de", "en", download=False)
    src_text, tgt_text = read_parallel(src_path, tgt_path)
    if args.checkpoint:
        from workbench import load

        tm = load(args.checkpoint, device=args.device)
        model, src_tok, tgt_tok = tm.model, tm.src_tokenizer, tm.tgt_tokenizer
        what = f"checkpoint {args.checkpoint}"
    else:
        from pathlib import Path

        from workbench.checkpoint.tokenizer import SentencePieceTokenizer

        spm_path = Path(args.spm)
        if spm_path.is_file():
            src_tok = tgt_tok = SentencePieceTokenizer.from_file(spm_path)
        else:
            train_de, train_en = dataset_files("multi30k", "train", "de", "en", download=False)
            t0 = time.perf_counter()
            src_tok = tgt_tok = SentencePieceTokenizer.train([train_de, train_en], vocab_size=8000,
                                                             max_sentences=60000)
            spm_path.write_bytes(src_tok.proto)
            print(f"sentencepiece 8k trained in {time.perf_counter() - t0:.1f} s, saved to {spm_path}")
        cfg = ModelConfig(src_vocab=8000, tgt_vocab=8000, d_model=128, n_heads=4, d_ff=512, enc_layers=4,
                          dec_layers=4, tie_embeddings="all", max_positions=256)
        torch.manual_seed(0)
        model = Transformer(cfg).eval().to(args.device)
        what = "random weights, d_model 128, 4+4 layers, 4 heads, 8k vocab"
    eos = model.cfg.eos_id
    sources = [ids + [eos] for ids in src_tok.encode_batch(src_text)]
    targets = [ids + [eos] for ids in tgt_tok.encode_batch(tgt_text)]
    tokens = sum(map(len, sources)) + sum(map(len, targets))
    corpus_head_stats(model, sources[: args.batch], targets[: args.batch], batch_size=args.batch)  # warm-up
    times = []
    for _ in range(args.repeats):
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        table = corpus_head_stats(model, sources, targets, batch_size=args.batch)
        times.append(time.perf_counter() - t0)
    heads = len(table.blocks) * table.n_heads
    print(f"{what}; device {args.device}, {torch.get_num_threads()} CPU threads, batch {args.batch}")
    print(f"{len(sources)} sentences, {tokens} tokens, {heads} heads, {len(table.sums)} statistics")
    print(f"corpus_head_stats: median {statistics.median(times):.2f} s, best {min(times):.2f} s")


if __name__ == "__main__":
    main()

"""QK attribution speed on the shipped multi30k-de-en: one cross-attention edge at 20 source pieces.

    .venv/bin/python benchmarks/bench_qk.py [--repeats 20] [--threads 1] [--out benchmarks/results/qk_cpu.json]

The first Multi30k test2016 sentence with exactly 20 source pieces (EOS included), teacher-forced on its reference;
the edge: the alignment head cross:0:2 and the last decoder layer's head 0, at the middle decoder position, reading
its argmax piece. Timed (median of --repeats, after a warm-up; each includes its own forward pass):
  - a plain traced forward (`run_with_cache` of that layer's hook_scores): the baseline;
  - `qk_attribution` with whole heads (`by_position=False`), split by the key they read (the default), and with
    the checkpoint's six dictionaries (hook_memory, the four cross-attention outputs, the dec.1.ffn transcoder);
  - `qk_attributions` of every cross head's argmax edge at that position (16 edges, one forward), per edge.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from workbench.analysis.attribution.qk_attribution import qk_attribution, qk_attributions
from workbench.core.batching import decoder_input
from workbench.corpus.data import dataset_files
from workbench.decoding.translator import load
from workbench.features.dictionary import SparseDictionary

ROOT = Path(__file__).resolve().parents[1]


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "multi30k-de-en"))
    p.add_argument("--pieces", type=int, default=20)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "qk_cpu.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tm = load(args.checkpoint)
    model, cfg = tm.model, tm.model.cfg
    src_f, ref_f = dataset_files("multi30k", "test", "de", "en", download=False)
    sources = src_f.read_text(encoding="utf-8").splitlines()
    refs = ref_f.read_text(encoding="utf-8").splitlines()
    line = next((i for i, de in enumerate(sources) if len(tm.encode_source(de)[0]) == args.pieces), None)
    if line is None:
        raise SystemExit(f"no test2016 sentence has {args.pieces} source pieces")
    ids, en = tm.encode_source(sources[line])[0], refs[line]
    src = torch.tensor([ids])
    tgt = torch.tensor([decoder_input([*tm.tgt_tokenizer.encode(en), cfg.eos_id], cfg.start_id)])
    t = tgt.size(1) // 2
    dicts = [SparseDictionary.load(d) for d in sorted((Path(args.checkpoint) / "features").iterdir())]
    result: dict = {"device": "cpu", "torch": torch.__version__, "machine": platform.machine(),
                    "threads": args.threads, "checkpoint": Path(args.checkpoint).name, "line": line + 1,
                    "source_pieces": src.size(1), "decoder_positions": tgt.size(1), "t": t, "edges": {}}
    for layer, head in ((0, 2), (len(model.dec) - 1, 0)):
        name = model.dec[layer].cross_attn.hook_probs.name
        with torch.no_grad():
            _, trace = model.run_with_cache(src, tgt, names=[name])
        s = int(trace[name][0, head, t, :-1].argmax())

        def forward(layer=layer):
            with torch.no_grad():
                model.run_with_cache(src, tgt, names=[model.dec[layer].cross_attn.hook_scores.name])

        row = {"s": s, "forward_s": median_time(forward, args.repeats)}
        for key, kw in (("components_s", {"by_position": False}), ("by_position_s", {}),
                        ("dictionaries_s", {"dictionaries": dicts})):
            row[key] = median_time(lambda kw=kw, layer=layer, head=head, s=s: qk_attribution(
                model, src, tgt, layer=layer, head=head, t=t, s=s, **kw), args.repeats)
        qk = qk_attribution(model, src, tgt, layer=layer, head=head, t=t, s=s)
        row["terms"] = qk.terms.numel()
        row["error"] = abs(qk.total - qk.score)
        result["edges"][f"cross:{layer}:{head}"] = row
    with torch.no_grad():
        _, trace = model.run_with_cache(src, tgt, names="dec.*.cross_attn.hook_probs")
    edges = [(lay, h, t, int(trace[model.dec[lay].cross_attn.hook_probs.name][0, h, t, :-1].argmax()))
             for lay in range(len(model.dec)) for h in range(model.dec[lay].cross_attn.n_heads)]
    per_edge = median_time(lambda: qk_attributions(model, src, tgt, edges), max(3, args.repeats // 4)) / len(edges)
    result["all_heads"] = {"edges": len(edges), "per_edge_s": per_edge}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

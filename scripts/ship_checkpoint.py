"""Turn a training run into a shipped checkpoint under checkpoints/: average, store fp16, evaluate,
and write the model card from the numbers measured here (nothing in the card is typed by hand).

    python scripts/ship_checkpoint.py RUN_DIR checkpoints/multi30k-de-en --last 5 \
        --eval val=multi30k/val --eval test2016=multi30k/test_2016_flickr --hardware "2 CPU cores (AMD EPYC)"
    python scripts/ship_checkpoint.py RUN_DIR/step_0000128 checkpoints/multi30k-de-en-early --eval ...

`--eval NAME=PREFIX[@BEAM]` scores PREFIX.{src_lang} against PREFIX.{tgt_lang} under ../shared/data with beam 5
(cased and lowercased sacreBLEU, chrF, signatures). The card records the run's own config and log. `--card-only`
rewrites the card from the `eval.json` already there (status and limits written once the numbers are known); the
card's decoding line always comes from the checkpoint's own `meta.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.checkpoint.format import load_checkpoint, save_checkpoint  # noqa: E402
from workbench.corpus.data import MIXTURES, load_dataset  # noqa: E402
from workbench.decoding.evaluate import score  # noqa: E402
from workbench.decoding.translator import load as load_translator  # noqa: E402
from workbench.training.average import average_checkpoints, last_checkpoints  # noqa: E402

DATA = Path(os.environ.get("WORKBENCH_DATA", ROOT.parent / "shared" / "data"))


def build(source: Path, out: Path, last: int, alpha: float | None = None, no_repeat_ngram: int = 0) -> Path:
    """Average the last N checkpoints of a run (or take one checkpoint) and save fp16 without train state.

    `alpha` becomes the checkpoint's default length-penalty exponent and `no_repeat_ngram` its default n-gram
    guard (meta["generation"]), so `workbench evaluate` and the app decode the way the card was measured."""
    with tempfile.TemporaryDirectory() as tmp:
        if last > 1:
            src = average_checkpoints(last_checkpoints(source, last), Path(tmp) / "avg")
        else:
            src = source
        ck = load_checkpoint(src)
        meta = {k: v for k, v in ck.meta.items() if k not in ("files", "created", "created_by", "format_version")}
        if alpha is not None:
            meta["generation"] = {**meta.get("generation", {}), "length_penalty": {"kind": "average", "alpha": alpha}}
        if no_repeat_ngram:
            meta["generation"] = {**meta.get("generation", {}), "no_repeat_ngram": no_repeat_ngram}
        return save_checkpoint(out, ck.model, src_tokenizer=ck.src_tokenizer, tgt_tokenizer=ck.tgt_tokenizer,
                               meta=meta, train_log=ck.train_log, dtype=torch.float16)


def evaluate(out: Path, sets: dict[str, str], default_beam: int) -> dict[str, dict]:
    model = load_translator(out)
    src_lang, tgt_lang = model.meta.get("src_lang"), model.meta.get("tgt_lang")
    results = {}
    for name, spec in sets.items():
        prefix, _, beam_text = spec.partition("@")  # PREFIX@1: greedy for a set too big for beam on a CPU
        beam = int(beam_text) if beam_text else default_beam
        src = (DATA / f"{prefix}.{src_lang}").read_text(encoding="utf-8").splitlines()
        ref = (DATA / f"{prefix}.{tgt_lang}").read_text(encoding="utf-8").splitlines()
        t0 = time.perf_counter()
        hyps = model.translate(src, beam=beam)
        seconds = time.perf_counter() - t0
        cased = score(hyps, [ref])
        lower = score([h.lower() for h in hyps], [[r.lower() for r in ref]])
        results[name] = {"file": f"{prefix}.{src_lang}", "sentences": len(src), "beam": beam,
                         "bleu": round(cased.bleu, 2), "bleu_lowercased": round(lower.bleu, 2),
                         "chrf": round(cased.chrf, 2), "looping": round(cased.looping, 2),
                         "bleu_signature": cased.bleu_signature,
                         "chrf_signature": cased.chrf_signature, "seconds_cpu": round(seconds, 1),
                         "example": {"src": src[0], "hyp": hyps[0], "ref": ref[0]}}
    return results


def describe_data(train_cfg: dict) -> str:
    """The training data as run, with its size counted now (not typed by hand)."""
    name, src_lang, tgt_lang = train_cfg.get("dataset"), train_cfg.get("src_lang"), train_cfg.get("tgt_lang")
    src, tgt = load_dataset(name, "train", src_lang, tgt_lang, train_cfg.get("data_root"))
    parts = MIXTURES.get(name, {}).get("train")
    what = " + ".join(f"{d} {split}" for d, split in parts) if parts else f"{name} train split"
    valid = train_cfg.get("valid_limit") or "all"
    return (f"`{name}` {src_lang}→{tgt_lang}: {what}; {len(src):,} pairs, {sum(len(s.split()) for s in src):,} + "
            f"{sum(len(t.split()) for t in tgt):,} whitespace words (source + target). Validation: the "
            f"dataset's valid split ({valid} lines, greedy BLEU during training).")


def card(out: Path, name: str, results: dict, args: argparse.Namespace) -> str:
    ck = load_checkpoint(out)
    meta, cfg, log = ck.meta, ck.config, ck.train_log
    steps = [r for r in log if "loss" in r]
    last = steps[-1] if steps else {}
    train_cfg = meta.get("train_config", {})
    generation = meta.get("generation", {})  # the decoding defaults as saved (build() writes --alpha and the guard)
    alpha = generation.get("length_penalty", {}).get("alpha")
    guard = generation.get("no_repeat_ngram", 0)
    params = sum(p.numel() for p in {id(p): p for p in ck.model.parameters()}.values())
    size_mb = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20
    lines = [
        f"# {name}", "",
        f"{meta.get('src_lang')}→{meta.get('tgt_lang')} Transformer trained by the workbench itself "
        f"(`workbench train {args.config}`).", "",
        "## Status", "", args.status, "",
        "## Model", "",
        f"- {cfg.enc_layers}+{cfg.dec_layers} layers, d_model {cfg.d_model}, d_ff {cfg.d_ff}, {cfg.n_heads} heads, "
        f"{'pre' if cfg.norm_first else 'post'}-norm, {cfg.positions} positions, tying `{cfg.tie_embeddings}`; "
        f"{params:,} parameters; shared sentencepiece vocabulary of {cfg.src_vocab}.",
        f"- Weights stored as fp16 ({size_mb:.1f} MB directory); they load as fp32.",
        f"- {args.how}", "",
        "## Training", "",
        f"- Data: {describe_data(train_cfg)}",
        f"- Steps: {meta.get('step')} (epoch index {meta.get('epoch')}, counted from 0); final logged training loss "
        f"{last.get('loss', float('nan')):.3f}, lr {last.get('lr', float('nan')):.2e}.",
        f"- Hardware: {args.hardware}; training wall time to this step: "
        f"{last.get('time', float('nan')) / 60:.0f} min (the log's `time`: seconds trained across resumes, "
        "pauses not counted).",
        f"- Command: `{args.command}`", "",
        "Training config as run:", "", "```json", json.dumps(train_cfg, indent=1, sort_keys=True), "```", "",
        "The full training log is `train_log.jsonl` beside this card.", "",
        "## Evaluation", "",
        f"`workbench evaluate --checkpoint checkpoints/{out.name} "
        "--src FILE --ref FILE --beam N` (N: the table's beam) reproduces the cased figures.", "",
        f"Decoding: length penalty log p / len^{1.0 if alpha is None else alpha} (the checkpoint's "
        f"default{'' if alpha is None else ', chosen on val'}); "
        + (f"no repeated {guard}-gram in an output (the checkpoint's default guard; "
           "`--no-repeat-ngram 0` turns it off)" if guard else "no n-gram guard")
        + "; sentences are batched by length. *Looping*: % of outputs in which some word 4-gram occurs three or more "
        "times (`workbench.decoding.evaluate.repetition_share`).", "",
        "| set | sentences | beam | BLEU (cased) | BLEU (lowercased) | chrF | looping % |",
        "|---|---|---|---|---|---|---|",
    ]
    for set_name, r in results.items():
        lines.append(f"| {set_name} (`{r['file']}`) | {r['sentences']} | {r['beam']} | {r['bleu']} | "
                     f"{r['bleu_lowercased']} | {r['chrf']} | {r['looping']} |")
    if results:
        first = next(iter(results.values()))
        lines += ["", f"BLEU signature: `{first['bleu_signature']}`; chrF: `{first['chrf_signature']}`.",
                  "", "Example (first line of each set):", ""]
        for set_name, r in results.items():
            ex = r["example"]
            lines.append(f"- {set_name}: *{ex['src']}* → *{ex['hyp']}* (reference: *{ex['ref']}*)")
    lines += ["", "## Known limits", "", args.limits, ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", type=Path, help="a run directory (with --last) or one checkpoint directory")
    ap.add_argument("out", type=Path)
    ap.add_argument("--last", type=int, default=1)
    ap.add_argument("--eval", action="append", default=[], metavar="NAME=PREFIX[@BEAM]")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--alpha", type=float, help="default length-penalty exponent (choose it on a validation set)")
    ap.add_argument("--no-repeat-ngram", type=int, default=0,
                    help="default n-gram guard stored in the checkpoint (0: none); say on the card why")
    ap.add_argument("--config", default="configs/multi30k_de_en.toml")
    ap.add_argument("--command", required=True, help="the exact training command, for the card")
    ap.add_argument("--hardware", required=True)
    ap.add_argument("--status", required=True, help="which quality goal is met or still open")
    ap.add_argument("--how", default="", help="how the weights were made (averaging, snapshot)")
    ap.add_argument("--limits", required=True)
    ap.add_argument("--card-only", action="store_true",
                    help="rewrite OUT/README.md from OUT/eval.json as measured earlier (new --status or --limits "
                         "text once the numbers are known); builds and evaluates nothing")
    args = ap.parse_args()
    out = args.out
    if args.card_only:
        if not (out / "eval.json").is_file():
            sys.exit(f"--card-only: {out / 'eval.json'} not found (ship it first without --card-only)")
        results = json.loads((out / "eval.json").read_text(encoding="utf-8"))
    else:
        sets = dict(e.split("=", 1) for e in args.eval)
        out = build(args.source, args.out, args.last, args.alpha, args.no_repeat_ngram)
        results = evaluate(out, sets, args.beam)
        (out / "eval.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "README.md").write_text(card(out, args.out.name, results, args), encoding="utf-8")
    print(json.dumps(results, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()

"""Train an alignment layer (Garg et al. 2019) on a checkpoint's own symmetrized alignments, and store it beside it.

    nice -n 10 python scripts/train_alignment_layer.py --checkpoint checkpoints/general-en-de \
        --src ../shared/data/wmt14-train-sample/train.en --tgt ../shared/data/wmt14-train-sample/train.de \
        --pairs 3000 --both-ways --teacher norms:awi:0/0:null:grow-diag --steps 600 --run R1
    (copy R1/state.* into R2) ... --steps 900 --teacher-run R1 --run R2 --save      # a second round, then store
    ... --pairs 10000 --teacher-run checkpoints/general-en-de --init-from checkpoints/general-en-de \
        --lr-decay --run R3 --save              # one more round: the stored layer teaches and is the starting point

Teacher: the aligner `--teacher` (METHOD:SHIFT:UNITS:EOS:SYMMETRIZE, heads as LAYER/HEAD; above: the aligner
general-en-de shipped before the layer), default the checkpoint's alignment.json, or with `--teacher-run` a layer
trained before (self-training: a run directory or a checkpoint directory holding alignment_layer.*; its EOS rule
and symmetrization `--teacher-eos` / `--teacher-symmetrize`, "intersect" keeps only the links both directions agree
on). `--teacher-links FILE` teaches from alignments made elsewhere instead: Pharaoh lines (source-target, 0-based),
one per line of `--src`/`--tgt` and over their punctuation-split words (as `word_align.split_punctuation` writes
them; e.g. another translation direction's links, swapped, combined with this model's by
`scripts/combine_alignments.py` or `scripts/two_direction_teacher.py`).
`--init-from` starts the layer from one trained before (a run or checkpoint directory) instead of from random
weights; a run that already holds state resumes from it whatever `--init-from` says. It runs on `--pairs`
training pairs (never the gold sets); the text is split into words at whitespace and punctuation first, as the
gold sets are tokenized. The teacher's links are cached in RUN/teacher.jsonl; training checkpoints into RUN and
resumes (`alignment_layer.train_alignment_layer`).
`--save` writes alignment_layer.safetensors + alignment_layer.json into the checkpoint directory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from workbench.analysis.alignment.alignment import read_alignments
from workbench.analysis.alignment.alignment_layer import (
    AlignmentLayer,
    load_any_layer,
    piece_targets,
    save_alignment_layer,
    train_alignment_layer,
)
from workbench.analysis.alignment.word_align import (
    EOS_RULES,
    SYMMETRIZE,
    AlignmentSpec,
    aligner,
    alignment_maps,
    encode_words,
    parse_units,
    split_punctuation,
)
from workbench.decoding.translator import load


def teacher_spec(text: str | None, tm) -> AlignmentSpec:
    if text is None:
        if not tm.alignment:
            raise ValueError("the checkpoint has no alignment.json: give --teacher METHOD:SHIFT:UNITS:EOS:SYM")
        return aligner(tm.model, tm.alignment, directory=tm.meta.get("path"))[0]
    method, shift, units, eos, sym = text.split(":", 4) if text.count(":") >= 4 else (None,) * 5
    if method is None:
        raise ValueError("--teacher is METHOD:SHIFT:UNITS:EOS:SYMMETRIZE, units as 0/0 for head 0 of layer 0")
    return AlignmentSpec(method, shift, eos, parse_units(units.replace("/", ":")), {}, sym)


def teacher_links(tm, sources, targets, spec: AlignmentSpec, cache: Path, batch: int = 32) -> list[set]:
    if cache.exists():
        rows = [json.loads(x) for x in cache.read_text(encoding="utf-8").splitlines()]
        if len(rows) == len(sources):
            return [{tuple(x) for x in r} for r in rows]
    out = []
    for start in range(0, len(sources), 512):
        maps = alignment_maps(tm.model, sources[start : start + 512], targets[start : start + 512],
                              method=spec.method, shift=spec.shift, batch_size=batch, heads=spec.needs_heads,
                              layer=spec.layer)
        out += [spec.links_of(m) for m in maps]
        print(f"teacher: {len(out)}/{len(sources)} pairs", flush=True)
    cache.write_text("".join(json.dumps(sorted(x)) + "\n" for x in out), encoding="utf-8")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--src", required=True, help="training source lines (the model's source language)")
    ap.add_argument("--tgt", required=True)
    ap.add_argument("--pairs", type=int, default=8000, help="the first N pairs of at most --max-pieces a side")
    ap.add_argument("--max-pieces", type=int, default=80)
    ap.add_argument("--teacher", default=None, metavar="METHOD:SHIFT:UNITS:EOS:SYM")
    ap.add_argument("--teacher-run", default=None, metavar="DIR",
                    help="teacher: the layer trained in this run directory, or stored in this checkpoint directory "
                         "(awi, --teacher-eos, --teacher-symmetrize): a further round of self-training")
    ap.add_argument("--teacher-links", default=None, metavar="FILE",
                    help="Pharaoh links for each --src/--tgt line over its punctuation-split words: the teacher")
    ap.add_argument("--teacher-eos", default="drop", choices=EOS_RULES)
    ap.add_argument("--teacher-symmetrize", default="grow-diag", choices=SYMMETRIZE)
    ap.add_argument("--init-from", default=None, metavar="DIR",
                    help="start from the layer in this run or checkpoint directory (its shape too)")
    ap.add_argument("--lr-decay", action="store_true", help="learning rate falls linearly to lr / 10")
    ap.add_argument("--source-layer", type=int, default=2, help="decoder stream after this many layers: queries")
    ap.add_argument("--both-ways", action="store_true", help="also train the column direction (source -> target)")
    ap.add_argument("--seed", type=int, default=0, help="the fresh layer's initial weights and the data order")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-minutes", type=float, default=15.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--run", required=True, help="directory for the teacher cache and training state")
    ap.add_argument("--save", action="store_true", help="store the layer in the checkpoint directory")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    run = Path(args.run)
    run.mkdir(parents=True, exist_ok=True)
    tm = load(args.checkpoint, device=args.device)
    given = read_alignments(args.teacher_links) if args.teacher_links else None
    if args.teacher_links:
        spec = None
    elif args.teacher_run:
        spec = AlignmentSpec("layer", "awi", args.teacher_eos, ((0, None),), {}, args.teacher_symmetrize,
                             load_any_layer(args.teacher_run, device=args.device))
    else:
        spec = teacher_spec(args.teacher, tm).check(tm.model)
    src_lines = Path(args.src).read_text(encoding="utf-8").splitlines()
    tgt_lines = Path(args.tgt).read_text(encoding="utf-8").splitlines()
    if given is not None and len(given) != len(src_lines):
        raise SystemExit(f"--teacher-links has {len(given)} lines, --src {len(src_lines)}: one per line")
    sources, targets, kept = [], [], []
    for k, (s, t) in enumerate(zip(src_lines, tgt_lines)):
        sw = encode_words(tm.src_tokenizer, split_punctuation(s))
        tw = encode_words(tm.tgt_tokenizer, split_punctuation(t))
        if sw.ids and tw.ids and len(sw.ids) <= args.max_pieces and len(tw.ids) <= args.max_pieces:
            sources.append(sw)
            targets.append(tw)
            kept.append(k)
        if len(sources) == args.pairs:
            break
    t0 = time.perf_counter()
    if given is not None:
        links = [{(i, j) for i, j in given[k][0] if i < len(s.words) and j < len(t.words)}
                 for k, s, t in zip(kept, sources, targets)]
        teacher = f"the links in {args.teacher_links}"
    else:
        links = teacher_links(tm, sources, targets, spec, run / "teacher.jsonl", args.batch)
        teacher = spec.label()
    print(f"teacher {teacher}: {len(links)} pairs in {time.perf_counter() - t0:.0f} s", flush=True)
    labels = [piece_targets(s, t, x) for s, t, x in zip(sources, targets, links)]
    if args.init_from:
        layer = load_any_layer(args.init_from, device=args.device)
    else:
        layer = AlignmentLayer(tm.model.cfg.d_model, source_layer=args.source_layer, both_ways=args.both_ways)
    result = train_alignment_layer(layer, tm.model, sources, targets, labels, directory=run, steps=args.steps,
                                   batch_size=args.batch, lr=args.lr, max_minutes=args.max_minutes, seed=args.seed,
                                   decay=args.steps if args.lr_decay else None)
    print(json.dumps(result), flush=True)
    if args.save:
        prov = {"teacher": teacher, "trained_on": f"{Path(args.src).name}/{Path(args.tgt).name}, first "
                f"{len(sources)} pairs of <= {args.max_pieces} pieces a side, punctuation split",
                "steps": result["step"], "batch": args.batch, "lr": args.lr, "lr_decay": args.lr_decay,
                "init_from": args.init_from, "final_loss": result["loss"],
                "command": "scripts/train_alignment_layer.py " + " ".join(sys.argv[1:]),
                "seconds": round(result["seconds"], 1), "recipe": "Garg et al. 2019 alignment layer, "
                "trained on the frozen model's own symmetrized shift-attention alignments (Chen et al. 2020)"}
        print(f"saved {save_alignment_layer(layer, args.checkpoint, prov)}")


if __name__ == "__main__":
    main()

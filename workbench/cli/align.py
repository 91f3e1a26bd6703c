"""`workbench align`: word alignments of line pairs from a checkpoint, one Pharaoh line per pair.

    workbench align --checkpoint DIR SRC TGT                          # the checkpoint's own aligner
    workbench align --checkpoint DIR SRC TGT --method alti --shift awi --units 0
    workbench align --checkpoint DIR SRC TGT --choose GOLD --lines 1-150 --report r.json --save

Output: per line pair `i-j` links, 0-based, source word first, sorted by target word; words are the
whitespace tokens of the given lines (each word encoded on its own: a source word's score is the sum over
its pieces, a target word's the mean over its pieces; see `workbench.analysis.alignment.word_align`). The pair is
teacher-forced: TGT is read as the output the model would give.

Default aligner: the checkpoint's `alignment.json` (method, AWO/AWI, heads or layers averaged), else fairseq's
default (last layer, heads averaged, AWO). `--method`, `--shift`, `--units`, `--eos`, `--symmetrize` and
`--punctuation` replace their part of it; a `--method` other than alignment.json's starts from fairseq's default
instead (the file's other parts were chosen for its own method). The aligner used and where it came from is the last
stderr line. A line pair longer than the model's positions (255 pieces a side for 256 positions) gets an empty
output line and one stderr warning naming the line. `--choose GOLD` scores every method, shift, EOS rule,
symmetrization, head and layer against gold on `--lines` only, averages the best heads when that helps, keeps
punctuation apart when that helps (`word_align.punctuation_apart`), prints the best and with `--save` stores it as
the checkpoint's alignment.json; `--report` writes every unit's AER on the chosen lines and on the other lines as
JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

from ..analysis.alignment.alignment import format_pharaoh, read_alignments, score_alignments
from ..analysis.alignment.word_align import (
    ATTENTION_METHODS,
    EOS_RULES,
    METHODS,
    PRESETS,
    PUNCTUATION_RULES,
    SHIFTS,
    SYMMETRIZE,
    AlignmentSpec,
    align_pairs,
    aligner,
    alignment_maps,
    choose_units,
    encode_words,
    parse_units,
)
from ..checkpoint.format import save_alignment
from ..core.version import __version__
from ..decoding.evaluate import read_lines
from ..decoding.translator import TranslationModel, load
from .aer import line_range


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="checkpoint directory")
    p.add_argument("src", help="source lines (the model's source language)")
    p.add_argument("tgt", help="target lines, one per source line")
    p.add_argument("--output", "-o", default="-", metavar="FILE", help="alignments (default: stdout)")
    # validated in run(), not by argparse's `choices`: an unknown value is one line naming the valid ones, exit 2
    p.add_argument("--method", default=None, metavar="|".join((*METHODS, *PRESETS)),
                   help="weights, norms (Kobayashi) or alti (ALTI+); another method than the checkpoint's "
                        "alignment.json starts from the fallback aligner, not from that file's other choices; "
                        "shift-att: Chen et al. 2020's Shift-Att (weights, AWI, grow-diag, its chosen layer); "
                        "layer: the alignment layer(s) trained on the model's own alignments "
                        "(alignment_layer.safetensors; several are read as one)")
    p.add_argument("--shift", default=None, metavar="|".join(SHIFTS),
                   help="awo: the decoder row that predicts the word; awi: the row that reads it")
    p.add_argument("--units", default=None, metavar="L:H,...",
                   help="heads (LAYER:HEAD) or whole layers (LAYER) to average, e.g. 0:0,0:2 or 3")
    p.add_argument("--eos", default=None, metavar="|".join(EOS_RULES),
                   help="drop: argmax over words only; null: a word whose best column is EOS gets no link")
    p.add_argument("--symmetrize", default=None, metavar="|".join(SYMMETRIZE),
                   help="none: one link per target word; otherwise also link each source word to its best target "
                        "word and combine both directions")
    p.add_argument("--punctuation", default=None, metavar="|".join(PUNCTUATION_RULES),
                   help="any: links as the argmax gives them; apart: no link between a punctuation mark and a word "
                        "with no punctuation in it")
    p.add_argument("--batch", type=int, default=32, help="sentence pairs per forward pass")
    p.add_argument("--device", default="cpu")
    p.add_argument("--errors", choices=["strict", "replace"], default="strict", help="invalid UTF-8 input")
    p.add_argument("--choose", default=None, metavar="GOLD", help="choose the aligner against this gold file")
    p.add_argument("--gold-base", type=int, choices=[0, 1], default=1)
    p.add_argument("--swap-gold", action="store_true", help="GOLD writes the model's target word first")
    p.add_argument("--lines", default=None, metavar="A-B", help="--choose on these lines only (1-based)")
    p.add_argument("--max-units", type=int, default=8, help="--choose: at most this many heads averaged")
    p.add_argument("--methods", default=",".join(ATTENTION_METHODS),
                   help="--choose: the methods to search (comma-separated; ALTI+ is searched per layer, not head)")
    p.add_argument("--report", default=None, metavar="FILE", help="--choose: every unit's AER as JSON")
    # dest is not "save": nnsight, once imported, mounts a `.save` on every object, and argparse sets an option's
    # default only where the namespace lacks the attribute, so `args.save` became nnsight's bound method (truthy)
    p.add_argument("--save", dest="save_choice", action="store_true",
                   help="--choose: store the choice as DIR/alignment.json")


OPTIONS = {"method": (*METHODS, *PRESETS), "shift": SHIFTS, "eos": EOS_RULES, "symmetrize": SYMMETRIZE,
           "punctuation": PUNCTUATION_RULES}


def check_options(args: argparse.Namespace) -> None:
    """An unknown --method/--shift/--eos/--symmetrize/--punctuation value is an error naming the valid ones."""
    for name, valid in OPTIONS.items():
        value = getattr(args, name)
        if value is not None and value not in valid:
            raise ValueError(f"--{name} must be one of {', '.join(valid)}; got {value!r}")


def spec_of(tm: TranslationModel, args: argparse.Namespace) -> tuple[AlignmentSpec, str]:
    """The aligner the command line asks for, and where it comes from. No aligner option: the checkpoint's
    alignment.json (else the fallback), whole. Options replace their own parts of it; a --method other than
    the stored one starts from the fallback (last layer, AWO, EOS dropped, no symmetrization) instead, because
    the stored units, shift, EOS rule, symmetrization and punctuation rule were chosen together with the stored
    method."""
    base, origin = aligner(tm.model, tm.alignment or None, args.method, directory=tm.meta.get("path"))
    changed = args.shift or args.units or args.eos or args.symmetrize or args.punctuation
    if not changed:
        return base, origin
    spec = AlignmentSpec(base.method, args.shift or base.shift, args.eos or base.eos,
                         parse_units(args.units) if args.units else base.units, {},
                         args.symmetrize or base.symmetrize, base.layer, args.punctuation or base.punctuation)
    return spec, origin + " with the command line's options"


def _read(path: str, errors: str) -> list[str]:
    with open(path, "rb") as fh:
        return list(read_lines(fh, errors=errors, name=path))


def run(args: argparse.Namespace) -> int:
    check_options(args)
    if args.choose and (args.method or args.shift or args.units or args.eos or args.symmetrize or args.punctuation):
        raise ValueError("--choose searches every shift, EOS rule, symmetrization and unit of --methods; "
                         "--method, --shift, --units, --eos, --symmetrize and --punctuation go without it")
    src, tgt = _read(args.src, args.errors), _read(args.tgt, args.errors)
    if len(src) != len(tgt):
        raise ValueError(f"{args.src} has {len(src)} lines but {args.tgt} has {len(tgt)}")
    tm = load(args.checkpoint, device=args.device)
    if args.choose:
        return _choose(tm, src, tgt, args)
    if args.lines or args.report or args.save_choice:
        raise ValueError("--lines, --report and --save go with --choose GOLD")
    spec, origin = spec_of(tm, args)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as skipped:  # over-long lines: one stderr line each, empty output
        warnings.simplefilter("always")
        links = align_pairs(tm.model, tm.src_tokenizer, tm.tgt_tokenizer, src, tgt, spec, batch_size=args.batch,
                            skip_long=True)
    for w in skipped:
        print(f"workbench align: warning: {w.message}", file=sys.stderr)
    sink = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
    try:
        for line in links:
            sink.write(format_pharaoh(line) + "\n")
    finally:
        if sink is not sys.stdout:
            sink.close()
    print(f"{len(src)} pairs aligned in {time.perf_counter() - start:.1f} s with {spec.label()}: {origin}"
          + (f"; {len(skipped)} too long for the model left empty" if skipped else ""), file=sys.stderr)
    return 0


def _score_config(maps: list, gold: list, rows: slice, held: list[int], method: str, shift: str, eos: str,
                  sym: str, max_units: int) -> dict:
    """One searched configuration: the best units on the chosen lines `rows`, their AER there and on the `held`
    lines, and (for the tables in docs/analysis.md) every single unit's."""
    dev_maps, dev_gold = maps[rows], gold[rows]
    held_maps, held_gold = [maps[k] for k in held], [gold[k] for k in held]
    units, dev_aer, single = choose_units(dev_maps, dev_gold, eos=eos, symmetrize=sym, max_units=max_units)
    # then the punctuation rule, for the chosen units: "apart" where it scores lower on the chosen lines
    apart = score_alignments([m.links(units=units, eos=eos, symmetrize=sym, punctuation="apart") for m in dev_maps],
                             dev_gold).aer
    punctuation = "apart" if apart < dev_aer else "any"
    dev_aer = min(dev_aer, apart)
    held_aer = (score_alignments([m.links(units=units, eos=eos, symmetrize=sym, punctuation=punctuation)
                                  for m in held_maps], held_gold).aer if held else None)
    tabled = eos == "drop" and sym in ("none", "grow-diag")  # the held-out tables in docs/analysis.md
    held_single = ({f"{u[0]}:{'' if u[1] is None else u[1]}": score_alignments(
                    [m.links(*u, eos=eos, symmetrize=sym) for m in held_maps], held_gold).aer
                    for u in single} if held and tabled else {})
    return {"method": method, "shift": shift, "eos": eos, "symmetrize": sym, "punctuation": punctuation,
            "units": [list(u) for u in units],
            "dev_aer": dev_aer, "held_out_aer": held_aer,
            "single_dev": {f"{u[0]}:{'' if u[1] is None else u[1]}": a for u, a in single.items()},
            "single_held_out": held_single}


def _chosen_spec(best: dict, args: argparse.Namespace, rows: slice, n_held: int, methods: list[str]) -> AlignmentSpec:
    """The best configuration as the checkpoint's `AlignmentSpec`, its provenance saying how it was chosen."""
    return AlignmentSpec(best["method"], best["shift"], best["eos"], tuple((a, b) for a, b in best["units"]), {
        "chosen_on": f"{Path(args.choose).name} lines {rows.start + 1}-{rows.stop}"
                     + (" (columns swapped)" if args.swap_gold else ""),
        "dev_aer": round(best["dev_aer"], 4),
        "held_out_aer": None if best["held_out_aer"] is None else round(best["held_out_aer"], 4),
        "held_out": f"the other {n_held} lines",
        "searched": f"methods {'/'.join(methods)} x AWO/AWI x eos drop/null x symmetrize none/intersect/grow-diag/"
                    f"grow-diag-final/union; every head (ALTI+: every layer) and layer, then the best "
                    f"2..{args.max_units} heads averaged, then punctuation any/apart for those units",
        "created_by": f"attention-workbench {__version__}",
    }, best["symmetrize"], punctuation=best["punctuation"])


def _choose(tm: TranslationModel, src: list[str], tgt: list[str], args: argparse.Namespace) -> int:
    gold = read_alignments(args.choose, base=args.gold_base, swap=args.swap_gold)
    if len(gold) != len(src):
        raise ValueError(f"{args.choose} has {len(gold)} lines but {args.src} has {len(src)}")
    rows = line_range(args.lines, len(src))
    held = [k for k in range(len(src)) if not rows.start <= k < rows.stop]
    sources = [encode_words(tm.src_tokenizer, s) for s in src]
    targets = [encode_words(tm.tgt_tokenizer, t) for t in tgt]
    empty = [k + 1 for k in range(len(src)) if not sources[k].ids or not targets[k].ids]
    if empty:
        raise ValueError(f"--choose needs every pair non-empty; lines {empty[:5]} are not")
    report: dict = {"checkpoint": str(tm.meta.get("path")), "gold": str(args.choose),
                    "chosen_on": f"lines {rows.start + 1}-{rows.stop}", "held_out_lines": len(held), "configs": []}
    best = None
    methods = [m.strip() for m in args.methods.split(",")]
    unknown = sorted(set(methods) - set(ATTENTION_METHODS))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; --choose searches the attention methods "
                         f"{list(ATTENTION_METHODS)}")
    report["methods"] = methods
    for method in methods:
        for shift in SHIFTS:
            # per-head ALTI+ costs H times its per-layer maps; the search takes ALTI+ per layer, as the paper does
            maps = alignment_maps(tm.model, sources, targets, method=method, shift=shift, batch_size=args.batch,
                                  heads=method != "alti")
            for eos, sym in [(e, y) for e in EOS_RULES for y in SYMMETRIZE]:
                entry = _score_config(maps, gold, rows, held, method, shift, eos, sym, args.max_units)
                units, dev_aer, held_aer = entry["units"], entry["dev_aer"], entry["held_out_aer"]
                report["configs"].append(entry)
                print(f"{method:8s} {shift} eos={eos:4s} {sym:15s} punctuation {entry['punctuation']:5s} "
                      f"dev AER {100 * dev_aer:5.1f} %"
                      + (f"  held-out {100 * held_aer:5.1f} %" if held_aer is not None else "")
                      + f"  units {','.join(f'{a}' if b is None else f'{a}:{b}' for a, b in units)}", file=sys.stderr)
                if best is None or dev_aer < best["dev_aer"]:
                    best = entry
    assert best is not None
    spec = _chosen_spec(best, args, rows, len(held), methods)
    report["chosen"] = spec.to_dict()
    print(f"chosen: {spec.label()}: AER {100 * best['dev_aer']:.1f} % on the chosen lines"
          + (f", {100 * best['held_out_aer']:.1f} % held out" if best["held_out_aer"] is not None else ""))
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.save_choice:
        print(f"saved {save_alignment(args.checkpoint, spec.to_dict())}")
    return 0

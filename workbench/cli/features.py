"""`workbench features train|eval|stats ...`: sparse dictionaries (SAEs, transcoders) on a checkpoint's hook points.

    workbench features train CHECKPOINT --site hook_memory --out-dir runs/features/hook_memory [--k 32 ...]
    workbench features eval DICTIONARY --checkpoint CHECKPOINT [--card]      # FVU, ΔCE, ..., PCA/random baselines
    workbench features stats DICTIONARY --checkpoint CHECKPOINT             # dashboard statistics over a corpus
    workbench features export-neuronpedia DICTIONARY --checkpoint CHECKPOINT --out DIR   # dashboards as batch-N.json
    workbench features export-circuit-tracer DICTIONARY --checkpoint CHECKPOINT --out DIR  # feature files, INDEX.json

`train` resumes from --out-dir's state with the same command (--fresh starts over); under
`torchrun --nproc_per_node N -m workbench.cli features train ...` every rank streams its share of the corpus.
SIGTERM stops a run as Ctrl-C does: the step it reached is saved.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from ..core.protocols import print_progress
from ..decoding.translator import load
from ..features.circuit_tracer import export_circuit_tracer_features
from ..features.dashboard import FeatureData
from ..features.dictionary import SparseDictionary
from ..features.evaluate import add_seed_timing, evaluate_dictionary, seeds_of, write_card
from ..features.neuronpedia import export_dashboards
from ..features.seeds import seed_spread
from ..features.stats import corpus_feature_stats_cli
from ..features.train import FeatureTrainConfig, FeatureTrainer

_TRAIN_SKIP = {"checkpoint", "site", "out_dir", "extra"}
_TRAIN_HELP = {
    "dense_cap": "hold back a feature whose running firing rate exceeds this: its encoder bias steps down by "
                 "--dense-rate x the batch's mean active value each step (0: off)",
    "dense_rate": "the hold-back's step, in units of the batch's mean active value",
    "rare_floor": "TopK/BatchTopK: push forward a feature whose running firing rate is below this: its encoder bias "
                  "rises each step by --rare-rate x the rise that would put it among the kept activations of that "
                  "share of the batch's rows (revives dead features; 0: off)",
    "rare_rate": "the push's step, the share of that rise taken each step, in (0, 1]",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for add in (_add_train, _add_eval, _add_stats, _add_export_neuronpedia, _add_export_circuit_tracer):
        add(sub)


def _add_train(sub) -> None:
    """`workbench features train`: every FeatureTrainConfig field is an option."""
    t = sub.add_parser("train", help="train a dictionary on activations streamed from a corpus")
    t.add_argument("checkpoint")
    t.add_argument("--site", required=True, help="a hook name (SAE) or enc.N.ffn / dec.N.ffn (transcoder)")
    t.add_argument("--out-dir", dest="out_dir", required=True)
    t.add_argument("--fresh", action="store_true", help="ignore a saved state in --out-dir")
    for f in dataclasses.fields(FeatureTrainConfig):
        if f.name in _TRAIN_SKIP:
            continue
        if isinstance(f.default, bool):  # --skip / --no-skip, not type=bool (which reads "False" as True)
            t.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, action=argparse.BooleanOptionalAction,
                           default=f.default, help=f"(default {f.default})")
            continue
        kind = type(f.default) if f.default is not None else str
        what = f"{_TRAIN_HELP[f.name]} " if f.name in _TRAIN_HELP else ""
        t.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind, default=f.default,
                       help=f"{what}(default {f.default})")


def _add_eval(sub) -> None:
    """`workbench features eval`."""
    e = sub.add_parser("eval", help="FVU, L0, ΔCE, KL, CE recovered, dead/dense features and BLEU with the dictionary "
                                    "spliced in, beside PCA and a random dictionary at the same L0")
    e.add_argument("dictionary", help="a dictionary directory (cfg.json + sae_weights.safetensors)")
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--dataset", default="multi30k")
    e.add_argument("--split", default="valid", help="held-out split for FVU, L0, dead and CE")
    e.add_argument("--bleu-split", dest="bleu_split", default="test2016", help="split for BLEU ('' to skip)")
    e.add_argument("--limit", type=int, default=0)
    e.add_argument("--density-split", dest="density_split", default="train",
                   help="text on which dead/dense features are counted and the baselines fit (not --split)")
    e.add_argument("--density-tokens", dest="density_tokens", type=int, default=200_000,
                   help="site tokens of --density-split read (its first sentences)")
    e.add_argument("--no-baselines", dest="baselines", action="store_false", help="skip PCA and the random dictionary")
    e.add_argument("--seed", type=int, default=0, help="seed of the random dictionary baseline")
    e.add_argument("--card", action="store_true", help="write eval.json and README.md into the dictionary directory")
    e.add_argument("--seed-dirs", dest="seed_dirs", nargs="*", default=[], metavar="DIR",
                   help="dictionaries of the same recipe trained with other seeds: the card adds each figure's mean, "
                        "s.d. and range over them and this one (each evaluated as this one, without baselines)")


def _add_stats(sub) -> None:
    """`workbench features stats`."""
    s = sub.add_parser("stats", help="corpus statistics of every feature (dashboards); torchrun shards the corpus")
    s.add_argument("dictionary")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--dataset", default="multi30k")
    s.add_argument("--split", default="train")
    s.add_argument("--limit", type=int, default=0)
    s.add_argument("--top", type=int, default=16, help="top-activating contexts kept per feature")
    s.add_argument("--sample", type=int, default=32,
                   help="firings sampled uniformly per feature (examples across the activation quantiles)")
    s.add_argument("--out", default=None, help="output file (default: DICTIONARY/stats.safetensors)")


def _add_export_neuronpedia(sub) -> None:
    """`workbench features export-neuronpedia`."""
    n = sub.add_parser("export-neuronpedia", help="feature dashboards as Neuronpedia batch files (batch-N.json, "
                                                  "skipped_indexes.json), offline")
    n.add_argument("dictionary", help="a dictionary directory with its stats.safetensors")
    n.add_argument("--checkpoint", required=True)
    n.add_argument("--out", required=True, help="directory for the batch files (created)")
    n.add_argument("--features", default=None, metavar="A-B,C",
                   help="features to export, e.g. 0-99,120 (default: all; dead ones go to skipped_indexes.json)")
    n.add_argument("--batch-size", dest="batch_size", type=int, default=128, help="features per batch file")
    n.add_argument("--model-id", dest="model_id", default=None, help="Neuronpedia model id (default: the "
                                                                      "checkpoint directory's name)")
    n.add_argument("--sae-set", dest="sae_set", default=None, help="Neuronpedia SAE set (default: the dictionary "
                                                                    "directory's name)")
    n.add_argument("--layer", type=int, default=None, help="Neuronpedia layer (default: the site's layer, 0 for "
                                                           "hook_memory and the embeddings)")


def _add_export_circuit_tracer(sub) -> None:
    """`workbench features export-circuit-tracer`."""
    c = sub.add_parser("export-circuit-tracer", help="features as circuit-tracer's feature files (INDEX.json), for "
                                                     "feature nodes in its graph viewer")
    c.add_argument("dictionary", help="a dictionary directory with its stats.safetensors")
    c.add_argument("--checkpoint", required=True)
    c.add_argument("--out", required=True, help="directory for the files (created)")
    c.add_argument("--features", default=None, metavar="A-B,C", help="features to export (default: all live ones)")


def run(args: argparse.Namespace) -> int:
    if args.action == "train":
        return _train(args)
    if args.action == "eval":
        return _eval(args)
    if args.action == "export-neuronpedia":
        return _export_neuronpedia(args)
    if args.action == "export-circuit-tracer":
        return _export_circuit_tracer(args)
    return _stats(args)


def feature_list(spec: str | None) -> list[int] | None:
    """'0-99,120' as [0, ..., 99, 120]; None: None (every feature)."""
    if spec is None:
        return None
    out = []
    for part in spec.split(","):
        a, _, b = part.strip().partition("-")
        if not a.isdigit() or (b and not b.isdigit()) or (b and int(b) < int(a)):
            raise ValueError(f"--features takes numbers and ranges such as 0-99,120; got {spec!r}")
        out += range(int(a), int(b or a) + 1)
    return out


def _progress(done: int, total: int, what: str = "") -> None:
    print(f"\r{done}/{total} features", end="", file=sys.stderr, flush=True)


def _export_circuit_tracer(args: argparse.Namespace) -> int:
    fd = FeatureData.load(load(args.checkpoint), args.dictionary)
    paths = export_circuit_tracer_features(fd, args.out, features=feature_list(args.features), progress=_progress)
    print(file=sys.stderr)
    print(f"{len(paths)} feature files in {args.out}")
    return 0


def _export_neuronpedia(args: argparse.Namespace) -> int:
    tm = load(args.checkpoint)
    fd = FeatureData.load(tm, args.dictionary)
    paths = export_dashboards(fd, args.out, model_id=args.model_id or Path(args.checkpoint).resolve().name,
                              sae_set=args.sae_set, layer=args.layer, features=feature_list(args.features),
                              batch_size=args.batch_size, progress=_progress)
    print(file=sys.stderr)
    for path in paths:
        print(path)
    return 0


def _train(args: argparse.Namespace) -> int:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(FeatureTrainConfig) if f.name != "extra"}
    cfg = FeatureTrainConfig(**values, extra={"command": " ".join(["workbench", *sys.argv[1:]])})
    trainer = FeatureTrainer(cfg, resume=not args.fresh)
    trainer.fit()  # SIGINT / SIGTERM stop it after the current step, saved
    if trainer.dist.world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 130 if trainer.interrupted else 0


def _eval(args: argparse.Namespace) -> int:
    tm = load(args.checkpoint)
    d = SparseDictionary.load(args.dictionary)
    result = evaluate_dictionary(tm, d, dataset=args.dataset, split=args.split, bleu_split=args.bleu_split or None,
                                 limit=args.limit, density_split=args.density_split,
                                 density_tokens=args.density_tokens, baselines=args.baselines, seed=args.seed,
                                 progress=print_progress)
    result["seeds"] = seeds_of(args.dictionary)
    if args.seed_dirs:
        others = {other: evaluate_dictionary(tm, SparseDictionary.load(other), dataset=args.dataset, split=args.split,
                                             bleu_split=None, limit=args.limit, density_split=args.density_split,
                                             density_tokens=args.density_tokens, baselines=False,
                                             progress=print_progress)
                  for other in args.seed_dirs}
        result["seeds"] = seed_spread(args.dictionary, result, others)
        add_seed_timing(result["timing"], [ev["timing"] for ev in others.values()])
    print(json.dumps(result, indent=1, ensure_ascii=False))
    if args.card:
        write_card(args.dictionary, result)
    return 0


def _stats(args: argparse.Namespace) -> int:
    return corpus_feature_stats_cli(args)

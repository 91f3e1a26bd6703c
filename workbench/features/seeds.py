"""The spread of a card's figures over seeds of one recipe: what `features eval DIR --card --seed-dirs A B` adds.

One trained dictionary's FVU or ΔCE says little on its own: another seed of the same recipe may land a few
hundredths of a nat away, which is the size of the goals the cards are held to (issue 38 asks for "the spread over
3 seeds"; SAEBench reports its figures over seeds too). The card keeps its own dictionary's figures and goals and
adds, from dictionaries trained by the same recipe with other seeds and evaluated exactly as it was (same
evaluation split and density text; no baselines or BLEU, which do not depend on the dictionary's seed), each
figure's mean, sample standard deviation and range.

    others = {d: evaluate_dictionary(tm, SparseDictionary.load(d), baselines=False, bleu_split=None) for d in dirs}
    result["seeds"] = seed_spread(directory, result, others)

"The same recipe" is checked, not assumed: every training stage (a fine-tune's start back to its first training)
must have the same settings except the seed, the directories and the command (`RECIPE_FREE`).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from .train import FeatureTrainConfig

SPREAD_FIGURES = ("fvu", "l0", "delta_ce", "kl", "ce_recovered", "ce_recovered_mean", "dead_frac", "dense_frac")
"""The card's figures that depend on the dictionary's training, and so on its seed."""

RECIPE_FREE = ("seed", "out_dir", "finetune_kl", "extra", "log_every", "save_every_s", "threads", "progress")
"""Training settings that may differ between seeds of one recipe (the seed, where it ran and how it reported)."""

INERT_UNLESS = {"dense_rate": "dense_cap", "rare_rate": "rare_floor"}
"""Settings that act only while another is non-zero (a controller's rate, while its cap or floor is set): left out
of a stage's recipe while that one is off, so a default changed since a stage ran does not split one recipe."""


def training_of(directory: str | Path) -> dict[str, Any]:
    """A dictionary's training.json (ValueError when it has none: a card's seeds are read from it)."""
    path = Path(directory) / "training.json"
    if not path.is_file():
        raise ValueError(f"{directory} has no training.json: its seed and recipe are unknown")
    return json.loads(path.read_text(encoding="utf-8"))


def recipe(training: dict[str, Any]) -> list[dict[str, Any]]:
    """The training settings stage by stage, from the last fine-tune back to the first training, without those
    that may differ between seeds (`RECIPE_FREE`) or that act only when another is on, while it is off
    (`INERT_UNLESS`); a setting added since a stage ran counts as its default (that stage never used it)."""
    defaults = FeatureTrainConfig(checkpoint="", site="", out_dir="").to_dict()
    stages, stage = [], training
    while stage:
        settings = {k: v for k, v in (defaults | stage.get("config", {})).items() if k not in RECIPE_FREE}
        stages.append({k: v for k, v in settings.items() if k not in INERT_UNLESS or settings.get(INERT_UNLESS[k])})
        stage = stage.get("finetuned_from", {}).get("training")
    return stages


def _check_same_recipe(directory: str | Path, others: list[str]) -> list[int]:
    """Every stage's seed of `directory` and of each of `others`; ValueError naming the first setting that
    differs, a different number of stages, or a seed used twice."""
    mine = recipe(training_of(directory))
    seeds = [training_of(directory).get("config", {}).get("seed")]
    for other in others:
        theirs = recipe(training_of(other))
        if len(theirs) != len(mine):
            raise ValueError(f"{other} was trained in {len(theirs)} stage(s), {directory} in {len(mine)}: "
                             "not the same recipe")
        for stage, (a, b) in enumerate(zip(mine, theirs)):
            diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            if diff:
                raise ValueError(f"{other} differs from {directory} in stage {stage} (0: the last): "
                                 + "; ".join(f"{k} {b.get(k)!r} there, {a.get(k)!r} here" for k in diff))
        seeds.append(training_of(other).get("config", {}).get("seed"))
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"the seeds {seeds} of {directory} and {', '.join(others)} repeat: a spread needs "
                         "distinct seeds")
    return seeds


def seed_spread(directory: str | Path, result: dict[str, Any], others: dict[str, dict[str, Any]]
                ) -> dict[str, Any]:
    """A card's `seeds` field: `result` (this dictionary's evaluation) and `others` (directory -> the evaluation
    of the same recipe trained with another seed), each figure's mean, sample standard deviation, min and max over
    them all, and every seed's own figures."""
    if not others:
        raise ValueError("a spread over seeds needs at least one other seed's dictionary")
    seeds = _check_same_recipe(directory, list(others))
    evaluations = [result, *others.values()]
    for other, ev in others.items():
        if ev.get("split") != result.get("split") or ev.get("density_tokens") != result.get("density_tokens"):
            raise ValueError(f"{other} was evaluated on {ev.get('split')} ({ev.get('density_tokens')} density "
                             f"tokens), this card on {result.get('split')} ({result.get('density_tokens')})")
    per_seed = [{"seed": seed, "directory": str(where), **{f: ev[f] for f in SPREAD_FIGURES}}
                for seed, where, ev in zip(seeds, [directory, *others], evaluations)]
    spread = {}
    for f in SPREAD_FIGURES:
        values = [ev[f] for ev in evaluations]
        spread[f] = {"mean": statistics.fmean(values), "sd": statistics.stdev(values),
                     "min": min(values), "max": max(values)}
    return {"count": len(seeds), "values": seeds, "spread": spread, "per_seed": per_seed,
            "note": f"the same recipe trained with seeds {', '.join(map(str, seeds))}, each evaluated as this card "
                    "(same split and density text); mean ± sample standard deviation and range over the seeds"}

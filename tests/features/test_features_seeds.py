"""The spread of a card's figures over seeds (`features.seeds`, `features eval --seed-dirs`): the mean, s.d. and
range are those of the seeds' own figures, the card shows them beside its own, and only dictionaries of the same
recipe with distinct seeds are accepted, stage by stage for fine-tunes."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from model_helpers import tiny_model_and_corpus

from workbench.decoding.translator import TranslationModel
from workbench.features.evaluate import _card_seeds_and_time, add_seed_timing
from workbench.features.seeds import SPREAD_FIGURES, seed_spread
from workbench.features.train import FeatureTrainConfig, FeatureTrainer


def _cfg(out_dir, **over) -> FeatureTrainConfig:
    return FeatureTrainConfig(**{"checkpoint": "tiny", "site": "hook_memory", "out_dir": str(out_dir), "d_sae": 32,
                                 "k": 4, "activations": 16 * 6, "batch": 16, "buffer": 64, "max_tokens": 64,
                                 "warmup": 1, "lr": 1e-2, "log_every": 3, "progress": "none", "dead_after": 40} | over)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Dictionaries directory -> nothing but their training records matter here: seeds 0, 1, 2 of one recipe,
    seed 3 at another learning rate, and a fine-tune of seeds 0 and 1 by one fine-tune recipe."""
    model, data = tiny_model_and_corpus()
    tm = TranslationModel(model, None)
    root = tmp_path_factory.mktemp("seeds")

    def train(name: str, **over):
        FeatureTrainer(_cfg(root / name, **over), translation_model=tm, data=data).fit()
        return root / name / "dictionary"
    runs = {f"s{s}": train(f"s{s}", seed=s) for s in range(3)}
    runs["other_lr"] = train("other_lr", seed=3, lr=5e-3)
    for s in (0, 1):
        runs[f"ft{s}"] = train(f"ft{s}", seed=s, finetune_kl=str(runs[f"s{s}"]), kl_steps=2, kl_tokens=64,
                               kl_lr=1e-3)
    return runs


def _evaluation(i: int) -> dict:
    """An evaluation's figures, different per seed."""
    return {"split": "multi30k:valid", "density_tokens": 200_000,
            **{f: 0.1 * (i + 1) + 0.01 * j for j, f in enumerate(SPREAD_FIGURES)}}


def test_the_spread_is_that_of_the_seeds_figures_and_the_card_shows_it(trained):
    result, others = _evaluation(0), {str(trained["s1"]): _evaluation(1), str(trained["s2"]): _evaluation(2)}
    seeds = seed_spread(trained["s0"], result, others)
    assert seeds["count"] == 3 and seeds["values"] == [0, 1, 2]
    for f in SPREAD_FIGURES:
        values = torch.tensor([_evaluation(i)[f] for i in range(3)], dtype=torch.float64)
        got = seeds["spread"][f]
        assert got["mean"] == pytest.approx(float(values.mean()))
        assert got["sd"] == pytest.approx(float(values.std(unbiased=True)))
        assert (got["min"], got["max"]) == (pytest.approx(float(values.min())), pytest.approx(float(values.max())))
    assert [p["seed"] for p in seeds["per_seed"]] == [0, 1, 2]
    card = "\n".join(_card_seeds_and_time(result | {"seeds": seeds}))
    s = seeds["spread"]["delta_ce"]
    assert f"| ΔCE (nats) | {result['delta_ce']:.4f} | {s['mean']:.4f} ± {s['sd']:.2g} | {s['min']:.4f} – " \
           f"{s['max']:.4f} |" in card
    assert "mean ± s.d. over 3 seeds" in card


def test_fine_tunes_of_seeds_are_one_recipe_stage_by_stage(trained):
    seeds = seed_spread(trained["ft0"], _evaluation(0), {str(trained["ft1"]): _evaluation(1)})
    assert seeds["values"] == [0, 1]
    with pytest.raises(ValueError, match="stage"):  # a fine-tune beside a plain training
        seed_spread(trained["ft0"], _evaluation(0), {str(trained["s1"]): _evaluation(1)})


def test_a_setting_added_since_a_stage_ran_counts_as_its_default(trained, tmp_path):
    older = tmp_path / "older"
    shutil.copytree(trained["s1"], older)
    training = json.loads((older / "training.json").read_text())
    del training["config"]["finetune_ce"], training["config"]["dense_cap"]  # as written before they existed
    (older / "training.json").write_text(json.dumps(training))
    assert seed_spread(trained["s0"], _evaluation(0), {str(older): _evaluation(1)})["values"] == [0, 1]
    training["config"]["dense_cap"] = 0.2
    (older / "training.json").write_text(json.dumps(training))
    with pytest.raises(ValueError, match="dense_cap 0.2 there, 0.0 here"):
        seed_spread(trained["s0"], _evaluation(0), {str(older): _evaluation(1)})


def test_a_rate_whose_cap_or_floor_is_off_is_not_part_of_the_recipe(trained, tmp_path):
    """--rare-rate acts only with --rare-floor, --dense-rate only with --dense-cap: a seed trained when the rate's
    default was another, with the floor off, is the same recipe; with the floor on, it is not."""
    older = tmp_path / "older"
    shutil.copytree(trained["s1"], older)
    training = json.loads((older / "training.json").read_text())
    training["config"] |= {"rare_floor": 0.0, "rare_rate": 0.01, "dense_cap": 0.0, "dense_rate": 0.5}
    (older / "training.json").write_text(json.dumps(training))
    assert seed_spread(trained["s0"], _evaluation(0), {str(older): _evaluation(1)})["values"] == [0, 1]
    training["config"] |= {"rare_floor": 0.001}
    (older / "training.json").write_text(json.dumps(training))
    with pytest.raises(ValueError, match="rare_floor 0.001 there, 0.0 here; rare_rate 0.01 there"):
        seed_spread(trained["s0"], _evaluation(0), {str(older): _evaluation(1)})


@pytest.mark.parametrize("other, match", [("other_lr", "lr 0.005 there, 0.01 here"), ("s0", "repeat")])
def test_another_recipe_or_a_repeated_seed_is_refused(trained, other, match):
    with pytest.raises(ValueError, match=match):
        seed_spread(trained["s0"], _evaluation(0), {str(trained[other]): _evaluation(1)})


def test_seeds_evaluated_on_another_split_are_refused(trained):
    elsewhere = _evaluation(1) | {"split": "multi30k:test2016"}
    with pytest.raises(ValueError, match="evaluated on multi30k:test2016"):
        seed_spread(trained["s0"], _evaluation(0), {str(trained["s1"]): elsewhere})


def test_the_card_has_a_row_for_every_spread_figure_and_reads_older_spreads(trained):
    result, others = _evaluation(0), {str(trained["s1"]): _evaluation(1), str(trained["s2"]): _evaluation(2)}
    seeds = seed_spread(trained["s0"], result, others)

    def rows_of(card: list[str]) -> list[str]:
        return [line for line in card if line.startswith("| ") and "±" in line and "this dictionary" not in line]
    rows = rows_of(_card_seeds_and_time(result | {"seeds": seeds}))
    assert len(rows) == len(SPREAD_FIGURES) and any(r.startswith("| CE recovered vs mean |") for r in rows)
    older = seeds | {"spread": {k: v for k, v in seeds["spread"].items() if k != "ce_recovered_mean"}}
    rows = rows_of(_card_seeds_and_time(result | {"seeds": older}))
    assert len(rows) == len(SPREAD_FIGURES) - 1 and not any("vs mean" in r for r in rows)


def test_the_seeds_evaluation_time_joins_the_cards_and_the_baselines_share_of_it():
    timing = {"card_seconds": 60.0, "card_seconds_without_bleu": 60.0, "baseline_seconds": 15.0,
              "baseline_share": 0.25, "baseline_share_without_bleu": 0.25}
    add_seed_timing(timing, [{"card_seconds": 40.0}, {"card_seconds": 50.0}])
    assert timing["seed_seconds"] == 90.0 and timing["seed_count"] == 2
    assert timing["baseline_share_with_seeds"] == pytest.approx(15.0 / 150.0)
    card = "\n".join(_card_seeds_and_time({"timing": timing}))
    assert "Its 2 other seeds took 90 s" in card and "10% of the card's time with them" in card
    assert "(BLEU not measured)" in card  # no BLEU figures: the time does not claim them
    card = "\n".join(_card_seeds_and_time({"timing": timing, "bleu_clean": 40.0}))
    assert "(BLEU included)" in card and "Its 2 other seeds took 90 s" in card

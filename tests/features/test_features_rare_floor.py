"""`features train --rare-floor F --rare-rate ρ`: the dense hold-back's counterpart raises the encoder bias of
features that fire less often than the floor, so a feature that would stay dead fires; off, training is what it
was (the bias is moved by nothing but the optimiser); it resumes exactly, and the card states it."""

from __future__ import annotations

import json
import math

import pytest
import torch
from dictionary_helpers import fit_interrupted_after
from model_helpers import tiny_model_and_corpus

from workbench.decoding.translator import TranslationModel
from workbench.features.evaluate import _card_training
from workbench.features.seeds import recipe
from workbench.features.sites import site_rows
from workbench.features.train import FeatureTrainConfig, FeatureTrainer

KILLED = [3, 17, 40, 41, 63]


def _cfg(out_dir, **over) -> FeatureTrainConfig:
    return FeatureTrainConfig(**{"checkpoint": "tiny", "site": "hook_memory", "out_dir": str(out_dir), "d_sae": 64,
                                 "k": 4, "activations": 16 * 60, "batch": 16, "buffer": 64, "max_tokens": 64,
                                 "warmup": 2, "lr": 1e-2, "log_every": 10, "progress": "none", "dead_after": 40}
                             | over)


@pytest.fixture(scope="module")
def tiny():
    model, data = tiny_model_and_corpus()
    return TranslationModel(model, None), data


def _trainer(tmp_path, tiny, name: str, **over) -> FeatureTrainer:
    tm, data = tiny
    trainer = FeatureTrainer(_cfg(tmp_path / name, **over), translation_model=tm, data=data)
    with torch.no_grad():  # features KILLED start far below every row's top k: nothing but a bias push revives them
        trainer.dictionary.b_enc[KILLED] = -20.0
    return trainer


def _firing_counts(trainer: FeatureTrainer, tiny) -> torch.Tensor:
    tm, data = tiny
    x = torch.cat([site_rows(tm.model, data.collate(idx, tm.model.cfg), trainer.site)[0]
                   for idx in data.batches(256)])
    with torch.no_grad():
        return (trainer.dictionary.encode(x) > 0).sum(0)


def test_rare_floor_revives_features_that_would_stay_dead(tmp_path, tiny):
    plain = _trainer(tmp_path, tiny, "plain")
    plain.fit()
    assert int(_firing_counts(plain, tiny)[KILLED].sum()) == 0  # AuxK cannot reach them: they stay dead
    assert "boosted" not in plain.log[-1]
    floor = 0.02
    pushed = _trainer(tmp_path, tiny, "floor", rare_floor=floor, rare_rate=0.3)
    pushed.fit()
    counts = _firing_counts(pushed, tiny)
    assert bool((counts[KILLED] > 0).all()), counts[KILLED]
    assert int((counts == 0).sum()) < int((_firing_counts(plain, tiny) == 0).sum())  # fewer dead over all
    assert all("boosted" in r for r in pushed.log)
    assert pushed.log[0]["boosted"] > len(KILLED) - 1 and pushed.log[-1]["boosted"] < pushed.log[0]["boosted"]
    # and it costs no place in the top k: the dictionary still keeps k per row
    tm, data = tiny
    x = site_rows(tm.model, data.collate(data.batches(256)[0], tm.model.cfg), pushed.site)[0]
    with torch.no_grad():
        assert int((pushed.dictionary.encode(x) > 0).sum(-1).max()) <= 4


@pytest.mark.parametrize("over", [{}, {"dense_cap": 0.1, "dense_rate": 0.05}])
def test_rare_floor_off_leaves_training_as_it_was(tmp_path, tiny, over):
    """Floor 0: the rate does nothing, and no bias moves outside the optimiser (with a dense cap, only the cap's)."""
    ref = _trainer(tmp_path, tiny, "ref", **over)
    ref.fit()
    other = _trainer(tmp_path, tiny, "other", rare_rate=3.0, **over)
    seen = []
    balance = other._balance

    def watched(*args):  # the controller's moves, recorded
        before = other.dictionary.b_enc.detach().clone()
        result = balance(*args)
        seen.append(bool((other.dictionary.b_enc > before).any()))
        return result
    other._balance = watched
    other.fit()
    for (k, a), b in zip(ref.dictionary.state_dict().items(), other.dictionary.state_dict().values()):
        assert torch.equal(a, b), k
    assert len(seen) == (other.step if over else 0) and not any(seen)  # called only with a cap; never raised a bias
    assert all("boosted" not in r for r in other.log)


def test_rare_floor_resumes_exactly_and_the_card_states_it(tmp_path, tiny):
    over = {"rare_floor": 0.02, "rare_rate": 0.3, "dense_cap": 0.3, "activations": 16 * 12, "log_every": 4}
    whole = _trainer(tmp_path, tiny, "a", **over)
    whole.fit()
    first = _trainer(tmp_path, tiny, "b", **over)
    fit_interrupted_after(first, 5)  # Ctrl-C during step 5: the loop stops after it and saves
    assert first.interrupted and first.step == 5
    tm, data = tiny
    resumed = FeatureTrainer(_cfg(tmp_path / "b", **over), translation_model=tm, data=data)
    assert resumed.step == 5
    resumed.fit()
    for (k, a), b in zip(whole.dictionary.state_dict().items(), resumed.dictionary.state_dict().values()):
        assert torch.equal(a, b), k
    with pytest.raises(ValueError, match="rare_floor"):
        FeatureTrainer(_cfg(tmp_path / "b", **(over | {"rare_floor": 0.01})), translation_model=tm, data=data)
    training = json.loads((tmp_path / "a" / "dictionary" / "training.json").read_text())
    lines = "\n".join(_card_training(training, training["config"], "topk"))
    assert "Rare features pushed forward: while a feature's running firing rate" in lines
    assert "was below 0.02, its encoder bias rose each step by 0.3 x" in lines
    plain = json.loads((tmp_path / "a" / "dictionary" / "training.json").read_text())
    plain["config"] = {k: v for k, v in plain["config"].items() if not k.startswith("rare_")}  # as written before
    assert "Rare features" not in "\n".join(_card_training(plain, plain["config"], "topk"))
    assert recipe(plain)[0]["rare_floor"] == 0.0  # a card trained before the option counts as floor 0


@pytest.mark.parametrize("architecture,floor", [("topk", 0.02), ("topk", 0.25), ("batchtopk", 0.25)])
def test_rare_push_is_the_rise_that_wins_the_floors_share_of_rows(tmp_path, tiny, architecture, floor):
    """At rate 1 the push lifts each feature exactly to the smallest kept activation (its row's for TopK, the
    batch's for BatchTopK) on ceil(floor x rows) rows: it reaches the bar there, and on one row fewer it would not."""
    trainer = _trainer(tmp_path, tiny, architecture, architecture=architecture, rare_floor=floor, rare_rate=1.0)
    x, _ = trainer.stream.next_batch()
    d = trainer.dictionary
    with torch.no_grad():
        out = d.training_forward(x)
        under = torch.ones(d.cfg.d_sae, dtype=torch.bool)
        push = trainer._rare_push(under, x, out)
        pre = d.pre_activations(x)
        acts = out.acts
        bar = acts[acts > 0].min() if architecture == "batchtopk" else acts.min(-1, keepdim=True).values
        need = math.ceil(floor * x.size(0))
        assert bool(((pre + push >= bar - 1e-5).sum(0) >= need).all())
        assert bool((push > 0).any()) and bool((push >= 0).all())
        lifted = push > 1e-3
        assert bool(((pre + push - 1e-4 >= bar)[:, lifted].sum(0) < need).all())

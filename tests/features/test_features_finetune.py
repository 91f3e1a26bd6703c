"""`features train --finetune-kl DIR`: the KL it minimises is the one `features eval` measures, a fine-tune lowers
the KL of a deliberately spoiled dictionary while its features keep their indices, it resumes exactly, it refuses
settings that would change its meaning, and the card states the whole recipe."""

from __future__ import annotations

import json

import pytest
import torch
from dictionary_helpers import fit_interrupted_after, tiny_dictionaries
from model_helpers import tiny_model_and_corpus

from workbench.corpus.data import ParallelData
from workbench.decoding.translator import TranslationModel
from workbench.features import SparseDictionary, resolve_site, splice_hooks
from workbench.features.evaluate import _card_training
from workbench.features.finetune import SentenceStream, spliced_terms
from workbench.features.sites import site_of, site_rows
from workbench.features.train import FeatureTrainConfig, FeatureTrainer


def _cfg(out_dir, **over) -> FeatureTrainConfig:
    return FeatureTrainConfig(**{"checkpoint": "tiny", "site": "hook_memory", "out_dir": str(out_dir), "d_sae": 64,
                                 "k": 4, "activations": 16 * 40, "batch": 16, "buffer": 64, "max_tokens": 64,
                                 "warmup": 2, "lr": 1e-2, "log_every": 4, "progress": "none", "dead_after": 40} | over)


def _finetune_cfg(out_dir, start, **over) -> FeatureTrainConfig:
    return _cfg(out_dir, **{"finetune_kl": str(start), "kl_steps": 12, "kl_tokens": 64, "kl_lr": 3e-3} | over)


@torch.no_grad()
def _eval_spliced(model, data: ParallelData, d: SparseDictionary) -> tuple[float, float]:
    """(mean KL(clean ‖ spliced), mean next-token cross-entropy on the reference) per target token, with `d` spliced
    as `features eval` splices (`splice_hooks`)."""
    kl, ce, n = 0.0, 0.0, 0
    for idx in data.batches(256, shuffle=False):
        batch = data.collate(idx, model.cfg)
        mask = batch.tgt_out != model.cfg.pad_id
        clean = model(batch.src, batch.tgt_in)[mask].float().log_softmax(-1)
        with model.hooks(splice_hooks(site_of(d), d)):
            logits = model(batch.src, batch.tgt_in)[mask].float()
        spliced = logits.log_softmax(-1)
        kl += float((clean.exp() * (clean - spliced)).sum())
        ce += float(torch.nn.functional.cross_entropy(logits, batch.tgt_out[mask], reduction="sum"))
        n += int(mask.sum())
    return kl / n, ce / n


def _eval_kl(model, data: ParallelData, d: SparseDictionary) -> float:
    return _eval_spliced(model, data, d)[0]


def _eval_ce(model, data: ParallelData, d: SparseDictionary) -> float:
    return _eval_spliced(model, data, d)[1]


@pytest.fixture(scope="module")
def spoiled(tmp_path_factory):
    """A dictionary trained on reconstruction, then spoiled: noise on its decoder rows (renormalised)."""
    model, data = tiny_model_and_corpus()
    root = tmp_path_factory.mktemp("start")
    d = FeatureTrainer(_cfg(root / "run"), translation_model=TranslationModel(model, None), data=data).fit()
    with torch.no_grad():
        d.W_dec.add_(0.6 * torch.randn(d.W_dec.shape, generator=torch.Generator().manual_seed(5)))
        d.normalize_decoder()
    d.save(root / "spoiled", files={"training.json": (root / "run" / "dictionary" / "training.json").read_text()})
    return model, data, root / "spoiled"


@pytest.mark.parametrize("site", ["hook_memory", "dec.1.cross_attn.hook_out", "dec.0.ffn"])
def test_the_kl_and_ce_minimised_are_those_the_evaluation_measures(site):
    model, data = tiny_model_and_corpus()
    d = next(v for k, v in tiny_dictionaries(model).items() if k == site or k.startswith(site))
    batch = data.collate(data.batches(256, shuffle=False)[0], model.cfg)
    one = ParallelData([data.src[i] for i in data.batches(256, shuffle=False)[0]],
                       [data.tgt[i] for i in data.batches(256, shuffle=False)[0]])
    terms = spliced_terms(model, resolve_site(model, site), d, batch)
    assert float(terms.kl) == pytest.approx(_eval_kl(model, one, d), rel=1e-4, abs=1e-7)
    assert float(terms.ce) == pytest.approx(_eval_ce(model, one, d), rel=1e-4)
    assert float(terms.kl) > 0 and terms.rows > 0 and terms.fvu.requires_grad
    assert all(p.requires_grad for p in model.parameters())  # the model is left as it was


def test_finetune_lowers_the_kl_of_a_spoiled_dictionary_and_keeps_feature_indices(tmp_path, spoiled):
    model, data, start = spoiled
    before = SparseDictionary.load(start)
    trainer = FeatureTrainer(_finetune_cfg(tmp_path / "ft", start, kl_steps=40), translation_model=TranslationModel(
        model, None), data=data)
    assert torch.equal(trainer.dictionary.W_dec, before.W_dec)  # it starts from the trained weights
    after = trainer.fit()
    kl_before, kl_after = _eval_kl(model, data, before), _eval_kl(model, data, after)
    assert kl_after < 0.7 * kl_before, (kl_before, kl_after)
    log = trainer.log
    assert all(r["l0"] <= 4 for r in log) and all(r["kl"] > 0 for r in log)
    # feature i is still feature i: each decoder row is nearest its own start row
    cos = torch.nn.functional.normalize(after.W_dec, dim=1) @ torch.nn.functional.normalize(before.W_dec, dim=1).T
    assert torch.equal(cos.argmax(1), torch.arange(cos.size(0)))
    saved = tmp_path / "ft" / "dictionary"
    meta = json.loads((saved / "cfg.json").read_text())["metadata"]["workbench"]
    assert meta["finetuned_from"] == str(start)
    training = json.loads((saved / "training.json").read_text())
    assert training["finetuned_from"]["directory"] == str(start)
    assert training["finetuned_from"]["training"]["config"]["finetune_kl"] == ""  # the start's own record


def test_the_ce_term_lowers_the_spliced_cross_entropy_further_than_the_kl_alone(tmp_path, spoiled):
    model, data, start = spoiled
    tm = TranslationModel(model, None)

    def finetuned(name: str, **over) -> tuple[float, FeatureTrainer]:
        trainer = FeatureTrainer(_finetune_cfg(tmp_path / name, start, kl_steps=30, **over), translation_model=tm,
                                 data=data)
        return _eval_ce(model, data, trainer.fit()), trainer
    ce_start = _eval_ce(model, data, SparseDictionary.load(start))
    ce_kl, _ = finetuned("kl")
    ce_both, trainer = finetuned("ce", finetune_ce=5.0)
    assert ce_both < ce_kl < ce_start, (ce_start, ce_kl, ce_both)
    assert all(r["ce"] > 0 for r in trainer.log)
    training = json.loads((tmp_path / "ce" / "dictionary" / "training.json").read_text())
    assert training["config"]["finetune_ce"] == 5.0
    assert "5 x the spliced cross-entropy" in "\n".join(_card_training(training, training["config"], "topk"))


@pytest.mark.parametrize("over", [{}, {"dense_cap": 0.1, "dense_rate": 0.05}, {"finetune_ce": 1.0}])
def test_finetune_resumes_exactly(tmp_path, spoiled, over):
    model, data, start = spoiled
    tm = TranslationModel(model, None)
    whole = FeatureTrainer(_finetune_cfg(tmp_path / "a", start, **over), translation_model=tm, data=data).fit()
    first = FeatureTrainer(_finetune_cfg(tmp_path / "b", start, **over), translation_model=tm, data=data)
    fit_interrupted_after(first, 5)  # Ctrl-C during step 5: the loop stops after it and saves
    assert first.interrupted and first.step == 5
    resumed = FeatureTrainer(_finetune_cfg(tmp_path / "b", start, **over), translation_model=tm, data=data)
    assert resumed.step == 5
    out = resumed.fit()
    for (k, a), b in zip(whole.state_dict().items(), out.state_dict().values()):
        assert torch.equal(a, b), k
    assert [r["step"] for r in resumed.log] == [4, 8, 12]


def test_dense_cap_holds_back_features_that_fire_too_often(tmp_path):
    model, data = tiny_model_and_corpus()
    tm = TranslationModel(model, None)
    trainer = FeatureTrainer(_cfg(tmp_path / "run"), translation_model=tm, data=data)
    trainer.fit()
    x = torch.cat([site_rows(model, data.collate(idx, model.cfg), trainer.site)[0] for idx in data.batches(256)])
    start = tmp_path / "run" / "dictionary"

    def top_rate(**over) -> float:
        d = FeatureTrainer(_finetune_cfg(tmp_path / str(len(over)), start, kl_steps=30, **over), translation_model=tm,
                           data=data).fit()
        with torch.no_grad():
            return float((d.encode(x) > 0).float().mean(0).max())
    cap = 0.15
    assert top_rate() > cap  # without the cap some feature fires on more than 15 % of the rows
    assert top_rate(dense_cap=cap, dense_rate=0.05) < cap

    def card(run: str, **config) -> str:  # the card's training lines from a run's training.json
        training = json.loads((tmp_path / run / "dictionary" / "training.json").read_text())
        return "\n".join(_card_training(training, training["config"] | config, "topk"))
    held = "Dense features held back: while a feature's running firing rate"
    assert held in card("2") and "exceeded 0.15, its encoder bias stepped down by 0.05 x" in card("2")  # the fine-tune
    assert held not in card("0") and held not in card("run")
    assert "exceeded 0.095" in card("run", dense_cap=0.095, dense_rate=0.01)  # a training from scratch states it too


def test_sentence_stream_covers_the_corpus_once_per_epoch_in_a_new_order():
    model, data = tiny_model_and_corpus()
    stream = SentenceStream(data, model.cfg, tokens=64, seed=0)
    first = [stream.next_batch()[0] for _ in range(len(data.batches(64, seed=1, epoch=0)))]
    assert stream.epoch == 1 and stream.pos == 0
    assert sum(b.src.size(0) for b in first) == len(data)
    state = stream.state_dict()
    again = SentenceStream(data, model.cfg, tokens=64, seed=0)
    again.load_state_dict(state)
    assert torch.equal(again.next_batch()[0].src, stream.next_batch()[0].src)


@pytest.mark.parametrize("over,match", [({"k": 5}, "k: 4 there, 5 here"), ({"cache": True}, "--cache"),
                                        ({"readout": True}, "--readout"), ({"kl_coef": 1.0}, "--kl-coef"),
                                        ({"kl_steps": 0}, "--kl-steps")])
def test_finetune_refuses_what_would_change_its_meaning(tmp_path, spoiled, over, match):
    model, data, start = spoiled
    with pytest.raises(ValueError, match=match):
        FeatureTrainer(_finetune_cfg(tmp_path / "x", start, **over), translation_model=TranslationModel(model, None),
                       data=data)


def test_the_card_states_the_start_and_the_finetune(tmp_path, spoiled):
    model, data, start = spoiled
    trainer = FeatureTrainer(_finetune_cfg(tmp_path / "ft", start, kl_steps=3, extra={"command": "FT-COMMAND"}),
                             translation_model=TranslationModel(model, None), data=data)
    trainer.fit()
    training = json.loads((tmp_path / "ft" / "dictionary" / "training.json").read_text())
    training["finetuned_from"]["training"]["config"]["extra"]["command"] = "START-COMMAND"
    text = "\n".join(_card_training(training, training["config"], "topk"))
    assert "START-COMMAND" in text and "FT-COMMAND" in text
    assert "KL(clean" in text and "feature indices" in text


def test_a_finetune_of_a_finetune_states_every_stage(tmp_path, spoiled):
    model, data, start = spoiled
    tm = TranslationModel(model, None)
    FeatureTrainer(_finetune_cfg(tmp_path / "one", start, kl_steps=3, extra={"command": "FT1"}), translation_model=tm,
                   data=data).fit()
    FeatureTrainer(_finetune_cfg(tmp_path / "two", tmp_path / "one" / "dictionary", kl_steps=3,
                                 extra={"command": "FT2"}), translation_model=tm, data=data).fit()
    training = json.loads((tmp_path / "two" / "dictionary" / "training.json").read_text())
    text = "\n".join(_card_training(training, training["config"], "topk"))
    assert text.count("Then fine-tuned end to end") == 2 and "`FT1`" in text and "`FT2`" in text
    assert text.index("FT1") < text.index("FT2")  # in the order they ran

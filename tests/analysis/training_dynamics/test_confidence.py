"""The label-smoothing view's numbers: the smoothed optimum, and the model's confidence on held-out text checked
against the trainer's own loss (two ways: the sum of -log p(reference) is the teacher-forced NLL)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from model_helpers import ROOT, SHARED_DATA, make_model

from workbench import presets
from workbench.analysis.training_dynamics.confidence import (
    checkpoint_confidence,
    gold_confidence,
    held_out_text,
    smoothed_gold_mass,
)
from workbench.charts import confidence_chart
from workbench.core.batching import teacher_forced
from workbench.training.loss import smoothed_distribution, teacher_forced_loss


def test_the_optimum_is_the_smoothed_targets_mass_and_minimises_the_loss():
    vocab, eps = 10, 0.1
    target = smoothed_distribution(torch.tensor([3]), vocab, eps, -1)[0].double()
    assert smoothed_gold_mass(vocab, eps) == pytest.approx(float(target[3]))
    # the cross-entropy against the smoothed target, with the rest of the mass spread evenly, is lowest there
    p = torch.linspace(0.5, 0.999, 2000, dtype=torch.float64)
    pred = ((1 - p) / (vocab - 1))[:, None].repeat(1, vocab)
    pred[:, 3] = p
    loss = -(target * pred.log()).sum(-1)
    assert float(p[loss.argmin()]) == pytest.approx(smoothed_gold_mass(vocab, eps), abs=1e-3)
    with pytest.raises(ValueError, match="smoothing"):
        smoothed_gold_mass(10, 1.0)


def test_reference_probabilities_are_the_teacher_forced_nll():
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    g = torch.Generator().manual_seed(0)
    sources = [[*torch.randint(4, 50, (n,), generator=g).tolist(), cfg.eos_id] for n in (3, 7, 5, 9)]
    outputs = [[*torch.randint(4, 50, (n,), generator=g).tolist(), cfg.eos_id] for n in (4, 2, 8, 6)]
    conf = gold_confidence(model, sources, outputs, smoothing=0.1, batch_size=3)  # two batches
    assert conf.gold.shape == conf.top.shape == (sum(map(len, outputs)),)
    assert ((conf.gold > 0) & (conf.gold <= conf.top + 1e-12) & (conf.top <= 1)).all()
    batch = teacher_forced(sources, outputs, pad_id=cfg.pad_id, start_id=cfg.start_id)
    _, nll, n = teacher_forced_loss(model, batch.src, batch.tgt_in, batch.tgt_out, smoothing=0.0)
    assert int(n) == conf.gold.size
    assert -np.log(conf.gold).sum() == pytest.approx(float(nll), rel=1e-5)


def test_the_shipped_model_measured_on_its_validation_text(monkeypatch):
    import workbench

    monkeypatch.setenv("WORKBENCH_DATA", str(SHARED_DATA))
    tm = workbench.load(ROOT / "checkpoints" / "multi30k-de-en")
    conf, name = checkpoint_confidence(tm, limit=50)
    assert name.startswith("multi30k") and conf.sentences == 50 and conf.smoothing == 0.1
    assert 0.5 < float(np.median(conf.gold)) < 1.0  # a trained model: confident, not certain
    assert math.isclose(conf.optimum, 0.9 + 0.1 / tm.model.cfg.tgt_vocab)
    assert "above the smoothed optimum" in conf.summary()
    spec = confidence_chart(conf).to_dict()
    assert "smoothed optimum" in str(spec)


def test_no_local_text_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_DATA", str(tmp_path))
    with pytest.raises(ValueError, match=r"no local validation text for multi30k") as info:
        held_out_text({"dataset": "multi30k", "src_lang": "de", "tgt_lang": "en"})
    assert str(tmp_path) not in str(info.value)  # no server path: the message reaches a web page
    with pytest.raises(ValueError, match="stores no training dataset"):
        held_out_text(None)
    assert not any(Path(tmp_path).iterdir())  # nothing was downloaded

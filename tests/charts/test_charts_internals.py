"""Model-internals views: PE equals the paper's formula, label smoothing, schedules, curves, masks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from model_helpers import make_batch

from workbench import presets
from workbench.charts.heatmap import IMAGE_NAME
from workbench.charts.internals import (
    label_smoothing_data,
    lr_schedule_chart,
    lr_schedule_data,
    mask_view,
    position_table,
    positional_encoding_view,
    training_curves_chart,
    training_curves_data,
)
from workbench.core.masks import causal_mask


def _paper_pe(length, d):
    """Section 3.5 of the paper, written out independently: PE(pos, 2i) = sin(pos / 10000^(2i/d)), 2i+1: cos."""
    pe = np.zeros((length, d))
    for pos in range(length):
        for i in range(0, d, 2):
            pe[pos, i] = math.sin(pos / 10000 ** (i / d))
            pe[pos, i + 1] = math.cos(pos / 10000 ** (i / d))
    return pe


def test_pe_view_shows_the_configs_formula():
    cfg = presets.tiny(vocab=20)  # sinusoidal, d=32
    layout = positional_encoding_view(cfg, length=40, dims=(0, 1, 6))
    first_row = layout.children[0]
    matrix = first_row.children[0].select_one({"name": IMAGE_NAME}).data_source.data["image"][0]
    np.testing.assert_allclose(matrix, _paper_pe(40, 32), atol=1e-5)
    assert "sinusoidal:" in first_row.children[0].title.text
    curve = first_row.children[1].renderers[2].data_source.data["y"]  # dim 6
    np.testing.assert_allclose(curve, _paper_pe(40, 32)[:, 6], atol=1e-5)
    sim = first_row.children[2].select_one({"name": IMAGE_NAME}).data_source.data["image"][0]
    np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-5)
    assert len(layout.children) == 3  # the config's kind, then the two other sinusoidal layouts


def test_learned_positions_need_the_model_and_bad_dims_are_refused():
    with pytest.raises(ValueError, match="pass model="):
        position_table("learned", 10, 32)
    with pytest.raises(ValueError, match="dims \\[40\\] out of range"):
        positional_encoding_view(presets.tiny(), dims=(40,))


def test_label_smoothing_penalises_over_confidence():
    vocab, smoothing = 10, 0.1
    bars, curve = label_smoothing_data(vocab, smoothing, target=2)
    np.testing.assert_allclose(bars["probability"].sum(), 1.0)
    assert bars["probability"][2] == pytest.approx(1 - smoothing + smoothing / vocab)
    smoothed = curve[curve.target == "smoothed"]
    one_hot = curve[curve.target == "one-hot"]
    best = smoothed.confidence.iloc[int(smoothed.loss.argmin())]
    assert best == pytest.approx(1 - smoothing + smoothing / vocab, abs=0.01)  # minimum below certainty
    assert smoothed.loss.iloc[-1] > smoothed.loss.min() + 0.3  # confidence -> 1 is penalised
    assert (np.diff(one_hot.loss.to_numpy()) < 0).all()  # without smoothing, more confidence is always better


def test_lr_chart_data_comes_from_the_schedules_and_the_log():
    from workbench.training.schedule import noam

    log = [{"step": s, "lr": 1e-4 * s} for s in range(1, 50, 7)] + [{"step": 60, "loss": 1.0}]
    data = lr_schedule_data({"mine": {"name": "noam", "d_model": 64, "warmup": 30, "factor": 2.0}}, steps=100,
                            log=log)
    mine = data[data.schedule == "mine"]
    np.testing.assert_allclose(mine.lr, [noam(int(s), d_model=64, warmup=30, factor=2.0) for s in mine.step])
    assert len(data[data.schedule == "logged (checkpoint)"]) == 7
    assert lr_schedule_chart(steps=500).to_dict()["mark"]["type"] == "line"
    with pytest.raises(ValueError, match="no rows with both"):
        lr_schedule_data(steps=100, log=[{"step": 1}])


def test_training_curves_from_log_rows():
    log = [{"step": s, "loss": 5 - s / 10, "valid_loss": (4.0 if s % 20 == 0 else None), "epoch": 0}
           for s in range(0, 50, 5)]
    data = training_curves_data(log)
    assert set(data.metric) == {"loss", "valid_loss"}
    assert len(data[data.metric == "valid_loss"]) == 3
    assert training_curves_chart(log).to_dict()["facet"]["field"] == "metric"
    with pytest.raises(ValueError, match="'step'"):
        training_curves_data([{"loss": 1.0}])


def test_mask_view_draws_the_models_masks():
    cfg = presets.tiny(vocab=30)
    src, tgt = make_batch(cfg, batch=3, src_len=7, tgt_len=6)  # sentence 0: 2 padded source positions
    layout = mask_view(src, tgt, pad_id=cfg.pad_id, batch=0)
    figures, legend = layout.children  # the three masks in a row, then their legend
    src_pad, causal, cross = (f.select_one({"name": IMAGE_NAME}).data_source.data["image"][0] for f in figures.children)
    assert "may attend (1)" in legend.text and "masked (0)" in legend.text
    np.testing.assert_array_equal(src_pad, (src != cfg.pad_id).float().numpy())
    np.testing.assert_array_equal(causal, causal_mask(6).float().numpy())
    assert (cross[:, 5:] == 0).all() and (cross[:, :5] == 1).all()

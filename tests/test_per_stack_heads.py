"""A model whose encoder and decoder have their own head counts and FFN widths, through the analyses
that enumerate heads (corpus head statistics, head importance) and the analysis CLI's head count."""

from __future__ import annotations

import numpy as np
import pytest
from model_helpers import make_model

from workbench import presets
from workbench.analysis.head_stats import HeadStats, corpus_head_stats
from workbench.analysis.interventions_effect import head_importance

SOURCES = [[5, 6, 7, 2], [8, 9, 2], [10, 11, 12, 13, 2]]
TARGETS = [[6, 7, 2], [9, 2], [11, 12, 2]]


def _model():
    return make_model(presets.tiny(vocab=20, enc_heads=2, dec_heads=8, enc_d_ff=48, dec_d_ff=80), seed=3)


def test_head_stats_list_each_block_with_its_own_heads():
    stats = corpus_head_stats(_model(), SOURCES, TARGETS, batch_size=2)
    assert stats.n_heads == 8 and stats.block_heads == (2, 2, 8, 8, 8, 8)
    table = stats.summary()
    assert table.groupby("kind").size().to_dict() == {"enc_self": 2 * 2, "dec_self": 2 * 8, "cross": 2 * 8}
    values = stats.values("entropy")
    assert np.isnan(values[0, 2:]).all() and np.isfinite(values[0, :2]).all() and np.isfinite(values[2]).all()
    assert len(stats.sentences("cross", 1, 7, "entropy")) == 3
    with pytest.raises(IndexError, match=r"head 2 out of range: block \('enc_self', 0\) has 2 heads"):
        stats.sentences("enc_self", 0, 2, "entropy")
    again = HeadStats.concat([stats, stats])
    assert again.block_heads == stats.block_heads and len(again.summary()) == len(table)


def test_head_importance_ablates_every_head_of_each_stack():
    table = head_importance(_model(), SOURCES, TARGETS, max_len_b=6)
    assert table.groupby("kind")["head"].max().to_dict() == {"enc_self": 1, "dec_self": 7, "cross": 7}
    assert len(table) == 2 * 2 + 2 * 8 + 2 * 8

"""A model whose encoder and decoder have their own head counts and FFN widths, through the analyses
that enumerate heads (corpus head statistics, head importance) and the attention views."""

from __future__ import annotations

import numpy as np
import pytest
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.analysis.attention.head_stats import HeadStats, corpus_head_stats
from workbench.analysis.circuits.interventions_effect import head_importance
from workbench.charts.head_view import head_view
from workbench.charts.model_view import model_view
from workbench.charts.select import combined_attention, select_attention

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
    assert table.groupby("kind")["head_index"].max().to_dict() == {"enc_self": 1, "dec_self": 7, "cross": 7}
    assert len(table) == 2 * 2 + 2 * 8 + 2 * 8


def test_views_draw_each_stack_with_its_own_heads():
    model = _model()
    src, tgt = make_batch(model.cfg)
    _, trace = model.run_with_cache(src, tgt, names="*.hook_probs")
    assert select_attention(trace, "enc_self", 0).values.shape[0] == 2
    assert select_attention(trace, "cross", 1).values.shape[0] == 8
    model_view(trace)
    head_view(trace, "cross")
    assert combined_attention(trace, 1, heads=[0, 1]).values.shape[0] == 2
    with pytest.raises(ValueError, match=r"2 encoder and 8 decoder heads are selected; choose heads both stacks "
                                         r"have \(0\.\.1\)"):
        combined_attention(trace, 0)

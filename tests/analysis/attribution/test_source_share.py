"""Low-source-share thresholds, token and sentence level, against hand-computed quantiles."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.analysis.attribution.source_share import LowShareThresholds, by_position, position_trend, sentence_share


def test_sentence_share_is_the_mean_without_eos():
    assert sentence_share(np.array([0.9, 0.5, 0.1])) == pytest.approx(0.7)
    assert sentence_share(np.array([0.2])) == pytest.approx(0.2)  # an output that is EOS alone


def test_position_trend_is_the_rank_correlation_after_the_first_position():
    spearmanr = pytest.importorskip("scipy.stats").spearmanr

    rng = np.random.default_rng(0)
    falling = [np.r_[0.95, np.linspace(0.8, 0.5, n) + rng.normal(0, 0.01, n), 0.1] for n in (9, 9, 9, 9, 9, 4)]
    pos = by_position(falling)
    kept = [t for t, (_, n) in pos.items() if t >= 1 and n >= 5]
    assert kept == list(range(1, 10))  # position 0 and the positions fewer than five outputs reach are left out
    expected = spearmanr(kept, [pos[t][0] for t in kept]).statistic
    assert position_trend(pos) == pytest.approx(expected) and position_trend(pos) < -0.9
    rising = by_position([s[::-1] for s in falling], skip_last=False)
    assert position_trend(rising, start=0, min_tokens=6) > 0
    assert np.isnan(position_trend({0: (0.9, 10), 1: (0.8, 10)}))


def test_thresholds_are_quantiles_of_clean_tokens_and_sentences():
    rng = np.random.default_rng(0)
    shares = [rng.uniform(0.3, 1.0, size=n) for n in rng.integers(3, 12, size=60)]
    pieces = [["▁w" if i % 3 else "x" for i in range(len(s))] for s in shares]  # every third piece continues
    thr = LowShareThresholds.fit(shares, pieces, quantile=0.1)
    starts = [v for s, p in zip(shares, pieces) for v, q in zip(s[:-1], p[:-1]) if q.startswith("▁")]
    conts = [v for s, p in zip(shares, pieces) for v, q in zip(s[:-1], p[:-1]) if not q.startswith("▁")]
    assert thr.start == pytest.approx(np.quantile(starts, 0.1))
    assert thr.continuation == pytest.approx(np.quantile(conts, 0.1))
    assert thr.sentence == pytest.approx(np.quantile([s[:-1].mean() for s in shares], 0.1))
    low = np.array([thr.sentence - 0.05] * 4 + [1.0])  # EOS's share does not count
    assert thr.flag_sentence(low) and not thr.flag_sentence(np.array([thr.sentence + 0.01] * 3 + [0.0]))
    assert thr.flag(np.array([thr.start - 1e-3, thr.start + 1e-3, 0.0]), ["▁a", "▁b", "</s>"]) == [True, False, False]


def test_thresholds_without_a_sentence_level_say_so():
    with pytest.raises(ValueError, match="no sentence level"):
        LowShareThresholds(0.5, 0.4, 0.05, 100).flag_sentence(np.array([0.1, 0.2]))

"""Low-source-share thresholds, token and sentence level, against hand-computed quantiles."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.analysis.attribution.source_share import LowShareThresholds, sentence_share


def test_sentence_share_is_the_mean_without_eos():
    assert sentence_share(np.array([0.9, 0.5, 0.1])) == pytest.approx(0.7)
    assert sentence_share(np.array([0.2])) == pytest.approx(0.2)  # an output that is EOS alone


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

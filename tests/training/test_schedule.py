import math

import pytest

from workbench.training.schedule import budget_cosine, constant, inverse_sqrt, make_schedule, noam, warmup_cosine


def test_noam_matches_formula_and_peaks_at_warmup():
    d, w, f = 512, 4000, 2.0
    for step in (1, 10, 3999, 4000, 4001, 100_000):
        expected = f * d**-0.5 * min(step**-0.5, step * w**-1.5)
        assert noam(step, d_model=d, warmup=w, factor=f) == pytest.approx(expected, rel=1e-12)
    values = [noam(s, d_model=d, warmup=w) for s in range(1, 20_000)]
    assert max(range(len(values)), key=values.__getitem__) + 1 == w
    assert max(values) == pytest.approx((d * w) ** -0.5)


def test_step_zero_is_zero_not_an_error():
    assert noam(0, d_model=512, warmup=4000) == 0.0
    assert inverse_sqrt(0, peak_lr=1e-3, warmup=10) == 0.0
    assert warmup_cosine(0, peak_lr=1e-3, warmup=10, total=100) == 0.0
    assert constant(0, lr=1e-3, warmup=10) == 0.0
    assert constant(0, lr=1e-3) == 1e-3


def test_inverse_sqrt_equals_noam_with_matching_peak():
    d, w = 256, 1000
    peak = (d * w) ** -0.5
    for step in (1, 500, 1000, 1001, 50_000):
        assert inverse_sqrt(step, peak_lr=peak, warmup=w) == pytest.approx(noam(step, d_model=d, warmup=w))


def test_warmup_cosine_shape():
    kw = dict(peak_lr=1.0, warmup=10, total=110, min_lr=0.1)
    assert warmup_cosine(5, **kw) == pytest.approx(0.5)
    assert warmup_cosine(10, **kw) == pytest.approx(1.0)
    assert warmup_cosine(60, **kw) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 2)))
    assert warmup_cosine(110, **kw) == pytest.approx(0.1)
    assert warmup_cosine(1000, **kw) == pytest.approx(0.1)


def test_make_schedule_binds_and_validates():
    fn = make_schedule("noam", d_model=512, warmup=4000, factor=1.0)
    assert fn(4000) == noam(4000, d_model=512, warmup=4000)
    with pytest.raises(ValueError, match="unknown schedule 'nom'"):
        make_schedule("nom")
    with pytest.raises(ValueError, match="noam"):
        make_schedule("noam", d_model=512)  # warmup missing
    with pytest.raises(ValueError, match="negative"):
        noam(-1, d_model=512, warmup=10)


def test_budget_cosine_runs_from_one_to_zero_and_clamps():
    assert budget_cosine(0.0) == 1.0 and budget_cosine(1.0) == 0.0
    assert budget_cosine(0.5) == pytest.approx(0.5)
    assert budget_cosine(-0.1) == 1.0 and budget_cosine(1.7) == 0.0
    values = [budget_cosine(i / 20) for i in range(21)]
    assert values == sorted(values, reverse=True)

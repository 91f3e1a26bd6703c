"""The Why analyses on the shipped post-norm de->en model: exact sums with frozen norms, a real noun swap."""

from pathlib import Path

import pytest
import torch

from workbench.analysis import direct_logit_attribution, logit_diff, patching_sweep, source_attribution
from workbench.analysis.circuits.contrast import noun_swaps

CKPT = Path(__file__).resolve().parents[3] / "checkpoints" / "multi30k-de-en"
pytestmark = pytest.mark.skipif(not CKPT.is_dir(), reason="shipped checkpoint not present")


@pytest.fixture(scope="module")
def tm():
    from workbench import load

    return load(str(CKPT))


@pytest.fixture(scope="module")
def pair(tm):
    pairs = noun_swaps(tm, ["Ein Mann spielt Gitarre auf der Straße."])
    assert len(pairs) == 1
    return pairs[0]


def test_noun_swap_pair_is_a_real_contrast(tm, pair):
    assert pair.src.shape == pair.corrupted_src.shape and pair.good != pair.bad
    metric = logit_diff(pair.position, pair.good, pair.bad)
    model = tm.model
    assert metric(model(pair.src, pair.tgt)).item() > 0  # greedy chose `good` on the clean source
    assert metric(model(pair.corrupted_src, pair.tgt)).item() < 0  # and `bad` where the corrupted output agrees


def test_dla_on_the_post_norm_model_sums_to_the_logit_difference(tm, pair):
    dla = direct_logit_attribution(tm.model, pair.src, pair.tgt, pair.position, pair.good, baseline_token=pair.bad)
    real = logit_diff(pair.position, pair.good, pair.bad)(tm.model(pair.src, pair.tgt)).item()
    assert dla.values.sum().item() == pytest.approx(real, abs=1e-3)
    per_src = source_attribution(tm.model, pair.src, pair.tgt, pair.position, pair.good, baseline_token=pair.bad)
    cross = [dla.labels.index(f"cross:{i}:{h}") for i in range(4) for h in range(4)]
    torch.testing.assert_close(per_src.sum(-1).flatten(), dla.values[cross], atol=1e-5, rtol=0)


def test_denoising_the_swapped_source_position_in_the_embedding_restores_the_clean_metric(tm, pair):
    res = patching_sweep(tm.model, pair.src, pair.tgt, corrupted_src=pair.corrupted_src, sites="resid_enc",
                         metric=logit_diff(pair.position, pair.good, pair.bad), direction="denoising")
    # the embedding row differs from the corrupted run only at the swapped noun
    assert res.values[0, pair.swapped].item() == pytest.approx(res.clean_metric, abs=1e-4)
    others = [c for c in range(res.values.size(1)) if c != pair.swapped]
    torch.testing.assert_close(res.values[0, others], torch.full((len(others),), res.corrupted_metric,
                                                                 dtype=torch.float64), atol=1e-4, rtol=0)

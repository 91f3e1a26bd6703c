"""The baselines a dictionary's card stands beside: PCA at L0 equals a projection computed by SVD (full rank:
exact), a transcoder's PCA is reduced-rank regression (full rank: the least-squares map), the random dictionary
keeps k codes and its scale is the least-squares one; and the README's and docs' tables say what the cards say."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from workbench.features.baselines import Moments, PCABaseline, RandomTopK

ROOT = Path(__file__).resolve().parents[2]


def _rows(n=3000, d=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=g) * torch.linspace(3, 0.1, d)[:, None]  # uneven variances
    return torch.randn(n, d, generator=g) @ mix + torch.randn(d, generator=g)


def _moments(x, y=None):
    m = Moments(x.size(1), None if y is None else y.size(1))
    for i in range(0, x.size(0), 700):  # in batches, as the evaluation feeds it
        m.update(x[i : i + 700], None if y is None else y[i : i + 700])
    return m


def test_pca_at_rank_r_is_the_svd_projection_and_exact_at_full_rank():
    x = _rows()
    m = _moments(x)
    xc = (x - x.mean(0)).double()
    _, _, vt = torch.linalg.svd(xc, full_matrices=False)
    for r in (1, 4, 12):
        pca = PCABaseline.fit(m, r)
        want = x.mean(0).double() + xc @ vt[:r].T @ vt[:r]
        assert torch.allclose(pca(x).double(), want, atol=1e-3)
        assert pca.encode(x).shape == (x.size(0), r) and pca.l0 == r
    assert torch.allclose(PCABaseline.fit(m, 12)(x), x, atol=1e-3)


def test_transcoder_pca_is_reduced_rank_regression():
    x = _rows(d=10)
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(10, 6, generator=g), torch.randn(6, generator=g)
    y = torch.relu(x) @ w + b  # not linear: the least-squares map is the best linear predictor only
    m = _moments(x, y)
    xa = torch.cat([x, torch.ones(x.size(0), 1)], 1).double()
    coef = torch.linalg.lstsq(xa, y.double()).solution
    ols = xa @ coef
    assert torch.allclose(PCABaseline.fit(m, 6)(x).double(), ols, atol=1e-3)
    # rank 2: the top-2 principal directions of the least-squares predictions
    oc = ols - ols.mean(0)
    _, _, vt = torch.linalg.svd(oc, full_matrices=False)
    want = ols.mean(0) + oc @ vt[:2].T @ vt[:2]
    assert torch.allclose(PCABaseline.fit(m, 2)(x).double(), want, atol=1e-3)


def test_random_dictionary_keeps_k_codes_and_the_least_squares_scale():
    x = _rows(d=16)
    m = _moments(x)
    rnd = RandomTopK.fit(m, n=256, k=5, x=x[:1000], seed=3)
    codes = rnd.encode(x)
    assert codes.shape == (x.size(0), 256) and int((codes != 0).sum(1).max()) <= 5 and bool((codes >= 0).all())
    assert torch.allclose(rnd.directions.norm(dim=1), torch.ones(256), atol=1e-5)
    err = lambda: float((rnd(x[:1000]) - x[:1000]).pow(2).sum())
    best = err()
    scale = float(rnd.scale)
    for f in (0.9, 1.1):  # the fitted scale minimises the error on its fit rows
        rnd.scale.fill_(scale * f)
        assert err() > best
    again = RandomTopK.fit(m, n=256, k=5, x=x[:1000], seed=3)
    assert torch.equal(again.directions, rnd.directions)  # seeded
    # forward and encode_decode rebuild from the k kept codes alone: the dense decode of the dense codes
    rnd.scale.fill_(scale)
    codes, out = rnd.encode_decode(x.view(10, -1, 16))
    assert torch.equal(codes, rnd.encode(x.view(10, -1, 16)))
    assert torch.allclose(out, rnd.decode(codes), atol=1e-5) and torch.allclose(rnd(x), rnd.decode(rnd.encode(x)),
                                                                                atol=1e-5)


def _table_script():
    spec = importlib.util.spec_from_file_location("features_table", ROOT / "scripts" / "features_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_and_docs_tables_match_the_cards():
    mod = _table_script()
    checkpoints = sorted(p.parent for p in (ROOT / "checkpoints").glob("*/features"))
    if not checkpoints:
        pytest.fail("no checkpoints/*/features: the shipped dictionaries are missing")
    for path, table in mod.tables(checkpoints).items():
        assert mod.between_markers(path.read_text(encoding="utf-8")) == table, \
            f"{path.name}'s features table is not the cards': run python scripts/features_table.py"

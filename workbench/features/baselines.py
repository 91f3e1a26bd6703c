"""What a dictionary is compared with at the same L0: PCA and a random dictionary (SAEBench's baselines), fit on
other text than the evaluation's, and a transcoder's own FFN neurons.

    m = Moments(d_in, d_out)                      # running sums over the fit text: m.update(x, y) per batch
    pca = PCABaseline.fit(m, rank=64)             # an SAE: x -> top-64 principal components of x
    rnd = RandomTopK.fit(m, n=8192, k=64, x=xs, y=ys, seed=0)
    with model.hooks(splice_hooks(site, pca)):    # spliced in as a dictionary is
        ...

- PCA-L0: the `rank` = L0 leading principal components of the site's activation, mean-centred:
  out = μ + P Pᵀ (x − μ). For a transcoder the input is first mapped to the output space by the least-squares
  linear map ŷ = x W + b (fit on the same text), and the components are those of ŷ: reduced-rank regression of
  rank L0, the best linear predictor of the FFN's output through L0 dimensions.
- Random at L0: `n` random unit directions D (as many as the dictionary has features) in the output space;
  TopK encoding by projection: f = TopK_k(relu((ŷ − μ) Dᵀ)), out = μ + α f D with one scalar α fit by least
  squares on the fit text (without it the k ≈ L0 projections overshoot: their sum has k times the energy).
  Its L0 is k, the dictionary's rounded L0.
- The FFN's own neurons (transcoders): its hidden units, counted active where non-zero; the reconstruction is
  the FFN itself, exact (FVU 0, ΔCE 0), so only the counts are measured.
"""

from __future__ import annotations

import torch
from torch import nn


class Moments:
    """Float64 running sums of rows x (N, d_in) and, for transcoders, y (N, d_out): means and (cross-)covariances."""

    def __init__(self, d_in: int, d_out: int | None = None) -> None:
        self.n = 0
        self.sx = torch.zeros(d_in, dtype=torch.float64)
        self.sxx = torch.zeros(d_in, d_in, dtype=torch.float64)
        self.transcoder = d_out is not None
        if self.transcoder:
            self.sy = torch.zeros(d_out, dtype=torch.float64)
            self.sxy = torch.zeros(d_in, d_out, dtype=torch.float64)

    def update(self, x: torch.Tensor, y: torch.Tensor | None = None) -> None:
        x = x.detach().double().cpu()
        self.n += x.size(0)
        self.sx += x.sum(0)
        self.sxx += x.T @ x
        if self.transcoder:
            y = y.detach().double().cpu()
            self.sy += y.sum(0)
            self.sxy += x.T @ y

    @property
    def mean_in(self) -> torch.Tensor:
        return self.sx / self.n

    @property
    def mean_out(self) -> torch.Tensor:
        """The mean of what the site writes (a transcoder: the FFN's output): the mean-ablation value."""
        return self.sy / self.n if self.transcoder else self.mean_in

    def cov_in(self) -> torch.Tensor:
        mu = self.mean_in
        return self.sxx / self.n - torch.outer(mu, mu)

    def linear(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Least-squares y ≈ x W + b (transcoders): W (d_in, d_out), b (d_out); a tiny ridge keeps it defined."""
        cxx = self.cov_in()
        cxy = self.sxy / self.n - torch.outer(self.mean_in, self.mean_out)
        ridge = 1e-8 * float(cxx.diagonal().mean()) * torch.eye(cxx.size(0), dtype=cxx.dtype)
        w = torch.linalg.solve(cxx + ridge, cxy)
        return w, self.mean_out - self.mean_in @ w


class _Baseline(nn.Module):
    """x -> ŷ (the identity for an SAE, the least-squares map for a transcoder), then a code in the output space."""

    def __init__(self, moments: Moments) -> None:
        super().__init__()
        self.transcoder = moments.transcoder
        self.register_buffer("mean", moments.mean_out.float())
        if self.transcoder:
            w, b = moments.linear()
            self.register_buffer("W_lin", w.float())
            self.register_buffer("b_lin", b.float())

    def centred(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.W_lin + self.b_lin if self.transcoder else x
        return y - self.mean


class PCABaseline(_Baseline):
    def __init__(self, moments: Moments, rank: int) -> None:
        super().__init__(moments)
        cov = moments.cov_in()
        if self.transcoder:
            w = self.W_lin.double()
            cov = w.T @ cov @ w  # covariance of ŷ = x W + b
        values, vectors = torch.linalg.eigh(cov)  # ascending
        rank = max(1, min(int(rank), cov.size(0)))
        self.register_buffer("components", vectors[:, -rank:].flip(1).T.contiguous().float())  # (rank, d_out)
        # the share of ŷ's variance on the fit text that the components keep
        self.explained = float(values[-rank:].sum() / values.sum().clamp_min(1e-30))

    @classmethod
    def fit(cls, moments: Moments, rank: int) -> PCABaseline:
        return cls(moments, rank)

    @property
    def l0(self) -> int:
        return self.components.size(0)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.centred(x) @ self.components.T  # (..., rank): dense, every component on every token

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.mean + codes @ self.components

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))


class RandomTopK(_Baseline):
    def __init__(self, moments: Moments, n: int, k: int, *, seed: int = 0) -> None:
        super().__init__(moments)
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(n, self.mean.numel(), generator=g)
        self.register_buffer("directions", w / w.norm(dim=1, keepdim=True))  # (n, d_out), unit rows
        self.k = max(1, min(int(k), n))
        self.register_buffer("scale", torch.ones(()))

    @classmethod
    @torch.no_grad()
    def fit(cls, moments: Moments, n: int, k: int, x: torch.Tensor, y: torch.Tensor | None = None, *, seed: int = 0
            ) -> RandomTopK:
        """`x`, `y`: rows of the fit text on which the scale α is fit (least squares, one scalar)."""
        r = cls(moments, n, k, seed=seed)
        target = (y if r.transcoder else x) - r.mean
        recon = r._combine(*r._top(x))
        r.scale.fill_(float((target * recon).sum() / recon.pow(2).sum().clamp_min(1e-30)))
        return r

    @property
    def l0(self) -> int:
        return self.k

    def _top(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The k kept codes' values (ReLU) and indices, (..., k) each."""
        values, indices = (self.centred(x) @ self.directions.T).topk(self.k, dim=-1, sorted=False)
        return values.relu(), indices

    def _combine(self, values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """Σ values · D[indices] over the k kept codes: `codes @ D` without the dense (..., n) product."""
        flat = torch.nn.functional.embedding_bag(indices.reshape(-1, self.k), self.directions, mode="sum",
                                                 per_sample_weights=values.reshape(-1, self.k))
        return flat.view(*values.shape[:-1], -1)

    def _codes(self, values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(*values.shape[:-1], self.directions.size(0)).scatter_(-1, indices, values)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self._codes(*self._top(x))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.mean + self.scale * (codes @ self.directions)

    def encode_decode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(encode(x), forward(x)) with one projection and the reconstruction from the k kept codes alone."""
        values, indices = self._top(x)
        return self._codes(values, indices), self.mean + self.scale * self._combine(values, indices)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mean + self.scale * self._combine(*self._top(x))

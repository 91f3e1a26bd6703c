"""Sparse dictionaries: TopK, BatchTopK, JumpReLU and ReLU sparse autoencoders and transcoders, in SAELens's layout.

    d = SparseDictionary(DictionaryConfig("hook_memory", d_in=128, d_sae=2048, architecture="topk", k=32))
    feats = d.encode(x)                  # (..., d_sae), at most k non-zero per row
    x_hat = d.decode(feats)              # (..., d_out)
    d.save("features/hook_memory")       # cfg.json + sae_weights.safetensors
    d = SparseDictionary.load("features/hook_memory")
    sae = sae_lens.SAE.load_from_disk("features/hook_memory")   # the same encode/decode (tested)

The maths is SAELens's (its `TopKSAE`, `StandardSAE` and `Transcoder` inference classes), parameter for
parameter: `W_enc` (d_in, d_sae), `b_enc` (d_sae), `W_dec` (d_sae, d_out), `b_dec` (d_out).

- SAE (d_out = d_in): pre = (x - b_dec) @ W_enc + b_enc; TopK keeps the k largest pre-activations and
  applies ReLU to them (Gao et al. 2024); ReLU ("standard") applies ReLU to all.
- JumpReLU (Rajamanoharan et al. 2024): a learned threshold θ per latent, f = ReLU(pre)·[pre > θ]; trained with
  an L0 penalty through straight-through estimators of width `bandwidth` (SAELens's `JumpReLUSAE`, "jumprelu").
- BatchTopK (Bussmann et al. 2024): in training, the k·B largest ReLU pre-activations of a batch of B rows (k per
  row on average, more on rich rows, fewer on poor ones); at inference a JumpReLU whose threshold is the running
  mean of the smallest activation the batch kept, one value for every latent. Saved as SAELens's JumpReLU, as
  SAELens saves its `BatchTopKTrainingSAE` (the workbench keeps "batchtopk" and k in cfg.json's metadata).
- Transcoder (Dunefsky et al. 2024; an FFN's input to its output): pre = x @ W_enc + b_enc (no b_dec
  subtracted: it lives in the output space), the same activations, out = f @ W_dec + b_dec.
- Skip transcoder (Paulo et al. 2025; SAELens's `SkipTranscoder`): a transcoder plus a linear term,
  out = f @ W_dec + b_dec + x @ W_skip.T with `W_skip` (d_out, d_in): zero here as in SAELens, the least-squares
  map over the first batch in `features.train`. The linear part of the FFN goes through W_skip, so the features
  are left the non-linear part to explain; `decode` gives the features' part (with b_dec), `skip` the linear
  one, and `forward` their sum.

SAELens 6 has inference classes for TopK, ReLU and JumpReLU SAEs and for ReLU and JumpReLU transcoders with and
without the skip term; a TopK transcoder is saved with architecture "topk_transcoder" (or "topk_skip_transcoder"),
which SAELens loads once `workbench.features.sae_lens_classes.register()` has added those classes (SAELens's
`register_sae_class`).

`training_forward` computes the same reconstruction for the training loop; for TopK it touches only the
k chosen latents per row after one gradient-free dense encoder pass, so its backward costs O(B·k·d)
instead of the O(B·d_sae·d) of autograd through dense matrices (see benchmarks/bench_features.py). BatchTopK and
JumpReLU take the same path over each row's 4k largest pre-activations (a row's latent count is not fixed).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
ARCHITECTURES = ("topk", "relu", "jumprelu", "batchtopk")
THRESHOLDED = ("jumprelu", "batchtopk")
ARCHITECTURE_NAMES = {"topk": "TopK", "batchtopk": "BatchTopK", "jumprelu": "JumpReLU", "relu": "ReLU"}
ROW_CAP = 4
"""BatchTopK and JumpReLU training: a row's candidates are its ROW_CAP·k largest pre-activations (for BatchTopK, the
most a row may hold of the batch's top k·B)."""
"""Architectures whose inference is a JumpReLU with a `threshold` parameter (SAELens: "jumprelu")."""
SAE_LENS_FORMAT = "6.0.0"
"""The SAELens config format written (SAELens reads files of version >= 6.0 without conversion)."""


@dataclass(frozen=True)
class DictionaryConfig:
    hook_name: str
    """Where the dictionary reads (for a transcoder: the FFN's input)."""
    d_in: int
    d_sae: int
    architecture: str = "topk"
    """"topk" (k largest pre-activations, ReLU), "batchtopk" (k·B largest of a batch in training, a threshold at
    inference), "jumprelu" (a learned threshold per latent, an L0 penalty steered to k in training) or "relu"
    (ReLU with an L1 penalty in training)."""
    k: int = 32
    """TopK: latents per row; BatchTopK: per row on average in training; JumpReLU: the L0 training aims at."""
    d_out: int | None = None
    """Transcoders: the output size; None: an autoencoder (d_out = d_in)."""
    hook_name_out: str | None = None
    """Transcoders: the hook whose activation the dictionary predicts (the FFN's output)."""
    skip: bool = False
    """Transcoders: add the linear skip term x @ W_skip.T to the output (a skip transcoder)."""
    model_name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else to keep in cfg.json's metadata (the corpus, the training command)."""

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {self.architecture!r}")
        if self.d_in < 1 or self.d_sae < 1:
            raise ValueError(f"d_in ({self.d_in}) and d_sae ({self.d_sae}) must be positive")
        if self.architecture != "relu" and not 1 <= self.k <= self.d_sae:
            raise ValueError(f"k ({self.k}) must lie in [1, d_sae = {self.d_sae}]")
        if (self.d_out is None) != (self.hook_name_out is None):
            raise ValueError("a transcoder needs both d_out and hook_name_out; an autoencoder neither")
        if self.skip and self.d_out is None:
            raise ValueError("the skip term belongs to transcoders (d_out and hook_name_out), not autoencoders")

    @property
    def transcoder(self) -> bool:
        return self.d_out is not None

    @property
    def out_dim(self) -> int:
        return self.d_out if self.d_out is not None else self.d_in

    @property
    def sae_lens_architecture(self) -> str:
        if self.transcoder:
            kind = "skip_transcoder" if self.skip else "transcoder"
            if self.architecture in THRESHOLDED:
                return f"jumprelu_{kind}"
            return kind if self.architecture == "relu" else f"topk_{kind}"
        if self.architecture in THRESHOLDED:
            return "jumprelu"
        return "topk" if self.architecture == "topk" else "standard"

    def to_sae_lens(self) -> dict[str, Any]:
        """cfg.json as SAELens 6 writes it (`SAEConfig.to_dict`), workbench fields in metadata."""
        metadata = {"sae_lens_version": SAE_LENS_FORMAT, "sae_lens_training_version": None,
                    "hook_name": self.hook_name, "model_name": self.model_name, "hook_head_index": None,
                    "workbench": {"architecture": self.architecture, **self.extra}}
        if self.architecture in THRESHOLDED:  # SAELens's JumpReLU has no k: the workbench keeps its own
            metadata["workbench"]["k"] = self.k
        out: dict[str, Any] = {
            "architecture": self.sae_lens_architecture, "d_in": self.d_in, "d_sae": self.d_sae, "dtype": "float32",
            "device": "cpu", "apply_b_dec_to_input": not self.transcoder, "normalize_activations": "none",
            "reshape_activations": "none", "metadata": metadata,
        }
        if self.architecture == "topk":
            out |= {"k": self.k, "rescale_acts_by_decoder_norm": False}
        if self.transcoder:
            out["d_out"] = self.d_out
            metadata["hook_name_out"] = self.hook_name_out
        return out

    @classmethod
    def from_sae_lens(cls, cfg: dict[str, Any], *, where: str = "cfg.json") -> DictionaryConfig:
        arch = cfg.get("architecture")
        known = {"topk": ("topk", False), "standard": ("relu", False), "transcoder": ("relu", True),
                 "topk_transcoder": ("topk", True), "skip_transcoder": ("relu", True),
                 "topk_skip_transcoder": ("topk", True), "jumprelu": ("jumprelu", False),
                 "jumprelu_transcoder": ("jumprelu", True), "jumprelu_skip_transcoder": ("jumprelu", True)}
        if arch not in known:
            raise ValueError(f"{where}: architecture {arch!r} is not one the workbench reads ({sorted(known)})")
        if cfg.get("normalize_activations", "none") != "none":
            raise ValueError(f"{where}: normalize_activations={cfg['normalize_activations']!r}; fold it into the "
                             "weights first (SAELens: fold_activation_norm_scaling_factor)")
        meta = dict(cfg.get("metadata") or {})
        extra = dict(meta.get("workbench") or {})
        saved_arch = extra.pop("architecture", None)
        saved_k = extra.pop("k", None)
        architecture, transcoder = known[arch]
        if architecture == "jumprelu" and saved_arch == "batchtopk":
            architecture = "batchtopk"  # trained as BatchTopK, used as the JumpReLU it is saved as
        try:
            return cls(hook_name=meta["hook_name"], d_in=int(cfg["d_in"]), d_sae=int(cfg["d_sae"]),
                       architecture=architecture, k=int(cfg.get("k", saved_k or 32)),
                       d_out=int(cfg["d_out"]) if transcoder else None,
                       hook_name_out=meta.get("hook_name_out") if transcoder else None,
                       skip=arch.endswith("skip_transcoder"),
                       model_name=meta.get("model_name") or "", extra=extra)
        except KeyError as exc:
            raise ValueError(f"{where}: missing key {exc}") from None


class SparseDictionary(nn.Module):
    def __init__(self, cfg: DictionaryConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.W_enc = nn.Parameter(torch.empty(cfg.d_in, cfg.d_sae))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae))
        self.W_dec = nn.Parameter(torch.empty(cfg.d_sae, cfg.out_dim))
        self.b_dec = nn.Parameter(torch.zeros(cfg.out_dim))
        if cfg.skip:
            self.W_skip = nn.Parameter(torch.zeros(cfg.out_dim, cfg.d_in))
        if cfg.architecture in THRESHOLDED:
            self.threshold = nn.Parameter(torch.zeros(cfg.d_sae))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Unit-norm random decoder rows, encoder = decoder transposed (Gao et al. 2024, section 2.3)."""
        w = torch.randn(self.cfg.d_sae, self.cfg.out_dim, generator=generator)
        # TopK, BatchTopK, JumpReLU: unit rows (kept so in training); ReLU: rows of norm 0.1, as Anthropic's April
        # 2024 update starts
        self.W_dec.copy_(w / w.norm(dim=1, keepdim=True) * (0.1 if self.cfg.architecture == "relu" else 1.0))
        if self.cfg.transcoder:
            e = torch.randn(self.cfg.d_in, self.cfg.d_sae, generator=generator)
            self.W_enc.copy_(e / e.norm(dim=0, keepdim=True) * self.W_dec.norm(dim=1))
        else:
            self.W_enc.copy_(self.W_dec.T)
        self.b_enc.zero_()
        self.b_dec.zero_()
        if self.cfg.architecture in THRESHOLDED:
            self.threshold.zero_()  # the trainer sets it from its first batch
        if self.cfg.skip:
            self.W_skip.zero_()  # SAELens's start (the trainer then fits it by least squares on its first batch)

    # -- inference (SAELens's arithmetic) ------------------------------------------------------
    def pre_activations(self, x: torch.Tensor) -> torch.Tensor:
        sae_in = x if self.cfg.transcoder else x - self.b_dec
        return sae_in @ self.W_enc + self.b_enc

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        if self.cfg.architecture == "relu":
            return F.relu(pre)
        if self.cfg.architecture in THRESHOLDED:  # SAELens's JumpReLUSAE.encode, operation for operation
            return F.relu(pre) * (pre > self.threshold).to(pre.dtype)
        values, indices = pre.topk(self.cfg.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter_(-1, indices, values.relu())

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations (..., d_sae)."""
        self._check_input(x, self.cfg.d_in)
        return self.activate(self.pre_activations(x))

    def decode(self, feats: torch.Tensor) -> torch.Tensor:
        return feats @ self.W_dec + self.b_dec

    def skip(self, x: torch.Tensor) -> torch.Tensor | float:
        """The skip transcoder's linear term x @ W_skip.T (d_out); 0.0 for every other dictionary."""
        return x @ self.W_skip.T if self.cfg.skip else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x)) + self.skip(x)

    def _check_input(self, x: torch.Tensor, d: int) -> None:
        if x.shape[-1] != d:
            raise ValueError(f"dictionary for {self.cfg.hook_name} reads vectors of size {d}, "
                             f"got shape {tuple(x.shape)}")

    # -- training ------------------------------------------------------------------------------
    def training_forward(self, x: torch.Tensor, *, dead: torch.Tensor | None = None, k_aux: int = 0,
                         bandwidth: float = 0.05) -> TrainingOutput:
        """Reconstruction of rows x (B, d_in) with autograd, plus what the losses need.

        TopK: one dense pass without autograd picks each row's k latents; their pre-activations are then
        recomputed from gathered encoder columns, and the decoder reads the gathered rows
        (`F.embedding_bag`), so nothing of size (B, d_sae) takes part in the backward pass. With `dead`
        (a bool mask of latents) and `k_aux`, the auxiliary reconstruction of the residual from the
        k_aux largest dead latents (Gao et al. 2024's AuxK) is returned too.

        BatchTopK keeps the k·B largest ReLU pre-activations of the batch, through the same sparse path and with the
        same AuxK term. JumpReLU (the same path, no AuxK) gates by its threshold with straight-through estimators
        of width `bandwidth` (Rajamanoharan et al. 2024): the reconstruction's gradient reaches the threshold through
        the jump, and `TrainingOutput.l0` is the batch's mean L0 whose gradient reaches the threshold only (DeepMind's
        form; SAELens's `jumprelu_ste_to_input=False`).
        """
        arch = self.cfg.architecture
        if arch == "batchtopk":
            return self._batchtopk_forward(x, dead, k_aux)
        if arch == "jumprelu":
            return self._jumprelu_forward(x, bandwidth)
        if arch == "relu":
            feats = F.relu(self.pre_activations(x))
            return TrainingOutput(self.decode(feats) + self.skip(x), feats, None, None, None)
        sae_in = x if self.cfg.transcoder else x - self.b_dec
        with torch.no_grad():
            pre_all = torch.addmm(self.b_enc, sae_in, self.W_enc)
            idx = pre_all.topk(self.cfg.k, dim=-1, sorted=False).indices.sort(dim=-1).values  # (B, k)
        vals = _SelectedPre.apply(sae_in, self.W_enc, self.b_enc, idx, pre_all.gather(1, idx)).relu()
        recon = _SparseDecode.apply(vals, idx, self.W_dec) + self.b_dec + self.skip(x)
        return TrainingOutput(recon, vals, idx, self._aux(sae_in, pre_all, dead, k_aux), None)

    def _candidates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """sae_in, the dense pre-activations (no autograd), and each row's `ROW_CAP`·k largest: ids in order and
        their pre-activations."""
        sae_in = x if self.cfg.transcoder else x - self.b_dec
        with torch.no_grad():
            pre_all = torch.addmm(self.b_enc, sae_in, self.W_enc)
            cand = pre_all.topk(min(ROW_CAP * self.cfg.k, self.cfg.d_sae), dim=-1, sorted=False)
            idx, order = cand.indices.sort(dim=-1)  # (the sparse products want each row's ids in order)
        return sae_in, pre_all, idx, cand.values.gather(1, order)

    def _jumprelu_forward(self, x: torch.Tensor, bandwidth: float) -> TrainingOutput:
        """JumpReLU through the sparse path, over each row's `ROW_CAP`·k largest pre-activations: the gate, its
        straight-through gradients and the L0 count see those candidates (a threshold steered to L0 = k lies far
        inside them: the latents below are off, and further than the kernel's width from their thresholds)."""
        sae_in, _, idx, pre = self._candidates(x)
        sel = _SelectedPre.apply(sae_in, self.W_enc, self.b_enc, idx, pre)
        th = self.threshold[idx]
        feats = _JumpReLU.apply(sel, th, bandwidth)
        l0 = _Step.apply(sel, th, bandwidth).sum(-1).mean()
        recon = _SparseDecode.apply(feats, idx, self.W_dec) + self.b_dec + self.skip(x)
        return TrainingOutput(recon, feats, idx, None, l0)

    def _batchtopk_forward(self, x: torch.Tensor, dead: torch.Tensor | None, k_aux: int) -> TrainingOutput:
        """BatchTopK through the sparse path: each row's `ROW_CAP`·k largest pre-activations are the candidates, the
        k·B largest positive ones of the batch are kept (the rest of a row's slots carry zeros, with zero gradient).
        A row may so hold up to 4k latents, and the batch k per row on average."""
        sae_in, pre_all, idx, pre = self._candidates(x)
        k, b = self.cfg.k, x.size(0)
        with torch.no_grad():
            flat = pre.relu().flatten()
            cut = flat.topk(min(k * b, flat.numel()), sorted=False).values.min()
            keep = (pre >= cut) & (pre > 0)
        vals = _SelectedPre.apply(sae_in, self.W_enc, self.b_enc, idx, pre).relu() * keep
        recon = _SparseDecode.apply(vals, idx, self.W_dec) + self.b_dec + self.skip(x)
        return TrainingOutput(recon, vals, idx, self._aux(sae_in, pre_all, dead, k_aux), None)

    def _aux(self, sae_in: torch.Tensor, pre_all: torch.Tensor, dead: torch.Tensor | None, k_aux: int
             ) -> torch.Tensor | None:
        aux = None
        if dead is not None and k_aux > 0 and bool(dead.any()):
            n = min(k_aux, int(dead.sum()))
            with torch.no_grad():
                masked = pre_all.masked_fill_(~dead, float("-inf"))
                aux_idx = masked.topk(n, dim=-1, sorted=False).indices.sort(dim=-1).values
                aux_pre = masked.gather(1, aux_idx)
            aux_vals = _SelectedPre.apply(sae_in, self.W_enc, self.b_enc, aux_idx, aux_pre).relu()
            aux = _SparseDecode.apply(aux_vals, aux_idx, self.W_dec)
        return aux

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        """Unit-norm decoder rows (TopK, BatchTopK and JumpReLU training keep them so; ReLU training folds the norm
        into the L1 term)."""
        self.W_dec.div_(self.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-8))

    # -- files ---------------------------------------------------------------------------------
    def save(self, directory: str | Path, *, files: dict[str, str] | None = None) -> Path:
        """Write cfg.json + sae_weights.safetensors (+ `files`: name -> text) atomically."""
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
        try:
            tmp.chmod(0o755)
            state = {k: v.detach().float().contiguous().cpu() for k, v in self.state_dict().items()}
            save_file(state, str(tmp / WEIGHTS_FILE))
            (tmp / CFG_FILE).write_text(json.dumps(self.cfg.to_sae_lens(), indent=1) + "\n", encoding="utf-8")
            for name, text in (files or {}).items():
                (tmp / name).write_text(text, encoding="utf-8")
            replace_directory(tmp, directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return directory

    @classmethod
    def load(cls, directory: str | Path, *, device: torch.device | str = "cpu") -> SparseDictionary:
        directory = Path(directory)
        cfg_file, weights_file = directory / CFG_FILE, directory / WEIGHTS_FILE
        for f in (cfg_file, weights_file):
            if not f.is_file():
                raise FileNotFoundError(f"{f} is missing: not a dictionary directory (cfg.json + {WEIGHTS_FILE})")
        try:
            raw = json.loads(cfg_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{cfg_file}: not valid JSON ({exc})") from None
        cfg = DictionaryConfig.from_sae_lens(raw, where=str(cfg_file))
        d = cls(cfg)
        state = load_file(str(weights_file))
        want = {k: tuple(v.shape) for k, v in d.state_dict().items()}
        got = {k: tuple(v.shape) for k, v in state.items() if k in want}
        if got != want:
            raise ValueError(f"{weights_file}: tensors {got} do not match cfg.json's sizes {want}")
        d.load_state_dict({k: state[k].float() for k in want})
        return d.to(device).eval()

    def extra_repr(self) -> str:
        c = self.cfg
        kind = ("skip transcoder" if c.skip else "transcoder") if c.transcoder else "sae"
        k = f", k={c.k}" if c.architecture != "relu" else ""
        return f"{kind} {c.architecture}{k}, {c.hook_name} {c.d_in} -> {c.d_sae} -> {c.out_dim}"


@dataclass
class TrainingOutput:
    recon: torch.Tensor  # (B, d_out)
    acts: torch.Tensor  # TopK: (B, k) values of the chosen latents; the others: (B, d_sae)
    indices: torch.Tensor | None  # TopK: (B, k) latent ids
    aux_recon: torch.Tensor | None  # TopK, BatchTopK with dead latents: their reconstruction of the residual
    l0: torch.Tensor | None = None  # JumpReLU: the batch's mean L0, differentiable in the threshold (STE)


def _rectangle(u: torch.Tensor) -> torch.Tensor:
    return ((u > -0.5) & (u < 0.5)).to(u.dtype)


class _JumpReLU(torch.autograd.Function):
    """pre·[pre > θ]; d/dpre = [pre > θ], d/dθ = -(θ/ε)·K((pre - θ)/ε) (the rectangle kernel K, width ε)."""

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return pre * (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx, g):
        pre, threshold = ctx.saved_tensors
        eps = ctx.bandwidth
        g_t = -(threshold / eps) * _rectangle((pre - threshold) / eps) * g
        return (pre > threshold).to(g.dtype) * g, _to_shape(g_t, threshold), None


class _Step(torch.autograd.Function):
    """[pre > θ]; d/dθ = -(1/ε)·K((pre - θ)/ε), nothing to pre (the L0 penalty moves thresholds only)."""

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx, g):
        pre, threshold = ctx.saved_tensors
        eps = ctx.bandwidth
        return None, _to_shape(-(1.0 / eps) * _rectangle((pre - threshold) / eps) * g, threshold), None


def _to_shape(g: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """A threshold per latent (d_sae,) sums its gradient over rows; one gathered per element keeps it."""
    return g if threshold.dim() == g.dim() else g.sum(0)


def _row_sparse(idx: torch.Tensor, values: torch.Tensor, n: int, *, transpose: bool = False) -> torch.Tensor:
    """(B, n) COO matrix with values[b, j] at column idx[b, j] (or its (n, B) transpose)."""
    rows = torch.arange(idx.size(0), device=idx.device).repeat_interleave(idx.size(1))
    cols = idx.flatten()
    ij = torch.stack([cols, rows] if transpose else [rows, cols])
    shape = (n, idx.size(0)) if transpose else (idx.size(0), n)
    return torch.sparse_coo_tensor(ij, values.flatten(), shape, is_coalesced=not transpose, check_invariants=False)


class _SelectedPre(torch.autograd.Function):
    """pre[b, idx[b, j]] of pre = sae_in @ W_enc + b_enc, already computed (`selected`); the backward pass
    multiplies by the k-sparse gradient only: O(B·k·d) instead of O(B·d_sae·d)."""

    @staticmethod
    def forward(ctx, sae_in, W_enc, b_enc, idx, selected):  # noqa: N803 (SAELens's parameter names)
        ctx.save_for_backward(sae_in, W_enc, idx)
        return selected.clone()

    @staticmethod
    def backward(ctx, g):
        sae_in, W_enc, idx = ctx.saved_tensors
        n = W_enc.size(1)
        g_in = g_w = g_b = None
        if ctx.needs_input_grad[0]:
            g_in = torch.sparse.mm(_row_sparse(idx, g, n), W_enc.T)
        if ctx.needs_input_grad[1]:
            g_w = torch.sparse.mm(_row_sparse(idx, g, n, transpose=True), sae_in).T
        if ctx.needs_input_grad[2]:
            g_b = torch.zeros(n, dtype=g.dtype, device=g.device).index_add_(0, idx.flatten(), g.flatten())
        return g_in, g_w, g_b, None, None


class _SparseDecode(torch.autograd.Function):
    """Σ_j vals[b, j] W_dec[idx[b, j]]: a gather-sum forward (`embedding_bag`), a sampled-product backward."""

    @staticmethod
    def forward(ctx, vals, idx, W_dec):  # noqa: N803
        ctx.save_for_backward(vals, idx, W_dec)
        return F.embedding_bag(idx, W_dec, per_sample_weights=vals, mode="sum")

    @staticmethod
    def backward(ctx, go):
        vals, idx, W_dec = ctx.saved_tensors
        n, (b, k) = W_dec.size(0), idx.shape
        g_vals = g_w = None
        if ctx.needs_input_grad[0]:
            crow = torch.arange(0, b * k + 1, k, device=idx.device)
            with warnings.catch_warnings():  # "sparse CSR support is in beta"
                warnings.simplefilter("ignore", UserWarning)
                pattern = torch.sparse_csr_tensor(crow, idx.flatten(), torch.zeros(b * k, dtype=go.dtype,
                                                  device=go.device), (b, n), check_invariants=False)
            g_vals = torch.sparse.sampled_addmm(pattern, go.contiguous(), W_dec.T).values().view(b, k)
        if ctx.needs_input_grad[2]:
            g_w = torch.sparse.mm(_row_sparse(idx, vals, n, transpose=True), go)
        return g_vals, None, g_w


def replace_directory(tmp: Path, target: Path) -> None:
    """Install the complete directory `tmp` as `target` (two renames; a kill between leaves `.old-*` beside)."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rename(target, old)
    os.rename(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def fvu(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Fraction of variance unexplained: Σ‖x - x̂‖² / Σ‖x - mean(x)‖² over rows (SAELens's and Gao's)."""
    x, x_hat = x.double(), x_hat.double()
    total = (x - x.mean(0)).pow(2).sum()
    return float((x - x_hat).pow(2).sum() / total) if total > 0 else math.nan

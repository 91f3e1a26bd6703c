"""End-to-end (KL) fine-tuning of a trained dictionary: what `features train --finetune-kl DIR` runs.

A dictionary trained on reconstruction alone spends its L0 on variance, not on what the model reads downstream;
a short fine-tune on the KL divergence between the clean model's next-token distributions and those with the
dictionary spliced in closes much of that gap (Braun et al. 2024, "Identifying functionally important features
with end-to-end sparse dictionary learning"; Karvonen et al. 2025 for the fine-tune after MSE training). The
fine-tune starts from the trained weights, so feature i stays feature i: dashboards, notebooks and tests that name
features keep meaning the same ones.

    terms = spliced_terms(model, site, dictionary, batch, reduce)   # KL(clean ‖ spliced), CE, FVU, the codes
    loss = terms.kl + ce_coef * terms.ce + mse_coef * terms.fvu

The optional CE term is the spliced model's next-token cross-entropy on the reference translation, the quantity
whose rise (ΔCE) the card's goal bounds: its gradient on the spliced logits is p_spliced − onehot(reference), the
KL's p_spliced − p_clean, so together they pull towards a mixture of the clean distribution and the reference (as
distillation with hard labels does); the KL alone can fall while ΔCE does not (issue 38: 0.087 → 0.075 KL, ΔCE
0.052 → 0.054).

The spliced forward pass is the one `sites.splice_hooks` makes (the reconstruction replaces the site's activation
at every position, a transcoder's output from its input), computed through `SparseDictionary.training_forward`
so that the backward pass stays sparse; so the KL minimised is the KL `features eval` reports (tested equal).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..corpus.data import Batch, ParallelData
from .dictionary import WEIGHTS_FILE, SparseDictionary, TrainingOutput
from .sites import Site, site_mask

FINETUNABLE = ("topk", "jumprelu", "relu")
"""Architectures whose training forward pass is their inference one (BatchTopK's selection is per batch in training
and a threshold at inference, so a KL measured through the first would not be the card's)."""


class SentenceStream:
    """Whole teacher-forced sentence batches of a corpus (at most `tokens` padded tokens a side), each epoch in a
    fresh seeded order; rank r of `world` takes every world-th batch. `next_batch()` returns (batch, None) so that
    the trainer's loop reads it like an activation stream; its state (epoch, position) makes resuming exact."""

    def __init__(self, data: ParallelData, cfg, *, tokens: int, seed: int = 0, rank: int = 0, world: int = 1) -> None:
        self.data, self.model_cfg, self.tokens = data, cfg, tokens
        self.seed, self.rank, self.world = seed, rank, world
        self.epoch = self.pos = 0
        self.rows_read = 0
        self._plan: tuple[int, list[list[int]]] | None = None

    def _share(self) -> list[list[int]]:
        if self._plan is None or self._plan[0] != self.epoch:
            plan = self.data.batches(self.tokens, seed=self.seed + 1, epoch=self.epoch)
            share = plan[self.rank :: self.world]
            if not share:
                raise ValueError(f"the corpus makes {len(plan)} batches of {self.tokens} tokens, fewer than the "
                                 f"{self.world} ranks")
            self._plan = (self.epoch, share)
        return self._plan[1]

    def next_batch(self) -> tuple[Batch, None]:
        share = self._share()
        batch = self.data.collate(share[self.pos], self.model_cfg)
        self.pos += 1
        self.rows_read += len(share[self.pos - 1])
        if self.pos == len(share):
            self.epoch, self.pos = self.epoch + 1, 0
        return batch, None

    @property
    def epochs(self) -> float:
        return self.epoch + self.pos / len(self._share())

    def state_dict(self) -> dict[str, Any]:
        return {"sentences": True, "epoch": self.epoch, "pos": self.pos, "rows_read": self.rows_read,
                "pairs": len(self.data)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state.get("sentences") or state["pairs"] != len(self.data):
            raise ValueError("the saved state is not of a fine-tune over the same corpus; pass --fresh")
        self.epoch, self.pos, self.rows_read = state["epoch"], state["pos"], state["rows_read"]


def start_record(directory: str | Path) -> dict[str, Any]:
    """What a trained dictionary's own files say of it: its directory, the SHA-256 of its weights file, its
    cfg.json's command and its training.json (the fine-tuned dictionary keeps them, so its card states the whole
    recipe and which start it came from)."""
    directory = Path(directory)
    cfg = json.loads((directory / "cfg.json").read_text(encoding="utf-8"))
    train_file = directory / "training.json"
    return {"directory": str(directory), "weights_sha256": hashlib.sha256((directory / WEIGHTS_FILE).read_bytes()
                                                                         ).hexdigest(),
            "command": cfg.get("metadata", {}).get("workbench", {}).get("command", ""),
            "training": json.loads(train_file.read_text(encoding="utf-8")) if train_file.is_file() else {}}


def load_start(dictionary: SparseDictionary, directory: str | Path) -> None:
    """Copy the trained dictionary at `directory` into `dictionary`; ValueError naming the difference unless both
    have the same site, architecture, width, k and skip term, and the architecture is one the fine-tune handles."""
    start = SparseDictionary.load(directory)
    mine, theirs = dictionary.cfg, start.cfg
    fields = ("hook_name", "hook_name_out", "architecture", "d_in", "d_sae", "k", "skip")
    diff = [f"{f}: {getattr(theirs, f)!r} there, {getattr(mine, f)!r} here" for f in fields
            if getattr(mine, f) != getattr(theirs, f)]
    if diff:
        raise ValueError(f"--finetune-kl {directory}: the dictionary there differs from this run's settings "
                         f"({'; '.join(diff)}); pass the same --site, --architecture, --d-sae, --k and --skip")
    if mine.architecture not in FINETUNABLE:
        raise ValueError(f"--finetune-kl fine-tunes {', '.join(FINETUNABLE)} dictionaries, not {mine.architecture}")
    with torch.no_grad():
        theirs_state = start.state_dict()
        for name, p in dictionary.state_dict().items():
            p.copy_(theirs_state[name])


@dataclass
class SplicedTerms:
    """One batch's fine-tune terms: KL(clean ‖ spliced) and the spliced cross-entropy on the reference, per target
    token (over every rank's tokens), the FVU of the site's real rows (against every rank's variance), and the
    dictionary's output on those rows (codes, indices)."""

    kl: torch.Tensor
    ce: torch.Tensor
    fvu: torch.Tensor
    out: TrainingOutput
    rows: int


def _training_splice(site: Site, d: SparseDictionary, grabbed: dict[str, Any]) -> list[tuple[str, Callable]]:
    """`sites.splice_hooks(site, d)` through `training_forward`: every position of the site's activation (a
    transcoder's output) becomes the reconstruction; the input and target rows and the output are kept."""
    def run(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.size(-1)).float()
        out = d.training_forward(flat)
        grabbed["out"], grabbed["x"] = out, flat
        return out.recon

    if not site.transcoder:
        def replace(x: torch.Tensor, hook) -> torch.Tensor:
            grabbed["y"] = x.reshape(-1, x.size(-1)).float()
            return run(x).view_as(x).to(x.dtype)
        return [(site.hook_in, replace)]

    def read(x: torch.Tensor, hook) -> None:
        grabbed["x_in"] = x

    def write(y: torch.Tensor, hook) -> torch.Tensor:
        grabbed["y"] = y.reshape(-1, y.size(-1)).float()
        return run(grabbed.pop("x_in")).view_as(y).to(y.dtype)
    return [(site.hook_in, read), (site.hook_out, write)]


def spliced_terms(model, site: Site, d: SparseDictionary, batch: Batch,
                  reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t, world: int = 1) -> SplicedTerms:
    """The clean and the spliced teacher-forced forward passes over `batch` (the model's parameters frozen for
    the call), and the terms of the fine-tune's loss; `reduce` all-reduces a tensor over `world` ranks (sum). As in
    `FeatureTrainer`, the KL is this rank's sum over every rank's token count and the FVU this rank's error over
    the mean variance per rank: the first sums, the second averages, to the global figure."""
    batch = batch.to(model.device)
    frozen = [p for p in model.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    grabbed: dict[str, Any] = {}
    try:
        with torch.no_grad():
            clean = torch.log_softmax(model(batch.src, batch.tgt_in).float(), -1)
        with model.hooks(_training_splice(site, d, grabbed)):
            spliced = torch.log_softmax(model(batch.src, batch.tgt_in).float(), -1)
    finally:
        for p in frozen:
            p.requires_grad_(True)
    mask = batch.tgt_out != model.cfg.pad_id
    n = reduce(mask.sum().double()).clamp_min(1)
    kl = ((clean.exp() * (clean - spliced)).sum(-1)[mask].sum() / n).float()
    ce = (-spliced.gather(-1, batch.tgt_out.unsqueeze(-1)).squeeze(-1)[mask].sum() / n).float()
    real = site_mask(batch, site, model.cfg.pad_id).to(model.device).flatten()
    out: TrainingOutput = grabbed["out"]
    rows = real.nonzero()[:, 0]
    target, recon = grabbed["y"].index_select(0, rows).detach(), out.recon.index_select(0, rows)
    var = reduce((target - target.mean(0)).pow(2).sum().detach().double()).float() / world
    fvu = (target - recon).pow(2).sum() / var.clamp_min(1e-12)
    kept = TrainingOutput(recon, out.acts.index_select(0, rows),
                          None if out.indices is None else out.indices.index_select(0, rows), None, None)
    return SplicedTerms(kl, ce, fvu, kept, int(rows.numel()))

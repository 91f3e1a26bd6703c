"""Train a sparse dictionary on activations streamed from a teacher-forced corpus; resumable, with progress.

    cfg = FeatureTrainConfig(checkpoint="checkpoints/multi30k-de-en", site="hook_memory", out_dir="runs/f/mem")
    trainer = FeatureTrainer(cfg)          # resumes from out_dir/state.pt when it exists
    dictionary = trainer.fit()             # out_dir/dictionary/: cfg.json + sae_weights.safetensors

The same command resumes exactly: the state file holds the dictionary, Adam's moments, the stream's buffer,
corpus position and RNG, and the dead-latent counters; a run stopped at any step and resumed reaches the
weights of one that never stopped (tested). The state is written atomically (a temporary file, then
`os.replace`) every `save_every_s` seconds and on Ctrl-C / SIGTERM.

Losses are scale-free: the batch's FVU (Σ‖x - x̂‖² / Σ‖x - x̄‖²), plus for TopK the AuxK term (Gao et al.
2024: the `k_aux` largest latents that have not fired for `dead_after` activations reconstruct the residual,
weight `aux_coef`), or for ReLU an L1 penalty on f_i‖W_dec,i‖ (Anthropic, April 2024) whose coefficient can be
steered to a target L0. Two optional controllers move the encoder bias after each step, from each feature's
running firing rate: `dense_cap` holds back features that fire too often; `rare_floor` (TopK, BatchTopK) pushes
forward those that fire too rarely, dead ones included, by a share of the rise that would put them among the
kept activations of that share of the batch's rows (off by default: a run without them is unchanged). Under
torchrun each rank streams its share of the corpus; gradients, firing counts and L0 are all-reduced, so the ranks
hold identical dictionaries.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..corpus.data import ParallelData, load_dataset
from ..decoding.translator import TranslationModel, load
from ..training.distributed import Dist, init_distributed
from ..training.progress import make_progress
from ..training.schedule import warmup_cosine
from .dictionary import THRESHOLDED, DictionaryConfig, SparseDictionary
from .finetune import SentenceStream, load_start, spliced_terms, start_record
from .sites import Site, resolve_site, site_mask, site_rows, splice_hooks
from .stream import ActivationStream

STATE_FILE = "state.pt"
LOG_FILE = "train_log.jsonl"


@dataclass
class FeatureTrainConfig:
    checkpoint: str
    site: str
    out_dir: str
    architecture: str = "topk"
    d_sae: int = 2048
    k: int = 32
    dataset: str = "multi30k"
    split: str = "train"
    data_root: str | None = None
    limit: int = 0
    """Use only the first `limit` sentence pairs (0: all)."""
    activations: int = 20_000_000
    """Training rows in total (all ranks together)."""
    batch: int = 4096
    buffer: int = 65536
    max_tokens: int = 4096
    lr: float = 1e-3
    warmup: int = 100
    min_lr_frac: float = 0.0
    skip: bool = False
    """Transcoder sites: add a linear skip term W_skip (a skip transcoder, SAELens's "skip_transcoder")."""
    k_aux: int = 0
    """TopK: latents in the AuxK term; 0: d_in // 2 (Gao et al.)."""
    aux_coef: float = 1 / 32
    dead_after: int = 1_000_000
    """Activations without firing after which a latent counts as dead (AuxK and the logs)."""
    l1: float = 1e-3
    """ReLU: L1 coefficient (the start value when target_l0 is set); JumpReLU: the start value of the L0
    penalty's coefficient (on L0 / k, so that it does not depend on the scale of k)."""
    target_l0: float = 0.0
    """ReLU: steer the L1 coefficient so the batch L0 approaches this (0: keep l1 fixed). JumpReLU: the L0
    coefficient is always steered, to this or (0) to k."""
    bandwidth: float = 0.05
    """JumpReLU: width of the straight-through estimators' rectangle kernel (SAELens's default)."""
    threshold_lr: float = 0.05
    """BatchTopK: the inference threshold's running mean moves this fraction of the way to each batch's smallest
    kept activation (SAELens's `topk_threshold_lr`, 0.01 there for runs of many thousand steps; the workbench's
    runs are hundreds of steps, and at 0.01 the start, measured on the untrained dictionary, lingers)."""
    readout: bool = False
    """hook_memory only: measure the reconstruction error through what reads the site, the key and value (times
    output) projections of every decoder layer's cross-attention, ‖e R‖² with R R^T = Σ_l Ŵ_k,l^T Ŵ_k,l +
    (Ŵ_o,l Ŵ_v,l)^T (Ŵ_o,l Ŵ_v,l) (each block scaled to unit Frobenius norm), instead of plain ‖e‖²: the
    dictionary spends its L0 on the directions the decoder reads. The logged FVU stays the plain one."""
    fisher: bool = False
    """Any site: measure the error as ‖e R‖² with R Rᵀ = the empirical Fisher of the model's next-token
    distributions with respect to the site's activation (the mean outer product of ∂ log p(ŷ)/∂(site row), ŷ sampled
    from the model, over `fisher_batches` model batches of the corpus) plus 5 % of its mean diagonal on the identity:
    ½ eᵀFe is the KL divergence an error e at one position causes, to second order, so the dictionary spends its L0
    where the translation is sensitive."""
    fisher_batches: int = 20
    cache: bool = False
    """Read the site's activations over the whole corpus once into memory (Multi30k train: 0.45 M rows x d floats,
    230 MB at d = 128; twice that for a transcoder) and draw shuffled batches from there, instead of running the
    model on the corpus again every epoch."""
    kl_coef: float = 0.0
    """Weight of an end-to-end term in the last `kl_steps` steps (0: reconstruction only): the KL divergence of the
    model's next-token distribution with the dictionary spliced in from the clean model's, per target token of a
    batch of whole teacher-forced sentences (`kl_tokens`), as Braun et al. 2024's "e2e + downstream" SAEs."""
    kl_steps: int = 0
    kl_lr: float = 0.0
    """The learning rate of the end-to-end phase, constant (0: the cosine schedule's, which is near zero by then)."""
    kl_tokens: int = 0
    """Padded tokens per side of the end-to-end term's sentence batch (0: `max_tokens`); its full forward and
    backward pass over the vocabulary costs several reconstruction steps, so a smaller batch keeps it cheap."""
    finetune_kl: str = ""
    """A trained dictionary's directory to fine-tune end to end instead of training from scratch (same site,
    architecture, width, k): `kl_steps` steps, each on a batch of whole teacher-forced sentences (`kl_tokens`
    padded tokens a side, 0: `max_tokens`), loss KL(clean ‖ spliced) per target token + `finetune_mse` x the
    batch's FVU, Adam at `kl_lr` (0: `lr`) with `warmup` steps of warm-up and cosine decay. The feature indices
    keep their identities (see `features.finetune`); `activations`, `cache` and the reconstruction-only settings
    do not apply, and `readout`, `fisher` and `kl_coef` are refused."""
    finetune_mse: float = 0.1
    """The fine-tune's weight of the FVU beside the KL (keeps the reconstruction, and so the card's FVU, sane)."""
    finetune_ce: float = 0.0
    """The fine-tune's weight of the spliced model's next-token cross-entropy on the reference translation beside
    the KL (0: none): the card's ΔCE goal is on that cross-entropy, which the KL alone need not lower."""
    dense_cap: float = 0.0
    """A firing rate above which a feature is held back (0: none; issue 38 calls a feature dense above 0.1): while
    a feature's running rate (an exponential mean over about ten batches) exceeds it, its encoder bias steps down
    each step by `dense_rate` x the batch's mean active value, so it yields its top-k places to others (a bias
    controller, as in the auxiliary-loss-free load balancing of mixture-of-experts routers, Wang et al. 2024)."""
    dense_rate: float = 0.01
    rare_floor: float = 0.0
    """TopK / BatchTopK: a firing rate below which a feature is pushed forward (0: none), `dense_cap`'s counterpart
    for the features that die: while a feature's running rate (the same exponential mean) is below it, its encoder
    bias rises each step by `rare_rate` x the rise that would have let it into the kept activations of
    ceil(rare_floor x batch) of the batch's rows (its pre-activation against each row's smallest kept one), so it
    takes places from others until it fires that often and then learns from the rows it wins. The step is in the
    units of the gap, not of the activations, so features pushed in do not enlarge the next push (`rare_rate` in
    (0, 1]; above 1 it overshoots)."""
    rare_rate: float = 0.1
    seed: int = 0
    log_every: int = 50
    save_every_s: float = 120.0
    threads: int = 0
    progress: str = "terminal"
    extra: dict[str, Any] = field(default_factory=dict)

    # fields that may differ between the run that wrote a state and the one resuming it
    RESUMABLE_CHANGES = ("log_every", "save_every_s", "threads", "progress", "activations", "extra", "kl_coef",
                         "kl_steps", "kl_tokens", "kl_lr")
    """(`activations` and the `kl_*` settings may change, so a finished run can go on with an end-to-end phase.)"""

    @property
    def steps(self) -> int:
        if self.finetune_kl:
            return max(1, self.kl_steps)
        return max(1, self.activations // self.batch)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class FeatureTrainer:
    def __init__(self, cfg: FeatureTrainConfig, *, resume: bool = True, translation_model: TranslationModel | None
                 = None, data: ParallelData | None = None, cache: CachedActivations | None = None) -> None:
        self.cfg = cfg
        self.dist: Dist = init_distributed()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        if cfg.batch % self.dist.world:
            raise ValueError(f"batch ({cfg.batch}) must divide among {self.dist.world} ranks")
        self.local_batch = cfg.batch // self.dist.world
        self.tm = translation_model or load(cfg.checkpoint)
        self.model = self.tm.model.eval()  # frozen for the trainer's life (read, never trained): no mode to restore
        self.site: Site = resolve_site(self.model, cfg.site)
        if data is None:
            src, tgt = load_dataset(cfg.dataset, cfg.split, self.tm.meta.get("src_lang", "de"),
                                    self.tm.meta.get("tgt_lang", "en"), cfg.data_root, limit=cfg.limit)
            data = ParallelData.encode(src, tgt, self.tm.src_tokenizer, self.tm.tgt_tokenizer,
                                       max_len=self.model.cfg.max_positions - 1)
        self.data = data
        if cfg.finetune_kl:
            _check_finetune(cfg)
        if cfg.rare_floor > 0 and cfg.architecture not in ("topk", "batchtopk"):
            raise ValueError(f"--rare-floor pushes features into the kept activations of TopK and BatchTopK; "
                             f"{cfg.architecture} keeps none")
        if cfg.rare_floor > 0 and not 0 < cfg.rare_rate <= 1:
            raise ValueError(f"--rare-rate is the share of the gap closed per step, in (0, 1]; got {cfg.rare_rate}")
        self.stream = self._stream(data, cache)
        d = self.model.cfg.d_model
        self.start = start_record(cfg.finetune_kl) if cfg.finetune_kl else None
        begun = {"finetuned_from": self.start["directory"], "start_command": self.start["command"]} \
            if self.start else {}  # cfg.json names the start and its own command: the whole recipe
        dcfg = DictionaryConfig(
            hook_name=self.site.hook_in, d_in=d, d_sae=cfg.d_sae, architecture=cfg.architecture, k=cfg.k,
            d_out=d if self.site.transcoder else None, hook_name_out=self.site.hook_out, skip=cfg.skip,
            model_name=Path(cfg.checkpoint).name,
            extra={"site": self.site.name, "side": self.site.side, "corpus": f"{cfg.dataset}:{cfg.split}",
                   "checkpoint": str(cfg.checkpoint), **begun, **cfg.extra})
        self.readout = self._readout(data)
        self.dictionary = SparseDictionary(dcfg)
        self.dictionary.reset_parameters(torch.Generator().manual_seed(cfg.seed))
        if cfg.finetune_kl:
            load_start(self.dictionary, cfg.finetune_kl)
        self.optimizer = torch.optim.Adam(self.dictionary.parameters(), lr=cfg.lr, betas=(0.9, 0.999), eps=6.25e-10)
        self.step = 0
        self.rows_seen = 0  # site rows trained on, all ranks together
        self.since_fired = torch.zeros(cfg.d_sae, dtype=torch.long)  # activations since each latent last fired
        self.firing_rate: torch.Tensor | None = None  # `dense_cap`'s and `rare_floor`'s running rate per feature
        self.l1 = cfg.l1
        self.kl_epoch = self.kl_pos = 0  # the end-to-end term's place in its own plan of whole-sentence batches
        self._kl_plan: tuple[int, list[list[int]]] | None = None
        self.log: list[dict[str, Any]] = []
        self.elapsed = 0.0  # training seconds (wall clock) over all sessions of this run
        self.cpu = 0.0  # process CPU seconds (all threads) spent in those steps
        self.interrupted = False
        self.out_dir = Path(cfg.out_dir)
        if resume and (self.out_dir / STATE_FILE).is_file():
            self._load_state()

    def _stream(self, data: ParallelData, cache: CachedActivations | None):
        """Where the training rows come from: whole sentences (the end-to-end fine-tune), cached site activations
        (`cache`, or `--cache`), or the model's forward passes streamed through a shuffling buffer."""
        cfg, dist = self.cfg, self.dist
        if cfg.finetune_kl:
            return SentenceStream(data, self.model.cfg, tokens=cfg.kl_tokens or cfg.max_tokens, seed=cfg.seed,
                                  rank=dist.rank, world=dist.world)
        if cache is not None or cfg.cache:
            rows = cache if cache is not None else CachedActivations.read(self.model, data, self.site,
                                                                          max_tokens=cfg.max_tokens)
            return CachedStream(rows, batch=self.local_batch, seed=cfg.seed, rank=dist.rank, world=dist.world)
        return ActivationStream(self.model, data, self.site, buffer=cfg.buffer // dist.world, batch=self.local_batch,
                                max_tokens=cfg.max_tokens, seed=cfg.seed, rank=dist.rank, world=dist.world)

    def _readout(self, data: ParallelData) -> torch.Tensor | None:
        """The metric the reconstruction error is measured in: `--readout` (what the cross-attentions read of
        `hook_memory`), `--fisher` (the output's sensitivity), or None (plain squared error)."""
        cfg = self.cfg
        if cfg.readout and cfg.fisher:
            raise ValueError("--fisher and --readout are two measures of the same error: choose one")
        if cfg.readout:
            if self.site.hook_in != self.model.hook_memory.name:
                raise ValueError(f"--readout weights the error by the cross-attentions' reads of "
                                 f"{self.model.hook_memory.name}; {self.site.name} is read by more than linear maps")
            return memory_readout(self.model)
        if cfg.fisher:
            return fisher_readout(self.model, data, self.site, batches=cfg.fisher_batches,
                                  max_tokens=cfg.max_tokens, seed=cfg.seed)
        return None

    # -- state ---------------------------------------------------------------------------------
    def _state_file(self, rank: int) -> Path:
        return self.out_dir / (STATE_FILE if rank == 0 else f"state.rank{rank}.pt")

    def _save_state(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        state = {"config": json.dumps(self.cfg.to_dict(), sort_keys=True), "step": self.step,
                 "dictionary": self.dictionary.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "since_fired": self.since_fired, "firing_rate": self.firing_rate, "l1": self.l1,
                 "log": json.dumps(self.log),
                 "kl_epoch": self.kl_epoch, "kl_pos": self.kl_pos, "rows_seen": self.rows_seen,
                 "elapsed": self.elapsed, "cpu": self.cpu, "stream": self.stream.state_dict(),
                 "torch_rng": torch.get_rng_state()}
        target = self._state_file(self.dist.rank)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        torch.save(state, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, target)

    def _load_state(self) -> None:
        file = self._state_file(self.dist.rank)
        state = torch.load(file, map_location="cpu", weights_only=True)
        now = self.cfg.to_dict()
        # a setting added since the state was written counts as its default (the run never used it)
        defaults = FeatureTrainConfig(checkpoint="", site="", out_dir="").to_dict()
        saved = {k: defaults[k] for k in now.keys() - {"checkpoint", "site", "out_dir"}} | json.loads(state["config"])
        diff = sorted(k for k in set(saved) | set(now)
                      if saved.get(k) != now.get(k) and k not in FeatureTrainConfig.RESUMABLE_CHANGES)
        if diff:
            changes = ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in diff)
            raise ValueError(f"{file} was written with different settings ({changes}); pass --fresh to start over")
        self.dictionary.load_state_dict(state["dictionary"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.since_fired, self.l1 = state["step"], state["since_fired"], state["l1"]
        self.log, self.elapsed, self.cpu = json.loads(state["log"]), state["elapsed"], state.get("cpu", 0.0)
        self.kl_epoch, self.kl_pos = state.get("kl_epoch", 0), state.get("kl_pos", 0)
        self.rows_seen = state.get("rows_seen", self.step * self.cfg.batch)
        self.firing_rate = state.get("firing_rate")
        self.stream.load_state_dict(state["stream"])
        torch.set_rng_state(state["torch_rng"])

    # -- one step ------------------------------------------------------------------------------
    def _lr(self) -> float:
        c = self.cfg
        if c.finetune_kl:
            peak = c.kl_lr or c.lr
            return warmup_cosine(self.step + 1, peak_lr=peak, warmup=c.warmup, total=c.steps,
                                 min_lr=peak * c.min_lr_frac)
        if c.kl_lr > 0 and c.kl_coef > 0 and self.step >= c.steps - c.kl_steps:
            return c.kl_lr
        return warmup_cosine(self.step + 1, peak_lr=c.lr, warmup=c.warmup, total=c.steps, min_lr=c.lr * c.min_lr_frac)

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.dist.world > 1:
            import torch.distributed as dist

            dist.all_reduce(t)
        return t

    @torch.no_grad()
    def _init_skip(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Start a skip transcoder's linear term (W_skip, b_dec) at the least-squares fit of y on x over the first
        batch (every rank's rows). SAELens starts W_skip at zero; at Adam's step size (about lr per step) the
        entries of an FFN's linear part, O(1) and larger, would take hundreds of steps to arrive, and the features
        would learn the linear part meanwhile only to give it up."""
        d = self.dictionary
        xa = torch.cat([x, x.new_ones(x.size(0), 1)], 1).double()
        gram = self._all_reduce(torch.cat([xa.T @ xa, xa.T @ y.double()], 1))
        n = xa.size(1)
        ridge = 1e-6 * gram[:, :n].diagonal().mean() * torch.eye(n, dtype=gram.dtype)
        w = torch.linalg.solve(gram[:, :n] + ridge, gram[:, n:])  # (d_in + 1, d_out)
        d.W_skip.copy_(w[:-1].T.float())
        d.b_dec.copy_(w[-1].float())

    def _kl_batch(self):
        """The next whole-sentence batch of this rank's share (its own plan: seed + 1, so not the stream's order)."""
        if self._kl_plan is None or self._kl_plan[0] != self.kl_epoch:
            tokens = self.cfg.kl_tokens or self.cfg.max_tokens
            plan = self.data.batches(tokens, seed=self.cfg.seed + 1, epoch=self.kl_epoch)
            self._kl_plan = (self.kl_epoch, plan[self.dist.rank :: self.dist.world])
        share = self._kl_plan[1]
        batch = self.data.collate(share[self.kl_pos], self.model.cfg).to(self.model.device)
        self.kl_pos += 1
        if self.kl_pos == len(share):
            self.kl_epoch, self.kl_pos = self.kl_epoch + 1, 0
        return batch

    def _kl(self) -> torch.Tensor:
        """Σ over real target tokens of KL(clean ‖ spliced), divided by every rank's token count; differentiable in
        the dictionary's parameters only (the model's are frozen for the call)."""
        batch = self._kl_batch()
        frozen = [p for p in self.model.parameters() if p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        try:
            with torch.no_grad():
                clean = torch.log_softmax(self.model(batch.src, batch.tgt_in).float(), -1)
            with self.model.hooks(splice_hooks(self.site, self.dictionary)):
                spliced = torch.log_softmax(self.model(batch.src, batch.tgt_in).float(), -1)
        finally:
            for p in frozen:
                p.requires_grad_(True)
        mask = batch.tgt_out != self.model.cfg.pad_id
        n = self._all_reduce(mask.sum().double())
        return (clean.exp() * (clean - spliced)).sum(-1)[mask].sum() / n.clamp_min(1)

    def train_step(self, x: torch.Tensor, y: torch.Tensor | None) -> dict[str, float]:
        """One optimiser step on the rows `x` (targets `y`, a transcoder's; None: `x` itself); returns the step's
        figures over the global batch (FVU, the auxiliary, L1 / L0-penalty and KL terms, L0)."""
        c, d = self.cfg, self.dictionary
        if c.finetune_kl:
            return self._finetune_step(x)
        target = x if y is None else y
        for group in self.optimizer.param_groups:
            group["lr"] = self._lr()
        if self.step == 0:
            self._first_step_init(x, target)
        dead = self.since_fired >= c.dead_after
        k_aux = c.k_aux or d.cfg.d_in // 2
        out = d.training_forward(x, dead=dead, k_aux=k_aux, bandwidth=c.bandwidth)
        # scale-free losses: sums over this rank's rows divided by the global batch's variance
        denom = self._all_reduce((target - target.mean(0)).pow(2).sum().detach()) / self.dist.world
        loss, mse, aux, kl, l1 = self._loss(x, target, out, denom)
        self._optimizer_step(loss)
        self._constrain(out)
        record = self._record(out, mse, aux, l1, kl, x=x)
        self.step += 1
        return record

    def _finetune_step(self, batch) -> dict[str, float]:
        """One step of `--finetune-kl`: KL(clean ‖ spliced) + finetune_ce x spliced CE + finetune_mse x FVU on a
        whole-sentence batch."""
        c = self.cfg
        for group in self.optimizer.param_groups:
            group["lr"] = self._lr()
        terms = spliced_terms(self.model, self.site, self.dictionary, batch, self._all_reduce, self.dist.world)
        loss = terms.kl + c.finetune_mse * terms.fvu
        if c.finetune_ce > 0:
            loss = loss + c.finetune_ce * terms.ce
        self._optimizer_step(loss)
        self._constrain(terms.out)
        zero = torch.zeros(())
        record = self._record(terms.out, terms.fvu, zero, zero, terms.kl, rows=terms.rows)
        record["ce"] = float(self._all_reduce(terms.ce.detach().reshape(1)))
        self.step += 1
        return record

    def _first_step_init(self, x: torch.Tensor, target: torch.Tensor) -> None:
        """Before the first step: the decoder bias at the data mean, the skip map, the first threshold."""
        d = self.dictionary
        with torch.no_grad():  # start the decoder bias at the data mean (SAELens's "mean" b_dec init), the
            # mean over every rank's rows so that all ranks start from the same weights
            total = self._all_reduce(torch.cat([target.sum(0), target.new_tensor([target.size(0)])]))
            d.b_dec.copy_(total[:-1] / total[-1])
            if d.cfg.skip:
                self._init_skip(x, target)
            if d.cfg.architecture in THRESHOLDED:
                # one threshold for every latent at which the first batch keeps k per row on average: BatchTopK's
                # first estimate, and JumpReLU's start at its target L0 rather than at every latent firing
                acts = d.pre_activations(x).relu().flatten()
                cut = acts.topk(min(d.cfg.k * x.size(0), acts.numel()), sorted=False).values.min()
                d.threshold.fill_(float(self._all_reduce(cut.reshape(1))) / self.dist.world)

    def _loss(self, x: torch.Tensor, target: torch.Tensor, out, denom: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(loss, mse, aux, kl, l1): the reconstruction error (or its readout), AuxK, the end-to-end KL and the
        sparsity penalty, as the architecture and config say."""
        c, d = self.cfg, self.dictionary
        err = target - out.recon
        mse = err.pow(2).sum() / denom
        loss = mse
        if self.readout is not None:
            mse = mse.detach()
            r_denom = self._all_reduce(((target - target.mean(0)) @ self.readout).pow(2).sum()) / self.dist.world
            loss = (err @ self.readout).pow(2).sum() / r_denom
        aux = torch.zeros(())
        if out.aux_recon is not None:
            e = err.detach()
            aux = (e - out.aux_recon).pow(2).sum() / (e - e.mean(0)).pow(2).sum().clamp_min(1e-12)
            loss = loss + c.aux_coef * aux
        kl = torch.zeros(())
        if c.kl_coef > 0 and self.step >= c.steps - c.kl_steps:
            kl = self._kl()
            loss = loss + c.kl_coef * kl
        l1 = torch.zeros(())
        if c.architecture == "relu":
            l1 = (out.acts * d.W_dec.norm(dim=1)).sum() / (x.size(0) * denom.sqrt() / math.sqrt(x.size(0)))
            loss = loss + self.l1 * l1
        elif c.architecture == "jumprelu":
            l1 = out.l0 / d.cfg.k  # the L0 penalty (Rajamanoharan et al. 2024), relative to the target
            loss = loss + self.l1 * l1
        return loss, mse, aux, kl, l1

    def _optimizer_step(self, loss: torch.Tensor) -> None:
        """Backward, gradients averaged over ranks, one Adam step."""
        d = self.dictionary
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.dist.world > 1:
            for p in d.parameters():
                if p.grad is not None:  # (BatchTopK's threshold is no trained parameter)
                    self._all_reduce(p.grad)
                    p.grad /= self.dist.world
        self.optimizer.step()

    def _constrain(self, out) -> None:
        """After the step: unit decoder rows, a non-negative JumpReLU threshold, BatchTopK's running threshold."""
        c, d = self.cfg, self.dictionary
        if c.architecture != "relu":
            d.normalize_decoder()
        if c.architecture == "jumprelu":
            with torch.no_grad():
                d.threshold.clamp_(min=0.0)  # below zero the gate would pass negative pre-activations (SAELens)
        elif c.architecture == "batchtopk":
            with torch.no_grad():  # the inference threshold: a running mean of the smallest kept activation
                kept = out.acts[out.acts > 0]
                low = self._all_reduce((kept.min() if kept.numel() else d.threshold[0]).reshape(1)) / self.dist.world
                d.threshold.mul_(1 - c.threshold_lr).add_(c.threshold_lr * low)

    def _record(self, out, mse: torch.Tensor, aux: torch.Tensor, l1: torch.Tensor, kl: torch.Tensor, *,
                rows: int | None = None, x: torch.Tensor | None = None) -> dict[str, float]:
        """Firing counts, L0 and the loss terms over the global batch (`rows` this rank's rows, when not the
        configured batch's share); the L1 coefficient steered toward the target L0; the firing-rate controller
        (`dense_cap`, `rare_floor`: it reads the batch's input rows `x`)."""
        c, d = self.cfg, self.dictionary
        # firing counts and L0 over the global batch
        with torch.no_grad():
            if out.indices is not None:
                fired = torch.zeros(d.cfg.d_sae).index_add_(0, out.indices.flatten(), (out.acts > 0).flatten().float())
            else:
                fired = (out.acts > 0).sum(0).float()
            kl = kl.detach() * self.dist.world  # each rank's share of the global mean: summed, then divided
            n = torch.tensor([float(self.local_batch if rows is None else rows)])
            stats = self._all_reduce(torch.cat([fired, torch.stack([mse.detach(), aux.detach(), l1.detach(), kl]),
                                                n]))
            fired, (mse_v, aux_v, l1_v, kl_v), total = stats[:-5], stats[-5:-1] / self.dist.world, int(stats[-1])
            l0 = float(fired.sum()) / max(total, 1)
            self.rows_seen += total
            self.since_fired += total
            self.since_fired[fired > 0] = 0
            balanced = self._balance(fired / max(total, 1), x, out) if c.dense_cap > 0 or c.rare_floor > 0 else {}
        if c.architecture == "relu" and c.target_l0 > 0 or c.architecture == "jumprelu":
            target = c.target_l0 or d.cfg.k
            self.l1 *= math.exp(0.05 * math.tanh(math.log(max(l0, 1e-3) / target)))
        return {"fvu": float(mse_v), "aux": float(aux_v), "l1_term": float(l1_v), "kl": float(kl_v), "l0": l0,
                "rows": total, **balanced}

    @torch.no_grad()
    def _balance(self, rate: torch.Tensor, x: torch.Tensor | None, out) -> dict[str, int]:
        """`dense_cap`'s and `rare_floor`'s controller: the running firing rates updated with this batch's (global)
        `rate`, the encoder bias of each feature above the cap lowered and of each below the floor raised (from the
        batch's rows `x`); returns how many were ({"held_back": n} with a cap, {"boosted": n} with a floor)."""
        c = self.cfg
        decay = 0.9
        self.firing_rate = rate.clone() if self.firing_rate is None else self.firing_rate.mul_(decay).add_(
            (1 - decay) * rate)
        record = {}
        if c.dense_cap > 0:
            over = self.firing_rate > c.dense_cap
            record["held_back"] = int(over.sum())
            if bool(over.any()):
                kept = out.acts.detach()[out.acts.detach() > 0]
                scale = self._all_reduce((kept.mean() if kept.numel() else kept.new_zeros(())).reshape(1)
                                         ) / self.dist.world
                self.dictionary.b_enc[over] -= c.dense_rate * float(scale)
        if c.rare_floor > 0:
            under = self.firing_rate < c.rare_floor
            record["boosted"] = int(under.sum())
            if bool(under.any()) and x is not None:
                self.dictionary.b_enc[under] += self._rare_push(under, x, out)
        return record

    @torch.no_grad()
    def _rare_push(self, under: torch.Tensor, x: torch.Tensor, out) -> torch.Tensor:
        """`rare_rate` x, for each feature in `under`, the encoder-bias rise that would put it above the smallest kept
        activation (its row's for TopK, the batch's for BatchTopK) on ceil(rare_floor x rows) of this rank's rows
        `x`, averaged over the ranks (so that they stay identical); zero for one that already is."""
        d, c = self.dictionary, self.cfg
        sae_in = x if d.cfg.transcoder else x - d.b_dec
        pre = torch.addmm(d.b_enc[under], sae_in, d.W_enc[:, under])  # (rows, features under the floor)
        acts = out.acts.detach()
        if c.architecture == "batchtopk":
            kept = acts[acts > 0]
            bar = (kept.min() if kept.numel() else acts.new_zeros(())).expand(acts.size(0), 1)
        else:
            bar = acts.min(-1, keepdim=True).values
        need = min(max(1, math.ceil(c.rare_floor * x.size(0))), x.size(0))
        gap = bar - pre
        gap = (gap.amin(0) if need == 1 else gap.kthvalue(need, dim=0).values).clamp_min(0)  # (amin: the same, faster)
        return self._all_reduce(c.rare_rate * gap) / self.dist.world

    # -- the loop ------------------------------------------------------------------------------
    def fit(self) -> SparseDictionary:
        c = self.cfg
        main = self.dist.main
        progress = make_progress(c.progress, enabled=main)
        progress.start(c.steps, self.step)
        if self.step:
            progress.message(f"resumed {self.site.name} at step {self.step}/{c.steps}")
        last_save = t_log = time.time()
        rows_log = n_log = 0
        sums: dict[str, float] = {}
        with _stop_between_steps() as stop:
            while self.step < c.steps and not stop:
                t0, c0 = time.time(), time.process_time()
                x, y = self.stream.next_batch()
                m = self.train_step(x, y)
                self.elapsed += time.time() - t0
                self.cpu += time.process_time() - c0
                rows_log += m.pop("rows")
                n_log += 1
                for key, v in m.items():
                    sums[key] = sums.get(key, 0.0) + v
                if self.step % c.log_every == 0 or self.step == c.steps:
                    n, now = n_log, time.time()
                    rec = {"step": self.step, "epoch": round(self.stream.epochs, 3), "lr": self._lr(),
                           **{k: v / n for k, v in sums.items()}, "l1_coef": self.l1,
                           "dead_frac": float((self.since_fired >= c.dead_after).float().mean()),
                           "activations": self.rows_seen, "elapsed_s": round(self.elapsed, 1),
                           "cpu_s": round(self.cpu, 1),
                           "tokens_per_s": rows_log / max(now - t_log, 1e-9)}
                    self.log.append(rec)
                    progress.step(self.step, rec | {"loss": rec["fvu"]})
                    progress.message(f"  fvu {rec['fvu']:.4f}  L0 {rec['l0']:.1f}  dead {rec['dead_frac']:.1%}  "
                                     f"aux {rec['aux']:.3f}  "
                                     + (f"kl {rec['kl']:.4f}  " if c.kl_coef or c.finetune_kl else "")
                                     + (f"ce {rec['ce']:.4f}  " if "ce" in rec else "")
                                     + f"epoch {rec['epoch']:.2f}  activations/s "
                                     f"{rec['tokens_per_s']:,.0f}")
                    sums, rows_log, n_log, t_log = {}, 0, 0, now
                if time.time() - last_save > c.save_every_s:
                    self._save_state()
                    last_save = time.time()
        if stop:
            self.interrupted = True
            progress.message(f"interrupted at step {self.step}; saving (the same command resumes)")
        self._save_state()
        if main:
            (self.out_dir / LOG_FILE).write_text("".join(json.dumps(r) + "\n" for r in self.log), encoding="utf-8")
            if not self.interrupted:
                self.save_dictionary(self.out_dir / "dictionary")
                progress.message(f"wrote {self.out_dir / 'dictionary'}")
        progress.close()
        return self.dictionary

    def save_dictionary(self, directory: Path) -> Path:
        info = {"steps": self.step, "activations": self.rows_seen, "train_seconds": round(self.elapsed, 1),
                "train_cpu_seconds": round(self.cpu, 1),
                "epochs": round(self.stream.epochs, 3), "world": self.dist.world, "config": self.cfg.to_dict(),
                "final": self.log[-1] if self.log else {}}
        if self.start:
            info["finetuned_from"] = self.start
        return self.dictionary.save(directory, files={"training.json": json.dumps(info, indent=1) + "\n"})


def _check_finetune(cfg: FeatureTrainConfig) -> None:
    """`finetune_kl` with settings that would change what it means: refused, naming them."""
    clash = [name for name, on in (("readout", cfg.readout), ("fisher", cfg.fisher), ("kl_coef", cfg.kl_coef),
                                   ("cache", cfg.cache), ("rare_floor", cfg.rare_floor)) if on]
    if clash:
        raise ValueError(f"--finetune-kl trains on KL + finetune_mse x FVU over whole sentences; "
                         f"{', '.join('--' + c.replace('_', '-') for c in clash)} do not apply to it")
    if cfg.kl_steps <= 0:
        raise ValueError("--finetune-kl needs --kl-steps, the number of fine-tune steps")


@torch.no_grad()
def memory_readout(model) -> torch.Tensor:
    """R (d, d) with ‖e R‖² the error e of the encoder output as every decoder cross-attention reads it: keys
    W_k e and values through the output projection W_o W_v e, each block scaled to unit Frobenius norm."""
    gram = 0
    for layer in model.dec:
        ca = layer.cross_attn
        for m in (ca.k_proj.weight, ca.out_proj.weight @ ca.v_proj.weight):
            m = m.double() / m.double().norm()
            gram = gram + m.T @ m
    return torch.linalg.cholesky(gram).float()  # gram = R R^T: ‖e R‖² = e gram e^T


def fisher_readout(model, data: ParallelData, site: Site, *, batches: int = 20, max_tokens: int = 4096,
                   seed: int = 0, floor: float = 0.05) -> torch.Tensor:
    """R (d, d), R Rᵀ = E[g gᵀ] + floor · mean diag · I, g = ∂ Σ_t log p(ŷ_t)/∂ x_s at each real position s of the
    site's written activation x (a transcoder's: the FFN output), ŷ_t sampled from the model (teacher forcing)."""
    g = torch.Generator().manual_seed(seed)
    name = site.hook_out or site.hook_in
    d = model.cfg.d_model
    gram = torch.zeros(d, d, dtype=torch.float64)
    rows = 0
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    grabbed: dict[str, torch.Tensor] = {}

    def grab(x: torch.Tensor, hook) -> torch.Tensor:
        grabbed["x"] = x.detach().requires_grad_(True)
        return grabbed["x"]

    try:
        for idx in data.batches(max_tokens, seed=seed + 2, epoch=0)[:batches]:
            batch = data.collate(idx, model.cfg).to(model.device)
            with model.hooks([(name, grab)]):
                logits = model(batch.src, batch.tgt_in)
            mask = batch.tgt_out != model.cfg.pad_id
            logp = logits[mask].float().log_softmax(-1)
            y = torch.multinomial(logp.detach().exp().cpu(), 1, generator=g).to(logp.device)
            logp.gather(1, y).sum().backward()
            gx = grabbed["x"].grad[site_mask(batch, site, model.cfg.pad_id).to(model.device)].double().cpu()
            gram += gx.T @ gx
            rows += gx.size(0)
    finally:
        for p in params:
            p.requires_grad_(True)
    gram /= max(rows, 1)
    gram += floor * gram.diagonal().mean() * torch.eye(d, dtype=gram.dtype)
    return torch.linalg.cholesky(gram).float()


class CachedActivations:
    """A site's activations over a whole corpus, in memory: rows (N, d_in), or (N, d_in + d_out) for a transcoder."""

    def __init__(self, rows: torch.Tensor, d_in: int, transcoder: bool) -> None:
        self.rows, self.d_in, self.transcoder = rows, d_in, transcoder

    @classmethod
    @torch.no_grad()
    def read(cls, model, data: ParallelData, site: Site, *, max_tokens: int = 4096) -> CachedActivations:
        parts = []
        for idx in data.batches(max_tokens, shuffle=False):
            x, y = site_rows(model, data.collate(idx, model.cfg), site)
            parts.append((x if y is None else torch.cat([x, y], 1)).cpu())
        return cls(torch.cat(parts), model.cfg.d_model, site.transcoder)


class CachedStream:
    """`ActivationStream`'s interface over `CachedActivations`: each epoch a fresh permutation of every row (rank r
    takes every world-th batch of it), so every activation is used once per epoch, as in the stream."""

    def __init__(self, cache: CachedActivations, *, batch: int, seed: int = 0, rank: int = 0, world: int = 1
                 ) -> None:
        if cache.rows.size(0) < batch * world:
            raise ValueError(f"the cache holds {cache.rows.size(0)} rows, fewer than one batch per rank")
        self.cache, self.batch, self.rank, self.world = cache, batch, rank, world
        self.gen = torch.Generator().manual_seed(seed)
        self.epoch, self.pos = 0, 0  # pos: the next global batch of the epoch's permutation
        self.perm = torch.randperm(cache.rows.size(0), generator=self.gen)
        self.rows_read = 0

    @property
    def per_epoch(self) -> int:
        return self.cache.rows.size(0) // (self.batch * self.world)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.pos == self.per_epoch:
            self.epoch, self.pos = self.epoch + 1, 0
            self.perm = torch.randperm(self.cache.rows.size(0), generator=self.gen)
        start = (self.pos * self.world + self.rank) * self.batch
        rows = self.cache.rows[self.perm[start : start + self.batch]]
        self.pos += 1
        self.rows_read += rows.size(0)
        if self.cache.transcoder:
            return rows[:, : self.cache.d_in], rows[:, self.cache.d_in :]
        return rows, None

    @property
    def epochs(self) -> float:
        return self.epoch + self.pos / self.per_epoch

    def state_dict(self) -> dict:
        return {"cached": True, "gen": self.gen.get_state(), "epoch": self.epoch, "pos": self.pos,
                "perm": self.perm.clone(), "rows_read": self.rows_read, "rows": self.cache.rows.size(0)}

    def load_state_dict(self, state: dict) -> None:
        if not state.get("cached") or state["rows"] != self.cache.rows.size(0):
            raise ValueError("the saved state is not of a cached run over the same activations; pass --fresh")
        self.gen.set_state(state["gen"])
        self.epoch, self.pos, self.perm, self.rows_read = state["epoch"], state["pos"], state["perm"], state[
            "rows_read"]


@contextlib.contextmanager
def _stop_between_steps() -> Iterator[list[int]]:
    """While training, SIGINT and SIGTERM only ask the loop to stop after the step it is in (a non-empty list
    is the request), so the saved state is always that of a whole step and the resumed run is exact."""
    stop: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # handlers live on the main thread
        yield stop
        return

    def request(signum: int, frame: object) -> None:
        stop.append(signum)

    previous = {sig: signal.signal(sig, request) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

"""How good a dictionary is, on held-out text, beside what an expert compares it with: reconstruction, sparsity,
and what splicing it in does to translation, for the dictionary, PCA and a random dictionary at its L0.

    result = evaluate_dictionary(tm, dictionary, split="valid", bleu_split="test2016")
    result["fvu"], result["delta_ce"], result["baselines"]["pca"]["fvu"], result["timing"]["baseline_share"]

Three texts, each named in the result with its token count:

- The evaluation split (default Multi30k valid, held out from training): FVU, L0, ΔCE, KL, CE recovered.
- The density text (default the first sentences of the training split, at least `density_tokens` = 200k site
  tokens): dead features (never fire there) and dense ones (fire on more than 10 % of its tokens); the same pass
  fits the baselines and the mean of the site, so they never see the evaluation text.
- The BLEU split (default test2016): the checkpoint's own decoding settings, clean and spliced.

Figures:

- FVU: Σ‖y - ŷ‖² / Σ‖y - ȳ‖² over every real token of the split (y: the site's activation, or the FFN output a
  transcoder predicts). L0: mean number of active features per token.
- ΔCE: with teacher forcing on the split's references, the mean token cross-entropy with the site replaced by
  the reconstruction minus the clean model's, in nats; KL: mean KL(clean ‖ spliced) of the next-token
  distributions per target token, in nats.
- CE recovered against zero ablation, (CE_zero - CE_spliced) / (CE_zero - CE_clean) (SAELens's "CE loss
  score"), and against mean ablation (the site replaced by its mean over the density text at every position).
- Baselines (`features.baselines`): PCA with L0 components and a random TopK dictionary at the same L0, both fit
  on the density text; for transcoders also the FFN's own neurons (active per token; exact reconstruction).
- Timing: the card's own evaluation (its passes, its dead/dense count, BLEU) and the baselines' extra work
  (fitting them, their reconstructions and spliced forward passes), measured separately.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..core.model import Encoded, evaluating
from ..core.protocols import Progress
from ..corpus.data import ParallelData, load_dataset
from ..decoding.evaluate import score
from ..decoding.translator import TranslationModel
from .baselines import Moments, PCABaseline, RandomTopK
from .dictionary import ARCHITECTURE_NAMES, THRESHOLDED, SparseDictionary
from .sites import ablation_hooks, site_mask, site_of, site_rows, splice_hooks
from .stats import DENSE

SAMPLE_ROWS = 16384
"""Rows of the density text kept to fit the random dictionary's scale."""


class _Clock:
    """Seconds spent under named labels (`with clock("card"): ...`)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, label: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - t


def _logp(model, batch, site=None, encoded: Encoded | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced next-token log-probabilities at real target positions (N, V) and the targets (N,), under the
    hooks active now. The output layer runs on the real positions only. With `encoded` (the batch's clean encoder
    output) the encoder is not run again where the active hooks cannot change it: a decoder-side site reads it as
    it is, and `hook_memory`'s hooks are applied to it (`model.hook_memory` is the identity plus those hooks); a
    site inside the encoder runs the encoder again."""
    if encoded is None or site is None or (site.side == "src" and site.name != "hook_memory"):
        encoded = model.encode(batch.src)
    elif site.name == "hook_memory":
        encoded = Encoded(model.hook_memory(encoded.memory), encoded.src_mask)
    out = model.decode(batch.tgt_in, encoded, project=False)[0]
    mask = batch.tgt_out != model.cfg.pad_id
    logits = model.output_proj(out[mask]).float()
    # in place (the logits are this call's own): a fresh (N, V) tensor per pass cost 4x the log-softmax itself
    # in page faults on a CPU; the CPU row kernel reads a row before writing it (bit-identical, tested)
    in_place = logits.device.type == "cpu" and not logits.requires_grad
    return torch.log_softmax(logits, -1, out=logits) if in_place else logits.log_softmax(-1), batch.tgt_out[mask]


@dataclass
class _Clean:
    """A batch's clean next-token distribution, kept for the KL of every spliced variant: its log-probabilities and
    probabilities (exponentiated once, not once a variant). KL is summed as Σ p (log p − log q), not as
    Σ p log p − Σ p log q, whose two large terms cancel to a small one in float32."""

    logp: torch.Tensor
    p: torch.Tensor

    @classmethod
    def of(cls, logp: torch.Tensor) -> _Clean:
        return cls(logp, logp.exp())


class _Splice:
    """Running CE and KL of one spliced variant against the clean model."""

    def __init__(self) -> None:
        self.nll = self.kl = 0.0
        self.n = 0

    def add(self, logp: torch.Tensor, target: torch.Tensor, clean: _Clean | None) -> None:
        """Add one batch; `logp` is the variant's own tensor and is overwritten (the KL is summed in place in it:
        Σ p (log q − log p) negated, bit for bit the sum of p (log p − log q), with no (N, V) temporaries)."""
        self.nll += float(-logp.gather(1, target[:, None]).sum())
        if clean is not None:
            self.kl -= float(logp.sub_(clean.logp).mul_(clean.p).sum())
        self.n += target.numel()

    @property
    def ce(self) -> float:
        return self.nll / self.n


class _Recon:
    """Running FVU, L0 and firing counts of one reconstruction."""

    def __init__(self, d_out: int, n_codes: int) -> None:
        self.err2 = self.s2 = 0.0
        self.s1 = torch.zeros(d_out, dtype=torch.float64)
        self.rows = self.active = 0
        self.fired = torch.zeros(n_codes, dtype=torch.long)

    def add(self, target: torch.Tensor, recon: torch.Tensor, codes: torch.Tensor) -> None:
        self.rows += target.size(0)
        self.err2 += float((target - recon).double().pow(2).sum())
        self.s1 += target.double().sum(0).cpu()
        self.s2 += float(target.double().pow(2).sum())
        nz = codes != 0
        self.active += int(nz.sum())
        self.fired += nz.sum(0).cpu()

    @property
    def fvu(self) -> float:
        return self.err2 / (self.s2 - float((self.s1 * self.s1).sum()) / self.rows)


def _figures(recon: _Recon, spliced: _Splice, ce: dict[str, float], fired_density: torch.Tensor | None = None,
             density_tokens: int = 0) -> dict[str, Any]:
    """FVU, L0, ΔCE, KL, CE recovered (zero, mean) and dead/dense shares (on the density text when counted
    there, else on the evaluation split) of one reconstruction."""
    fired, tokens = (fired_density, density_tokens) if fired_density is not None else (recon.fired, recon.rows)
    freq = fired.double() / max(tokens, 1)
    return {"fvu": recon.fvu, "l0": recon.active / recon.rows, "ce_spliced": spliced.ce,
            "delta_ce": spliced.ce - ce["clean"], "kl": spliced.kl / spliced.n,
            "ce_recovered": (ce["zero"] - spliced.ce) / (ce["zero"] - ce["clean"]),
            "ce_recovered_mean": (ce["mean"] - spliced.ce) / (ce["mean"] - ce["clean"]),
            "dead_frac": float((fired == 0).double().mean()), "dense_frac": float((freq > DENSE).double().mean()),
            "counted_tokens": tokens}


def _density_data(tm: TranslationModel, dataset: str, split: str, tokens: int, side: str, data_root: str | None
                  ) -> tuple[ParallelData, str]:
    """The first sentences of `split` holding at least `tokens` site tokens (all of it when it has fewer)."""
    src_lang, tgt_lang = tm.meta.get("src_lang", "de"), tm.meta.get("tgt_lang", "en")
    src, tgt = load_dataset(dataset, split, src_lang, tgt_lang, data_root)
    data = ParallelData.encode(src, tgt, tm.src_tokenizer, tm.tgt_tokenizer, max_len=tm.model.cfg.max_positions - 1)
    lens = data.src_lens if side == "src" else data.tgt_lens
    n = int((lens.cumsum() < tokens).sum()) + 1
    n = min(n, len(data))
    return ParallelData(data.src[:n], data.tgt[:n]), f"{dataset}:{split}[:{n}]"


@torch.no_grad()
def evaluate_dictionary(tm: TranslationModel, dictionary: SparseDictionary, *, dataset: str = "multi30k",
                        split: str = "valid", bleu_split: str | None = "test2016", data_root: str | None = None,
                        limit: int = 0, max_tokens: int = 4096, density_split: str = "train",
                        density_tokens: int = 200_000, baselines: bool = True, seed: int = 0,
                        progress: Progress | None = None) -> dict[str, Any]:
    """The card's figures (see the module docstring), in four steps: the density pass (dead/dense counts, the
    baselines' fit, the site's mean), the evaluation pass, the table of figures, BLEU. `progress(done, total,
    what)` gets a line of figures after each step that has some."""
    model, d = tm.model, dictionary
    with evaluating(model), evaluating(d):
        site = site_of(d)
        clock = _Clock()
        hidden = (model.stream(site.name.split(".")[0]).layers[int(site.name.split(".")[1])].ffn.hook_hidden.name,) \
            if site.transcoder else ()
        n_neurons = model.cfg.ffn_dim(site.name.split(".")[0]) if site.transcoder else 0
        steps = 2 if bleu_split else 1

        dens_data, dens_name = _density_data(tm, dataset, density_split, density_tokens, site.side, data_root)
        dens = _density_pass(model, d, site, dens_data, max_tokens, hidden, n_neurons, baselines, clock)
        fits = _fit_baselines(dens, d, site, seed, model.device, clock) if baselines else {}

        src_lang, tgt_lang = tm.meta.get("src_lang", "de"), tm.meta.get("tgt_lang", "en")
        src, tgt = load_dataset(dataset, split, src_lang, tgt_lang, data_root, limit=limit)
        data = ParallelData.encode(src, tgt, tm.src_tokenizer, tm.tgt_tokenizer, max_len=model.cfg.max_positions - 1)
        ev = _evaluation_pass(model, d, site, data, max_tokens, hidden, dens.mean(model.device), fits, clock)
        result = _result_table(site, f"{dataset}:{split}", len(data), d, dens, dens_name, ev, fits, seed, n_neurons)
        result["seconds"] = round(clock.seconds.get("card", 0.0), 1)
        if progress:
            lines = [f"{site.name}: FVU {result['fvu']:.4f}, L0 {result['l0']:.1f}, dead {result['dead_frac']:.1%} "
                     f"and dense {result['dense_frac']:.1%} of {dens.rows:,} tokens, "
                     f"ΔCE {result['delta_ce']:.4f} nats, "
                     f"CE recovered {result['ce_recovered']:.3f} (zero) {result['ce_recovered_mean']:.3f} (mean)"]
            lines += [f"  {name}: FVU {b['fvu']:.4f}, L0 {b['l0']:.1f}, ΔCE {b['delta_ce']:.4f} nats"
                      for name, b in result.get("baselines", {}).items()]
            progress(1, steps, "\n".join(lines))
        if bleu_split:
            result |= _bleu(tm, site, d, dataset, bleu_split, src_lang, tgt_lang, data_root, limit, clock)
            if progress:
                progress(2, steps, f"{site.name}: {bleu_split} BLEU {result['bleu_clean']:.2f} clean, "
                         f"{result['bleu_spliced']:.2f} spliced")
        result["timing"] = _timing(clock, result["seconds"])
        return result


@dataclass
class _Density:
    """What the density pass counts: firings of the features (and of the FFN's neurons), the site's sum (for the
    mean ablation), the baselines' moments and a sample of rows."""

    fired: torch.Tensor
    neurons: torch.Tensor
    moments: Moments
    sum_out: torch.Tensor
    rows: int = 0
    active: int = 0
    sample_x: list[torch.Tensor] = field(default_factory=list)
    sample_y: list[torch.Tensor] = field(default_factory=list)

    def mean(self, device) -> torch.Tensor:
        return (self.sum_out / self.rows).float().to(device)


def _density_pass(model, d: SparseDictionary, site, dens: ParallelData, max_tokens: int, hidden: tuple,
                  n_neurons: int, baselines: bool, clock: _Clock) -> _Density:
    """Dead/dense counts over the density text, the site's mean there, and what the baselines are fit on."""
    out = _Density(torch.zeros(d.cfg.d_sae, dtype=torch.long), torch.zeros(n_neurons, dtype=torch.long),
                   Moments(d.cfg.d_in, d.cfg.d_out), torch.zeros(d.cfg.out_dim, dtype=torch.float64))
    kept = 0
    for idx in dens.batches(max_tokens, shuffle=False):
        batch = dens.collate(idx, model.cfg).to(model.device)
        with clock("card"):
            x, y, *more = site_rows(model, batch, site, extra=hidden)
            nz = d.encode(x) > 0
            out.fired += nz.sum(0).cpu()
            out.active += int(nz.sum())
            out.rows += x.size(0)
            out.sum_out += (x if y is None else y).double().sum(0).cpu()  # the mean ablation's value
        with clock("baselines"):
            if more:
                out.neurons += (more[0][hidden[0]] != 0).sum(0).cpu()
            if baselines:
                out.moments.update(x, y)
        if baselines and kept < SAMPLE_ROWS:
            with clock("baselines"):
                take = SAMPLE_ROWS - kept
                out.sample_x.append(x[:take].cpu())
                out.sample_y.append((x if y is None else y)[:take].cpu())
                kept += out.sample_x[-1].size(0)
    return out


def _fit_baselines(dens: _Density, d: SparseDictionary, site, seed: int, device, clock: _Clock
                   ) -> dict[str, torch.nn.Module]:
    """PCA and a random TopK dictionary at the dictionary's L0 (rounded), fit on the density text."""
    l0_round = max(1, round(dens.active / dens.rows))
    with clock("baselines"):
        xs, ys = torch.cat(dens.sample_x), torch.cat(dens.sample_y)
        return {"pca": PCABaseline.fit(dens.moments, l0_round).to(device),
                "random": RandomTopK.fit(dens.moments, d.cfg.d_sae, l0_round, xs, ys if site.transcoder else None,
                                         seed=seed).to(device)}


@dataclass
class _Evaluation:
    """The evaluation pass's running figures: the dictionary's reconstruction, the four spliced runs, the baselines'
    reconstructions and runs, and the FFN's active neurons."""

    rec: _Recon
    runs: dict[str, _Splice]
    base_rec: dict[str, _Recon]
    base_runs: dict[str, _Splice]
    neurons_active: int = 0


def _evaluation_pass(model, d: SparseDictionary, site, data: ParallelData, max_tokens: int, hidden: tuple,
                     mean: torch.Tensor, fits: dict[str, torch.nn.Module], clock: _Clock) -> _Evaluation:
    """Reconstruction and teacher-forced CE/KL on the evaluation split: clean, spliced, zero- and mean-ablated, and
    each baseline spliced."""
    ev = _Evaluation(_Recon(d.cfg.out_dim, d.cfg.d_sae),
                     {name: _Splice() for name in ("clean", "spliced", "zero", "mean")},
                     {name: _Recon(d.cfg.out_dim, b.l0 if name == "pca" else d.cfg.d_sae) for name, b in fits.items()},
                     {name: _Splice() for name in fits})
    for idx in data.batches(max_tokens, shuffle=False):
        batch = data.collate(idx, model.cfg).to(model.device)
        with clock("card"):
            x, y, *more = site_rows(model, batch, site, extra=hidden)
            target = x if y is None else y
            mask = site_mask(batch, site, model.cfg.pad_id).to(model.device)
            encoded = model.encode(batch.src)  # clean; every variant's decoder reads it (see _logp)
            logp, tokens = _logp(model, batch, site, encoded)
            ev.runs["clean"].add(logp, tokens, None)
            clean = _Clean.of(logp)
            own = _Recording(d)
            for name, hooks in (("spliced", splice_hooks(site, own)), ("zero", ablation_hooks(site, None)),
                                ("mean", ablation_hooks(site, mean))):
                with model.hooks(hooks):
                    ev.runs[name].add(*_logp(model, batch, site, encoded), clean if name == "spliced" else None)
            ev.rec.add(target, *own.rows(mask))
        with clock("baselines"):
            if more:
                ev.neurons_active += int((more[0][hidden[0]] != 0).sum())
            for name, b in fits.items():
                rec = _Recording(b)
                with model.hooks(splice_hooks(site, rec)):
                    ev.base_runs[name].add(*_logp(model, batch, site, encoded), clean)
                ev.base_rec[name].add(target, *rec.rows(mask))
    return ev


class _Recording:
    """A dictionary (or baseline) as `splice_hooks` calls it, keeping its reconstruction and codes of the call: the
    evaluation's FVU and L0 come from the pass that is spliced in, so each batch is encoded once, not twice. The
    site's activation it reads there is the one `site_rows` captured (everything before the site is clean)."""

    def __init__(self, d) -> None:
        self.d = d
        self.out = self.codes = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self.d, "encode_decode"):  # a baseline that decodes from its kept codes alone
            self.codes, self.out = self.d.encode_decode(x)
            return self.out
        self.codes = self.d.encode(x)
        skip = getattr(self.d, "skip", None)
        self.out = self.d.decode(self.codes) + (skip(x) if skip is not None else 0.0)
        return self.out

    def rows(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The reconstruction and codes at the site's real positions, row-major as `site_rows` gives them."""
        if self.out is None:
            raise RuntimeError("the spliced pass did not reach the site")
        return self.out[mask], self.codes[mask]


def _result_table(site, split_name: str, sentences: int, d: SparseDictionary, dens: _Density, dens_name: str,
                  ev: _Evaluation, fits: dict[str, torch.nn.Module], seed: int, n_neurons: int) -> dict[str, Any]:
    """The card's figures: the dictionary's, then each baseline's beside them (with how it was made)."""
    ce = {name: r.ce for name, r in ev.runs.items()}
    own = _figures(ev.rec, ev.runs["spliced"], ce, dens.fired, dens.rows)
    result: dict[str, Any] = {
        "site": site.name, "hook_in": site.hook_in, "hook_out": site.hook_out, "split": split_name,
        "sentences": sentences, "tokens": ev.rec.rows, "fvu": own["fvu"], "l0": own["l0"],
        "dead_frac": own["dead_frac"], "dead": int((dens.fired == 0).sum()), "dense_frac": own["dense_frac"],
        "dense": int((dens.fired.double() / dens.rows > DENSE).sum()), "dense_threshold": DENSE,
        "density_split": dens_name, "density_tokens": dens.rows,
        "dead_frac_eval": float((ev.rec.fired == 0).double().mean()), "d_sae": d.cfg.d_sae,
        "ce_clean": ce["clean"], "ce_spliced": ce["spliced"], "ce_zero_ablated": ce["zero"],
        "ce_mean_ablated": ce["mean"], "delta_ce": own["delta_ce"], "kl": own["kl"],
        "ce_recovered": own["ce_recovered"], "ce_recovered_mean": own["ce_recovered_mean"],
    }
    if fits or site.transcoder:
        result["baselines"] = {}
        result["baseline_fit"] = f"{dens_name}, {dens.rows} tokens (not the evaluation split)"
    for name, b in fits.items():
        fig = _figures(ev.base_rec[name], ev.base_runs[name], ce)
        if name == "pca":
            fig |= {"components": b.l0, "explained_on_fit_text": b.explained,
                    "method": "reduced-rank regression: least-squares map, then the top L0 components of its "
                              "output" if site.transcoder else "top L0 principal components, mean-centred"}
        else:
            fig |= {"features": d.cfg.d_sae, "k": b.k, "scale": float(b.scale), "seed": seed,
                    "method": "random unit decoder directions, TopK of the projections (ReLU), one least-squares "
                              "scale" + ("; input mapped by the least-squares linear map" if site.transcoder else "")}
        result["baselines"][name] = fig
    if site.transcoder:
        freq = dens.neurons.double() / max(dens.rows, 1)
        result["baselines"]["ffn_neurons"] = {
            "neurons": n_neurons, "l0": ev.neurons_active / ev.rec.rows, "fvu": 0.0, "delta_ce": 0.0, "kl": 0.0,
            "ce_recovered": 1.0, "ce_recovered_mean": 1.0, "dead_frac": float((dens.neurons == 0).double().mean()),
            "dense_frac": float((freq > DENSE).double().mean()), "counted_tokens": dens.rows,
            "method": f"the FFN's own {n_neurons} hidden units (active: non-zero); the reconstruction is the FFN "
                      "itself, exact"}
    return result


def _bleu(tm: TranslationModel, site, d: SparseDictionary, dataset: str, bleu_split: str, src_lang: str,
          tgt_lang: str, data_root: str | None, limit: int, clock: _Clock) -> dict[str, Any]:
    """BLEU of the checkpoint's own decoding on `bleu_split`, clean and with the dictionary spliced in."""
    src, tgt = load_dataset(dataset, bleu_split, src_lang, tgt_lang, data_root, limit=limit)
    cfg = tm.decode_config
    with clock("bleu"):
        clean_bleu = score(tm.translate(src), [tgt])
        with tm.model.hooks(splice_hooks(site, d)):
            spliced_bleu = score(tm.translate(src), [tgt])
    return {"bleu_split": f"{dataset}:{bleu_split}", "bleu_sentences": len(src), "beam": cfg.beam,
            "length_penalty": cfg.length_penalty, "alpha": cfg.alpha, "bleu_clean": clean_bleu.bleu,
            "bleu_spliced": spliced_bleu.bleu, "bleu_delta": round(spliced_bleu.bleu - clean_bleu.bleu, 2),
            "bleu_signature": clean_bleu.bleu_signature, "bleu_seconds": round(clock.seconds["bleu"], 1)}


def _timing(clock: _Clock, card_without_bleu: float) -> dict[str, Any]:
    """The card's own seconds (with and without BLEU) and the baselines' extra seconds, and their share."""
    card = clock.seconds.get("card", 0.0) + clock.seconds.get("bleu", 0.0)
    base = clock.seconds.get("baselines", 0.0)
    return {"card_seconds": round(card, 1), "card_seconds_without_bleu": card_without_bleu,
            "baseline_seconds": round(base, 1), "baseline_share": base / card if card else None,
            "baseline_share_without_bleu": base / clock.seconds["card"] if clock.seconds.get("card") else None,
            "note": "wall clock of this process; the baselines' share is of the card's own evaluation, "
                    "BLEU included"}


def add_seed_timing(timing: dict[str, Any], seed_timings: list[dict[str, Any]]) -> dict[str, Any]:
    """`timing` with the other seeds' evaluations added (`features eval --seed-dirs`): their seconds
    (`seed_seconds`, each evaluated as this card without baselines or BLEU) and the baselines' share of the whole
    card, this dictionary's evaluation and its seeds' (`baseline_share_with_seeds`)."""
    seeds = sum(t["card_seconds"] for t in seed_timings)
    whole = timing["card_seconds"] + seeds
    timing |= {"seed_seconds": round(seeds, 1), "seed_count": len(seed_timings),
               "baseline_share_with_seeds": timing["baseline_seconds"] / whole if whole else None}
    return timing


def seeds_of(directory: str | Path) -> dict[str, Any]:
    """The `seeds` field of a card: the seeds its figures come from (training.json), and their spread."""
    train_file = Path(directory) / "training.json"
    training = json.loads(train_file.read_text(encoding="utf-8")) if train_file.is_file() else {}
    seed = training.get("config", {}).get("seed")
    return {"count": 1, "values": [seed] if seed is not None else [], "spread": None,
            "note": "one trained seed: the spread over 3 seeds needs two more trainings (not done for this card)"}


GOALS = {"fvu": ("<=", 0.2), "l0": ("<=", 64), "dead_frac": ("<=", 0.10), "ce_recovered": (">=", 0.90)}
BLEU_GOAL = 0.5
"""BLEU points the spliced model may lose against the clean one."""
L0_GOAL, DEAD_GOAL, DENSE_GOAL, PCA_FVU_RATIO, DELTA_CE_GOAL = 16, 0.05, 0.01, 0.6, 0.05
"""Issue 38's goals: L0 <= 16; dead <= 5 % and dense <= 1 % (on >= 200k tokens); FVU <= 0.6 x PCA-L0's and ΔCE <= its;
ΔCE <= 0.05 nats on hook_memory (every cross-attention reads it) and for transcoders, whose L0 must also stay at or
below the FFN's own active neurons."""


def goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal of issue 38 that applies to this card: what, the value, the bound, met or not."""
    out = []

    def add(what: str, value: float, op: str, bound: float) -> None:
        out.append({"goal": what, "value": value, "op": op, "bound": bound,
                    "met": bool(value <= bound if op == "<=" else value >= bound)})

    add("L0", result["l0"], "<=", L0_GOAL)
    pca = result.get("baselines", {}).get("pca")
    if pca:
        add(f"FVU <= {PCA_FVU_RATIO} x PCA-L0's FVU ({pca['fvu']:.4f})", result["fvu"], "<=",
            PCA_FVU_RATIO * pca["fvu"])
        add("ΔCE <= PCA-L0's ΔCE (nats)", result["delta_ce"], "<=", pca["delta_ce"])
    if result["site"] == "hook_memory" or result.get("hook_out"):
        add("ΔCE (nats)", result["delta_ce"], "<=", DELTA_CE_GOAL)
    neurons = result.get("baselines", {}).get("ffn_neurons")
    if neurons:
        add("L0 <= the FFN's active neurons per token", result["l0"], "<=", neurons["l0"])
    tokens = result.get("density_tokens", result["tokens"])
    add(f"dead share (on {tokens:,} tokens)", result["dead_frac"], "<=", DEAD_GOAL)
    if "dense_frac" in result:
        add(f"dense share, firing on > 10 % of {tokens:,} tokens", result["dense_frac"], "<=", DENSE_GOAL)
    return out


def _frontier_lines(result: dict[str, Any]) -> list[str]:
    """A card's `frontier` (other trainings of the site at other L0, measured as their notes say) beside the FFN's
    own neurons, and whether any point reaches issue 38's transcoder goal."""
    frontier = result.get("frontier")
    if not frontier:
        return []
    neurons = result.get("baselines", {}).get("ffn_neurons")
    lines = ["", "## Frontier beside the FFN's neurons", "", frontier.get("note", ""), "",
             "| dictionary | L0 | FVU | ΔCE (nats) | dead | dense (> 10 %) | measured on |",
             "|---|---|---|---|---|---|---|"]
    points = list(frontier["points"])
    for p in points:
        lines.append(f"| {p['name']} | {p['l0']:.1f} | {p['fvu']:.4f} | {p['delta_ce']:+.4f} | {p['dead_frac']:.1%} | "
                     f"{p['dense_frac']:.1%} | {p['measured_on']} |")
    if neurons:
        lines.append(f"| the FFN's own {neurons['neurons']} neurons | {neurons['l0']:.1f} | 0 (exact) | 0 | "
                     f"{neurons['dead_frac']:.1%} | {neurons['dense_frac']:.1%} | "
                     f"{neurons['counted_tokens']:,} tokens |")
        reached = [p for p in points if p["l0"] <= neurons["l0"] and p["delta_ce"] <= DELTA_CE_GOAL]
        lines += ["", f"Goal: L0 at most the neurons' {neurons['l0']:.1f} at ΔCE ≤ {DELTA_CE_GOAL} nats. "
                  + (f"Reached by {', '.join(p['name'] for p in reached)}." if reached else
                     "**Not reached**: no transcoder here is both as sparse as the FFN's neurons and within "
                     f"{DELTA_CE_GOAL} nats; at the neurons' L0 the features cost far more cross-entropy than the "
                     "neurons (which cost none), so on this goal the neurons remain the better basis.")]
    return lines


def write_card(directory: str | Path, result: dict[str, Any]) -> Path:
    """eval.json and a README.md whose numbers are `result`'s and training.json's, never typed by hand."""
    directory = Path(directory)
    result = {**result, "seeds": result.get("seeds") or seeds_of(directory)}
    result["goals"] = goals(result)
    (directory / "eval.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    cfg = json.loads((directory / "cfg.json").read_text(encoding="utf-8"))
    train_file = directory / "training.json"
    training = json.loads(train_file.read_text(encoding="utf-8")) if train_file.is_file() else {}
    tc = training.get("config", {})
    arch = cfg["metadata"]["workbench"]["architecture"]
    lines = _card_header(result, cfg, tc, arch) + _card_goals(result) + _card_baselines(result)
    lines += _frontier_lines(result) + _card_seeds_and_time(result) + _card_bleu(result)
    if training:
        lines += _card_training(training, tc, arch)
    lines += ["", "Re-measure: `workbench features eval DIR --checkpoint CHECKPOINT --card` (rewrites this file).", ""]
    (directory / "README.md").write_text("\n".join(lines), encoding="utf-8")
    return directory


def _card_header(result: dict[str, Any], cfg: dict, tc: dict, arch: str) -> list[str]:
    """The card's title, what the dictionary is and how to load it, and the evaluation section's heading."""
    kind = ("skip transcoder" if "skip" in cfg["architecture"] else "transcoder") if cfg.get("d_out") \
        else "sparse autoencoder"
    k = f", k = {cfg['k']}" if "k" in cfg else ""
    if arch in THRESHOLDED:
        k = (f"; trained at k = {cfg['metadata']['workbench'].get('k')} per token on average, a threshold at "
             "inference (saved as SAELens's JumpReLU)" if arch == "batchtopk" else
             f"; L0 penalty steered to {tc.get('target_l0') or cfg['metadata']['workbench'].get('k')} in training")
    return [f"# {result['site']}", "",
             f"{ARCHITECTURE_NAMES.get(arch, arch)} {kind} on `{result['hook_in']}`"
             + (f" predicting `{result['hook_out']}`" if result.get("hook_out") else "")
             + f" of `{cfg['metadata'].get('model_name', '')}`: {cfg['d_in']} -> {cfg['d_sae']} features{k}. "
             "SAELens layout (`cfg.json`, `sae_weights.safetensors`): `sae_lens.SAE.load_from_disk(this directory)`"
             + (" loads it after `workbench.features.sae_lens_classes.register()` (SAELens has no TopK "
                "transcoder class)." if cfg["architecture"].startswith("topk_") else " loads it."),
             "", f"## Held-out evaluation ({result['split']}, {result['sentences']} sentences, "
             f"{result['tokens']} tokens)",
             "", "| goal (issue 38) | value | bound | |", "|---|---|---|---|"]


def _card_goals(result: dict[str, Any]) -> list[str]:
    """The goals table and the cross-entropy figures."""
    lines = []
    for g in result.get("goals") or goals(result):
        pct = "share" in g["goal"]
        shown = (lambda v: f"{v:.1%}") if pct else (lambda v: f"{v:.1f}") if g["goal"].startswith("L0") else (
            lambda v: f"{v:.4f}")
        lines.append(f"| {g['goal']} | {shown(g['value'])} | {g['op']} {shown(g['bound'])} | "
                     f"{'met' if g['met'] else '**missed**'} |")
    lines += ["", f"CE recovered against zero ablation: {result['ce_recovered']:.1%}; against mean ablation: "
              f"{result.get('ce_recovered_mean', float('nan')):.1%}."]
    lines += ["", f"Cross-entropy per target token (teacher-forced, nats): clean {result['ce_clean']:.4f}, spliced "
              f"{result['ce_spliced']:.4f}, site zero-ablated {result['ce_zero_ablated']:.4f}"
              + (f", mean-ablated {result['ce_mean_ablated']:.4f}" if "ce_mean_ablated" in result else "") + "."]
    return lines


BASELINE_NAMES = {"pca": "PCA, L0 components", "random": "random dictionary, same L0",
                  "ffn_neurons": "the FFN's own neurons"}


def baseline_table(result: dict[str, Any]) -> list[str]:
    """The card's table of the dictionary beside its baselines at the same L0, as Markdown lines (the Features tab
    shows it too): FVU, L0, ΔCE, KL, CE recovered against zero and mean ablation, dead and dense shares with the
    tokens they were counted on."""
    lines = ["| | FVU | L0 | ΔCE (nats) | KL (nats) | CE recovered vs zero | vs mean | dead | dense (> 10 %) |",
             "|---|---|---|---|---|---|---|---|---|"]
    rows = [("this dictionary", {k: result[k] for k in ("fvu", "l0", "delta_ce", "kl", "ce_recovered",
                                                          "ce_recovered_mean", "dead_frac", "dense_frac")}
             | {"counted_tokens": result["density_tokens"]})]
    rows += [(BASELINE_NAMES.get(n, n), b) for n, b in result.get("baselines", {}).items()]
    for label, b in rows:
        lines.append(f"| {label} | {b['fvu']:.4f} | {b['l0']:.1f} | {b['delta_ce']:+.4f} | {b['kl']:.4f} | "
                     f"{b['ce_recovered']:.1%} | {b['ce_recovered_mean']:.1%} | {b['dead_frac']:.1%} | "
                     f"{b['dense_frac']:.1%} ({b['counted_tokens']:,} tokens) |")
    return lines


def _card_baselines(result: dict[str, Any]) -> list[str]:
    """The dictionary beside its baselines at the same L0 (none without baselines)."""
    lines: list[str] = []
    if "baselines" in result:
        names = BASELINE_NAMES
        lines += ["", "## Beside its baselines at the same L0", "", f"Fit on {result['baseline_fit']}.", "",
                  *baseline_table(result)]
        lines += ["", "ΔCE: spliced minus clean cross-entropy; KL: mean KL(clean ‖ spliced) per target token. The "
                  "dictionary's dead and dense shares are counted on the density text, the baselines' on the "
                  "evaluation split (PCA's components are non-zero on every token: dense by construction)."
                  + (" The FFN's neurons are the FFN itself: its reconstruction is exact; its L0 is the count of "
                     "non-zero hidden units per token." if "ffn_neurons" in result["baselines"] else "")]
        for n in ("pca", "random"):
            if n in result["baselines"]:
                lines.append(f"- {names[n]}: {result['baselines'][n]['method']}.")
    return lines


def _card_seeds_and_time(result: dict[str, Any]) -> list[str]:
    """The seeds behind the figures and the evaluation's time."""
    lines: list[str] = []
    seeds = result.get("seeds")
    if seeds:
        lines += ["", f"Seeds: {seeds['count']} ({', '.join(map(str, seeds['values'])) or 'unknown'}); "
                  f"{seeds['note']}."]
        lines += _card_spread(seeds, result)
    timing = result.get("timing")
    if timing and timing.get("baseline_share") is not None:
        without = timing.get("baseline_share_without_bleu")
        if without is None and timing.get("card_seconds_without_bleu"):
            without = timing["baseline_seconds"] / timing["card_seconds_without_bleu"]
        if "bleu_clean" not in result and "card_seconds" in timing:  # evaluated with --bleu-split ''
            lines += ["", f"Evaluation time: {timing['card_seconds']:.0f} s for this card's own figures (BLEU not "
                      f"measured), {timing['baseline_seconds']:.0f} s more for the baselines "
                      f"({timing['baseline_share']:.0%} of it)."]
        elif result.get("bleu_rerun", True):
            lines += ["", f"Evaluation time: {timing['card_seconds']:.0f} s for this card's own figures (BLEU "
                      f"included), {timing['baseline_seconds']:.0f} s more for the baselines "
                      f"({timing['baseline_share']:.0%} of it"
                      + (f"; {without:.0%} of the card's time without BLEU" if without is not None else "") + ")."]
        else:
            lines += ["", f"Evaluation time: {timing['card_seconds']:.0f} s for this card's own figures without BLEU "
                      f"(its BLEU figures come from an earlier run on the same weights and settings, "
                      f"{result.get('bleu_seconds', 0):.0f} s then), {timing['baseline_seconds']:.0f} s more for the "
                      f"baselines ({timing['baseline_share']:.0%})."]
        if timing.get("seed_seconds") is not None:
            lines[-1] += (f" Its {timing['seed_count']} other seeds took {timing['seed_seconds']:.0f} s (each "
                          "evaluated as this dictionary, without baselines or BLEU): the baselines are "
                          f"{timing['baseline_share_with_seeds']:.0%} of the card's time with them.")
    return lines


def card_spread(seeds: dict[str, Any], result: dict[str, Any]) -> list[str]:
    """The card's table of its figures over seeds (`_card_spread`'s, without its leading blank line)."""
    return _card_spread(seeds, result)[1:]


def _card_spread(seeds: dict[str, Any], result: dict[str, Any]) -> list[str]:
    """The table of `features.seeds.seed_spread`'s figures: this dictionary's, and their mean ± s.d. and range
    over the seeds (none when the card has one seed)."""
    if not seeds.get("spread"):
        return []
    names = {"fvu": ("FVU", ".4f"), "l0": ("L0", ".1f"), "delta_ce": ("ΔCE (nats)", ".4f"), "kl": ("KL (nats)", ".4f"),
             "ce_recovered": ("CE recovered vs zero", ".1%"), "ce_recovered_mean": ("CE recovered vs mean", ".1%"),
             "dead_frac": ("dead", ".1%"), "dense_frac": ("dense (> 10 %)", ".1%")}
    lines = ["", f"| | this dictionary | mean ± s.d. over {seeds['count']} seeds | min – max |", "|---|---|---|---|"]
    for key, (label, fmt) in names.items():
        if key not in seeds["spread"]:  # a spread computed before the figure was part of it
            continue
        s = seeds["spread"][key]
        sd = f"{s['sd']:{fmt}}" if fmt.endswith("%") else f"{s['sd']:.2g}"  # two significant digits: 3e-05, not 0.0000
        lines.append(f"| {label} | {result[key]:{fmt}} | {s['mean']:{fmt}} ± {sd} | "
                     f"{s['min']:{fmt}} – {s['max']:{fmt}} |")
    return lines


def _card_bleu(result: dict[str, Any]) -> list[str]:
    """BLEU clean and spliced, against the goal (none when not measured)."""
    lines: list[str] = []
    if "bleu_clean" in result:
        lines += ["", f"BLEU on {result['bleu_split']} ({result['bleu_sentences']} sentences, beam {result['beam']}, "
                  f"length penalty {result['length_penalty']} {result['alpha']}, the checkpoint's settings): "
                  f"{result['bleu_clean']:.2f} clean, {result['bleu_spliced']:.2f} with the dictionary spliced in "
                  f"({result['bleu_delta']:+.2f}; goal: at most {BLEU_GOAL} below clean, "
                  f"{'met' if result['bleu_spliced'] >= result['bleu_clean'] - BLEU_GOAL else 'missed'}); "
                  f"`{result['bleu_signature']}`."]
    return lines


def _card_training(training: dict[str, Any], tc: dict, arch: str) -> list[str]:
    """How the dictionary was trained (training.json): a fine-tune's start first, then the fine-tune."""
    start = training.get("finetuned_from")
    if start and start.get("training"):
        return _card_training(start["training"], start["training"].get("config", {}), arch) + _card_finetune(
            training, tc, start)
    if start:  # a start without its training record: the fine-tune alone
        return ["", "## Training"] + _card_finetune(training, tc, start)
    return ["", "## Training", "",
              f"- {training['activations']:,} activations ({training['steps']} steps of {tc.get('batch')}) "
              + (f"drawn from the site's activations over `{tc.get('dataset')}:{tc.get('split')}` (teacher "
                 f"forcing), read once into memory and reshuffled every epoch, {training['epochs']} epochs."
                 if tc.get("cache") else
                 f"streamed from `{tc.get('dataset')}:{tc.get('split')}` with teacher forcing, "
                 f"{training['epochs']} epochs of its tokens; shuffle buffer {tc.get('buffer'):,} rows."),
              f"- Adam, peak lr {tc.get('lr')}, warm-up {tc.get('warmup')}, cosine decay; "
              + (f"AuxK coefficient {tc.get('aux_coef'):.4g}, dead after {tc.get('dead_after'):,} activations."
                 if arch in ("topk", "batchtopk") else
                 f"L0 penalty (straight-through, bandwidth {tc.get('bandwidth')}) steered to L0 "
                 f"{tc.get('target_l0') or tc.get('k')}, final coefficient "
                 f"{training.get('final', {}).get('l1_coef', float('nan')):.3g}." if arch == "jumprelu" else
                 f"L1 target L0 {tc.get('target_l0')}, final L1 coefficient "
                 f"{training.get('final', {}).get('l1_coef', float('nan')):.3g}.")
              + (f" Inference threshold: the running mean (rate {tc.get('threshold_lr')}) of each batch's "
                 "smallest kept activation." if arch == "batchtopk" else ""),
              *([f"- End-to-end term in the last {tc['kl_steps']} steps: {tc['kl_coef']:g} x KL(clean || spliced) "
                 "per target token of whole teacher-forced sentences, beside the reconstruction loss."]
                if tc.get("kl_coef") and tc.get("kl_steps") else []),
              *_card_dense_cap(tc),
              f"- Training time: {training['train_seconds'] / 60:.1f} min wall clock on {training['world']} "
              f"process(es) (the log's elapsed_s; the machine was shared, see the project's CHANGELOG).",
              f"- Command: `{tc.get('extra', {}).get('command', '')}`"]


def _card_dense_cap(tc: dict) -> list[str]:
    """The dense-feature hold-back (`features train --dense-cap R --dense-rate ρ`) and the rare-feature push, when
    the stage had them."""
    if not tc.get("dense_cap"):
        return _card_rare_floor(tc)
    return [f"- Dense features held back: while a feature's running firing rate (an exponential mean over about ten "
            f"batches) exceeded {tc['dense_cap']:g}, its encoder bias stepped down by {tc['dense_rate']:g} x "
            "the batch's mean active value each step (`--dense-cap`, `--dense-rate`)."] + _card_rare_floor(tc)


def _card_rare_floor(tc: dict) -> list[str]:
    """The rare-feature push (`features train --rare-floor F --rare-rate ρ`), when the stage had one."""
    if not tc.get("rare_floor"):
        return []
    return [f"- Rare features pushed forward: while a feature's running firing rate (an exponential mean over about "
            f"ten batches) was below {tc['rare_floor']:g}, its encoder bias rose each step by {tc['rare_rate']:g} x "
            "the rise that would have put it among the kept activations of that share of the batch's rows "
            "(`--rare-floor`, `--rare-rate`)."]


def _card_finetune(training: dict[str, Any], tc: dict, start: dict[str, Any]) -> list[str]:
    """The end-to-end fine-tune (`features train --finetune-kl`) that made the dictionary from `start`."""
    stages = [training]
    while stages[-1].get("finetuned_from", {}).get("training"):  # every stage back to the first training
        stages.append(stages[-1]["finetuned_from"]["training"])
    total = sum(t["train_seconds"] for t in stages)
    cpu = sum(t.get("train_cpu_seconds", 0.0) for t in stages)
    sha = f" (weights SHA-256 {start['weights_sha256'][:12]}…)" if start.get("weights_sha256") else ""
    ce_term = (f" + {tc['finetune_ce']:g} x the spliced cross-entropy on the reference" if tc.get("finetune_ce")
               else "")
    return [f"- Then fine-tuned end to end from `{start['directory']}`{sha} (Braun et al. 2024; feature indices kept: "
            f"it starts from those weights): {training['steps']} steps, each on whole teacher-forced sentences of "
            f"at most {tc.get('kl_tokens') or tc.get('max_tokens')} padded tokens a side ({training['activations']:,} "
            f"site rows, {training['epochs']} epochs of `{tc.get('dataset')}:{tc.get('split')}`), loss KL(clean ‖ "
            f"spliced) per target token{ce_term} + {tc.get('finetune_mse'):g} x FVU; Adam, peak lr "
            f"{tc.get('kl_lr') or tc.get('lr')}, warm-up {tc.get('warmup')}, cosine decay.",
            *_card_dense_cap(tc),
            f"- Fine-tune time: {training['train_seconds'] / 60:.1f} min wall clock "
            f"({training.get('train_cpu_seconds', 0.0) / 60:.1f} min of CPU) on {training['world']} process(es); "
            f"with the training before it, {total / 60:.1f} min wall clock ({cpu / 60:.1f} min of CPU).",
            f"- Fine-tune command: `{tc.get('extra', {}).get('command', '')}`"]

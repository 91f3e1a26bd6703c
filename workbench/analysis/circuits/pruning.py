"""Pruning curves: BLEU and chrF as heads are removed in order of importance, per attention kind
(Michel et al. 2019, Figure 3; Voita et al. 2019, Table 2).

    curve = pruning_curve(model, sources, targets, detokenize=tok.decode, references=refs)
    curve.table                      # kind, removed, total, bleu, chrf, d_bleu, d_chrf, heads
    curve.removable("enc_self")      # heads of that kind removable at <= 0.5 BLEU loss (and the share)
    curve.knee("enc_self")           # (first, last): before the first drop past the loss, and the last level within it

Importance is measured once, by ablation (`head_importance`, teacher-forced: the change in the references'
log-probability when one head alone is zeroed); heads are then removed least important first, cumulatively,
within one attention kind at a time, the other kinds left whole, and each level is decoded greedily.

Clean runs are reused, not recomputed: the unpruned model is decoded once and is level 0 of every kind's
curve; the importance pass scores every ablation against one clean teacher-forced run; and the encoder output of
the clean model is computed once per batch and handed to the decoder at every level that removes decoder heads
(decoder self-attention and cross-attention cannot change the encoder), so only encoder pruning re-encodes.
`benchmarks/bench_pruning.py` measures what that saves.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ...core.batching import corpus_batches
from ...core.heads import KINDS
from ...core.interventions import ablate_heads
from ...core.protocols import Progress
from ...decoding.evaluate import score
from ...decoding.search import greedy
from ..attention.head_stats import fit_to_positions
from .interventions_effect import head_importance


@dataclass
class PruningCurve:
    """`table`: one row per (kind, heads removed); `importance`: the ablation table the order came from."""

    table: object
    importance: object
    baseline: dict = field(default_factory=dict)
    sentences: int = 0

    def curve(self, kind: str, order: str = "importance"):
        """The rows of one kind and order ("importance", or "random": every draw), by heads removed."""
        t = self.table
        keep = (t["kind"] == kind) & ((t["order"] == order) if "order" in t else order == "importance")
        return t[keep].sort_values(["removed", "draw"] if "draw" in t else "removed")

    def versus_random(self, kind: str, removed: int) -> dict[str, float]:
        """The control: ΔBLEU with the `removed` least important heads gone, beside the random orders' at the same
        count (their mean and how many did at least as well)."""
        imp = self.curve(kind)
        rnd = self.curve(kind, "random")
        a, b = imp[imp["removed"] == removed], rnd[rnd["removed"] == removed]
        if a.empty or b.empty:
            raise KeyError(f"no {kind} rows at {removed} heads removed in both orders: pass random_orders and a "
                           f"random_steps holding {removed}")
        return {"removed": removed, "importance": float(a["d_bleu"].iloc[0]), "random_mean": float(b["d_bleu"].mean()),
                "random_draws": len(b), "random_at_least_as_good": int((b["d_bleu"] >= a["d_bleu"].iloc[0]).sum())}

    def removable(self, kind: str, max_loss: float = 0.5) -> tuple[int, float]:
        """(heads, share of the kind's heads) removable with BLEU at most `max_loss` below the unpruned model's:
        the most removed before the curve first drops further (later recoveries do not count)."""
        part = self.curve(kind)
        if part.empty:
            raise KeyError(f"no curve for {kind!r}; kinds: {sorted(set(self.table['kind']))}")
        best = 0
        for _, r in part.iterrows():
            if r["d_bleu"] < -max_loss - 1e-9:
                break
            best = int(r["removed"])
        return best, best / int(part["total"].iloc[0])

    def knee(self, kind: str, max_loss: float = 0.5) -> tuple[int, int]:
        """Where the curve's knee lies, as (first, last): `removable`'s count (the most heads removed before BLEU
        first falls more than `max_loss` below the unpruned model's) and the most heads removed at any level still
        within `max_loss` of it. They differ when a level falls past the loss and a later one recovers: on a
        small test set one head's removal can cost more than the sampling noise allows to read, so the knee is
        placed between the two, not at either."""
        first, _ = self.removable(kind, max_loss)
        part = self.curve(kind)
        return first, int(part[part["d_bleu"] >= -max_loss - 1e-9]["removed"].max())


def importance_order(importance, kind: str) -> list[int]:
    """Row indices of `importance` for `kind`, least important first (largest change in log-probability first:
    a head whose removal helps goes before one whose removal hurts); ties by layer and head."""
    part = importance[(importance["kind"] == kind) & (importance["head_index"] != "all")]
    order = part.assign(_k=-part["d_ref_log_prob"]).sort_values(["_k", "layer", "head_index"], kind="stable")
    return list(order.index)


@torch.no_grad()
def pruning_curve(model, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *,
                  detokenize: Callable[[list[int]], str], references: Sequence[str],
                  kinds: Sequence[str] = KINDS, importance=None, steps: Sequence[int] | None = None,
                  batch_size: int = 64, reuse_clean: bool = True, random_orders: int = 0,
                  random_steps: Sequence[int] | None = None, seed: int = 0,
                  progress: Progress | None = None, **decode_options) -> PruningCurve:
    """BLEU/chrF of greedy outputs with the k least important heads of each kind removed, k = 0..all (or `steps`).

    `sources`/`targets` are token ids ending with EOS (targets for the importance pass), `references` the texts
    scored against. `importance`: a `head_importance` table to reuse (else measured here, teacher-forced only).
    `reuse_clean=False` re-encodes at every level (for the benchmark and the test that both agree).
    `random_orders`: the control, so many random orders of each kind's heads (seeded by `seed`), removed at
    `random_steps` (default: `steps`); their rows have `order` "random" and `draw` 0.. (the importance order's rows:
    "importance", draw 0). A pruning claim is that the importance order beats these.
    """
    import pandas as pd

    if len(references) != len(sources):
        raise ValueError(f"{len(references)} references for {len(sources)} sources")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown kinds {bad}; known: {KINDS}")
    cfg = model.cfg
    fitted = fit_to_positions(cfg.max_positions, sources, targets, cut_targets=False)
    if fitted.report():
        warnings.warn(fitted.report("pruning_curve"), stacklevel=2)
    refs = [references[i] for i in fitted.ids]
    if importance is None:
        importance = head_importance(model, fitted.sources, fitted.targets, kinds=kinds, decode=False,
                                     batch_size=batch_size)
    run = _scorer(model, fitted.sources, refs, detokenize=detokenize, batch_size=batch_size, reuse_clean=reuse_clean,
                  decode_options=decode_options)
    base_bleu, base_chrf = run({}, True)
    rows = []
    generator = torch.Generator().manual_seed(seed)
    for kind in kinds:
        for name, draw, ordered, chosen in _removal_orders(importance, kind, steps, random_orders, random_steps,
                                                           generator):
            total = len(ordered)
            levels = sorted({int(k) for k in (chosen if chosen is not None else range(total + 1)) if 0 <= k <= total})
            for n, k in enumerate(levels):
                removed = ordered[:k]
                if k == 0:
                    bleu, chrf = base_bleu, base_chrf
                else:
                    bleu, chrf = run(ablate_heads(removed), kind != "enc_self")
                rows.append({"kind": kind, "order": name, "draw": draw, "removed": k, "total": total, "bleu": bleu,
                             "chrf": chrf, "d_bleu": bleu - base_bleu, "d_chrf": chrf - base_chrf,
                             "heads": " ".join(f"{layer}:{head}" for _, layer, head in removed)})
                if progress is not None and name == "importance":
                    progress(n + 1, len(levels), kind)
    table = pd.DataFrame(rows)
    return PruningCurve(table, importance, {"bleu": base_bleu, "chrf": base_chrf}, len(fitted.sources))


def _scorer(model, sources: Sequence[Sequence[int]], refs: Sequence[str], *, detokenize: Callable[[list[int]], str],
            batch_size: int, reuse_clean: bool, decode_options: dict) -> Callable[[dict, bool], tuple[float, float]]:
    """`run(hooks, decoder_only) -> (BLEU, chrF)` of greedy outputs under `hooks`. The sources are batched once (in
    length order); with `reuse_clean`, a run that edits only the decoder reads the clean encoder outputs."""
    cfg = model.cfg
    batches = [(idx, b.src) for idx, b in corpus_batches(sources, pad_id=cfg.pad_id, batch_size=batch_size,
                                                         device=model.device)]
    clean_memory = [model.encode(src) for _, src in batches] if reuse_clean else None

    def run(hooks: dict, decoder_only: bool) -> tuple[float, float]:
        outputs: list[list[int] | None] = [None] * len(sources)
        with model.hooks(hooks):
            for b, (idx, src) in enumerate(batches):
                enc = clean_memory[b] if (decoder_only and clean_memory is not None) else None
                gen = greedy(model, src, encoded=enc, **decode_options)
                for i, h in zip(idx, gen.best):
                    outputs[i] = h.tokens
        s = score([detokenize(o) for o in outputs], [list(refs)])
        return s.bleu, s.chrf

    return run


def _removal_orders(importance, kind: str, steps: Sequence[int] | None, random_orders: int,
                    random_steps: Sequence[int] | None, generator: torch.Generator) -> list[tuple]:
    """(order name, draw, heads in removal order, levels) for one kind: the importance order (least important
    first), then `random_orders` random orders drawn from `generator`."""
    ranked = importance.loc[importance_order(importance, kind)]
    total = len(ranked)
    heads = [(kind, int(r["layer"]), int(r["head_index"])) for _, r in ranked.iterrows()]
    orders = [("importance", 0, heads, steps)]
    orders += [("random", d, [heads[i] for i in torch.randperm(total, generator=generator).tolist()],
                random_steps if random_steps is not None else steps) for d in range(random_orders)]
    return orders

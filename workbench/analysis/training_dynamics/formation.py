"""How attention's evidence forms during training: per-head AER, source share and roles at every saved snapshot.

    probe = FormationProbe.rwth(tm, test_sources, test_references)   # gold alignments + a test set, once
    record = probe.measure(tm)                                        # one snapshot: a JSON-ready dict
    records = formation_records("runs/m30k", probe_factory)          # every step_* of a run, in step order

A record holds, for one snapshot: its step; every cross-attention head's AER against the gold (word level,
`word_align.alignment_maps`, attention weights, AWI or AWO) and the best one; the diagonal aligner's AER on
the same gold (the baseline a head must beat to count as an aligner); the mean source share of the output
tokens over the test sentences (ALTI+, `alti.alti`, teacher-forced on the references) and its mean by output
position; and every head's roles (`roles.head_roles`) with the counts per kind. `workbench formation RUN_DIR`
writes them as JSON and CSV with a chart (`charts.evidence.formation_chart`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ...core.heads import Head
from ...core.model import evaluating
from ...core.protocols import Progress
from ...decoding.translator import load as load_checkpoint
from ..alignment.alignment import Link, read_alignments, score_alignments
from ..alignment.word_align import Words, alignment_maps, encode_words, unit_scores
from ..attention.head_stats import corpus_head_stats, punctuation_ids
from ..attention.roles import RoleRules, head_roles
from ..attribution.source_share import by_position, output_source_shares


def diagonal_links(n_src: int, n_tgt: int) -> set[Link]:
    """The diagonal aligner: target word j linked to source word round(j·(S-1)/(T-1)) (0-based, Pharaoh order)."""
    if n_src < 1 or n_tgt < 1:
        return set()
    if n_tgt == 1:
        return {(0, 0)}
    return {(int(round(j * (n_src - 1) / (n_tgt - 1))), j) for j in range(n_tgt)}


def head_aer_table(maps, gold, *, eos: str = "drop"):
    """DataFrame head_id, layer, head_index, aer of every cross-attention head's argmax links (`maps`: one
    `WordMaps` per gold pair; `word_align.unit_scores`), best first."""
    import pandas as pd

    if len(maps) != len(gold):
        raise ValueError(f"{len(maps)} alignment maps for {len(gold)} gold alignments")
    rows = [{"head_id": str(Head("cross", layer, head)), "layer": layer, "head_index": head, "aer": e}
            for (layer, head), e in unit_scores(maps, gold, eos=eos).items() if head is not None]
    return pd.DataFrame(rows).sort_values(["aer", "layer", "head_index"], kind="stable").reset_index(drop=True)


@torch.no_grad()
def gold_aer(tm, gold_src: Sequence[str], gold_tgt: Sequence[str], gold, *, shift: str = "awi"):
    """(per-head AER table, the diagonal aligner's AER, pairs scored) of a `TranslationModel` on gold alignments.
    Words are the whitespace tokens of the gold lines (pieces summed into source words, averaged into target
    words: `word_align`); attention weights, argmax per target word; pairs longer than the model's positions
    are left out of both scores."""
    cfg = tm.model.cfg
    src_w = [encode_words(tm.src_tokenizer, line) for line in gold_src]
    tgt_w = [encode_words(tm.tgt_tokenizer, line) for line in gold_tgt]
    keep = [k for k, (s, t) in enumerate(zip(src_w, tgt_w)) if _fits(s, t, cfg.max_positions)]
    if not keep:
        raise ValueError("no gold pair fits the model")
    maps = alignment_maps(tm.model, [src_w[k] for k in keep], [tgt_w[k] for k in keep], method="weights",
                          shift=shift)
    kept = [gold[k] for k in keep]
    diagonal = score_alignments([diagonal_links(len(src_w[k].words), len(tgt_w[k].words)) for k in keep], kept)
    return head_aer_table(maps, kept), diagonal.aer, len(keep)


@dataclass
class FormationProbe:
    """What every snapshot is measured on: gold word alignments (lines and links) and a test set (texts)."""

    gold_src: list[str]
    gold_tgt: list[str]
    gold: list
    test_src: list[str]
    test_ref: list[str]
    shift: str = "awi"
    share_sentences: int = 100
    rules: RoleRules = field(default_factory=RoleRules)

    @classmethod
    def from_files(cls, gold_src: str | Path, gold_tgt: str | Path, gold: str | Path, test_src: Sequence[str],
                   test_ref: Sequence[str], *, base: int = 1, limit: int = 0, **kw) -> FormationProbe:
        """Gold lines and a talp/Pharaoh alignment file (`base` 1 for talp gold), first `limit` pairs (0: all)."""
        src = Path(gold_src).read_text(encoding="utf-8").splitlines()
        tgt = Path(gold_tgt).read_text(encoding="utf-8").splitlines()
        links = read_alignments(gold, base=base)
        if not len(src) == len(tgt) == len(links):
            raise ValueError(f"gold files differ in length: {len(src)} source, {len(tgt)} target, {len(links)} "
                             "alignment lines")
        n = limit or len(src)
        return cls(src[:n], tgt[:n], links[:n], list(test_src), list(test_ref), **kw)

    def measure(self, tm, *, step: int | None = None) -> dict:
        """One snapshot's record (module docstring); `tm` a `TranslationModel`."""
        with evaluating(tm.model):
            return self._measure(tm, step)

    @torch.no_grad()
    def _measure(self, tm, step: int | None) -> dict:
        model = tm.model
        aer, diagonal, n_gold = gold_aer(tm, self.gold_src, self.gold_tgt, self.gold, shift=self.shift)
        roles = model_roles(tm, self.test_src, self.test_ref, aer=aer, diagonal_aer=diagonal, rules=self.rules)
        pairs = _pairs(tm, self.test_src, self.test_ref)
        share, by_pos = self._source_share(model, pairs[: self.share_sentences])
        best = aer.iloc[0]
        grid = np.full((int(aer["layer"].max()) + 1, int(aer["head_index"].max()) + 1), np.nan)
        for _, r in aer.iterrows():
            grid[int(r["layer"]), int(r["head_index"])] = r["aer"]
        return {
            "step": step, "shift": self.shift, "gold_pairs": n_gold,
            "best_aer": float(best["aer"]), "best_head": best["head_id"],
            "diagonal_aer": float(diagonal), "head_aer": grid.tolist(),
            "source_share": share, "source_share_by_position": by_pos,
            "role_counts": roles.counts(),
            "roles": {r["head_id"]: r["roles"] for _, r in roles.table.iterrows()},
            "stats": {r["head_id"]: {k: _num(r[k]) for k in
                                                                ("prev_top", "next_top", "eos", "punct", "rare")}
                      for _, r in roles.table.iterrows()},
        }

    @staticmethod
    def _source_share(model, pairs) -> tuple[float | None, list[float]]:
        """Mean ALTI+ source share of the output tokens of `pairs` (teacher-forced on the references; EOS left
        out) and its mean by output position (positions with at least 10 tokens): `source_share`'s functions."""
        if not pairs:
            return None, []
        shares = output_source_shares(model, [s for s, _ in pairs], [t for _, t in pairs])
        every = np.concatenate([s[:-1] for s in shares])
        by_pos = [mean for _, (mean, n) in sorted(by_position(shares).items()) if n >= 10]
        return (float(every.mean()) if every.size else None), by_pos


def _pairs(tm, sources: Sequence[str], references: Sequence[str]) -> list[tuple[list[int], list[int]]]:
    cfg = tm.model.cfg
    out = []
    for s, t in zip(sources, references):
        ids = tm.encode_source(s)[0]
        if ids:
            out.append((ids, tm.tgt_tokenizer.encode(t)[: cfg.max_positions - 1] + [cfg.eos_id]))
    return out


@torch.no_grad()
def model_roles(tm, sources: Sequence[str], references: Sequence[str], *, aer=None, diagonal_aer: float | None = None,
                rules: RoleRules | None = None, progress: Progress | None = None, batch_size: int = 64):
    """Every head's roles (`roles.head_roles`) from statistics teacher-forced on the references of `sources`
    (token counts for "rare" from the same sentences), with a per-head AER table for the alignment role.
    `progress(done, total)` after each batch (a caller stops the measurement by raising from it)."""
    cfg = tm.model.cfg
    pairs = _pairs(tm, sources, references)
    if not pairs:
        raise ValueError("no non-empty sentence to measure the heads on")
    stats = corpus_head_stats(tm.model, [s for s, _ in pairs], [t for _, t in pairs],
                              src_punct=punctuation_ids(tm.src_tokenizer.pieces(list(range(cfg.src_vocab)))),
                              tgt_punct=punctuation_ids(tm.tgt_tokenizer.pieces(list(range(cfg.tgt_vocab)))),
                              progress=progress, batch_size=batch_size)
    return head_roles(stats, aer=aer, diagonal_aer=diagonal_aer, rules=rules)


def _fits(s: Words, t: Words, max_positions: int) -> bool:
    return bool(s.ids) and bool(t.ids) and len(s.ids) + 1 <= max_positions and len(t.ids) + 1 <= max_positions


def _num(x) -> float | None:
    x = float(x)
    return None if np.isnan(x) else x


def snapshots(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every step_* checkpoint of a run directory, in step order."""
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"no run directory {run}")
    out = []
    for p in run.glob("step_*"):
        if p.is_dir() and p.name[5:].isdigit() and (p / "model.safetensors").is_file():
            out.append((int(p.name[5:]), p))
    if not out:
        raise FileNotFoundError(f"{run} has no step_* checkpoints")
    return sorted(out)


def formation_records(run_dir: str | Path, probe: FormationProbe, *, steps: Sequence[int] | None = None,
                      cache: str | Path | None = None, load: Callable | None = None,
                      progress: Progress | None = None) -> list[dict]:
    """`probe.measure` at every snapshot of a run (or the chosen `steps`). With `cache` (a JSON file), records
    already measured are read from it and new ones appended, so a growing run is measured incrementally."""
    load = load or load_checkpoint
    done: dict[int, dict] = {}
    cache = Path(cache) if cache else None
    if cache and cache.is_file():
        done = {int(r["step"]): r for r in json.loads(cache.read_text(encoding="utf-8"))}
    todo = [(s, p) for s, p in snapshots(run_dir) if steps is None or s in set(steps)]
    for n, (step, path) in enumerate(todo):
        if step not in done:
            done[step] = probe.measure(load(path), step=step)
            if cache:
                cache.write_text(json.dumps([done[k] for k in sorted(done)], indent=1), encoding="utf-8")
        if progress is not None:
            progress(n + 1, len(todo), f"step {step}")
    return [done[s] for s, _ in todo]

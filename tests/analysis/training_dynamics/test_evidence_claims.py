"""Notebook 07's conclusions hold on the same side on a smaller set (issue 38 point 7), each with its control:
a source spelled backwards gets a lower source share than the same sentence as written, in every sentence; the
importance ranking's 8 least important cross-attention heads cost less BLEU than at least 8 of 10 random choices;
the best cross-attention head aligns better than the diagonal aligner on the RWTH gold. The notebook prints the
same quantities from the same library calls (`notebooks/07_evidence.py`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from model_helpers import SHARED_DATA

from workbench import load
from workbench.analysis.alignment.alignment import read_alignments
from workbench.analysis.attribution.source_share import output_source_shares
from workbench.analysis.circuits.pruning import pruning_curve
from workbench.analysis.training_dynamics.formation import gold_aer
from workbench.checkpoint.shipped import shipped

MULTI30K = SHARED_DATA / "multi30k"
RWTH = SHARED_DATA / "alignments" / "rwth-deen"
pytestmark = pytest.mark.skipif(not (MULTI30K / "test_2016_flickr.de").is_file(), reason="needs ../shared/data")


@pytest.fixture(scope="module")
def tm():
    torch.set_num_threads(1)
    return load(shipped("multi30k-de-en"))


def _lines(name: str, n: int) -> list[str]:
    return (MULTI30K / name).read_text(encoding="utf-8").splitlines()[:n]


def _shares(tm, sentences: list[str]) -> np.ndarray:
    sources = [tm.encode_source(s)[0] for s in sentences]
    outputs = [tm.tgt_tokenizer.encode(t) + [tm.model.cfg.eos_id] for t in tm.translate(sentences)]
    return np.array([s[:-1].mean() for s in output_source_shares(tm.model, sources, outputs)])


def test_a_source_spelled_backwards_gets_a_lower_source_share(tm):
    written = _lines("test_2016_flickr.de", 8)
    backwards = [" ".join(w[::-1] for w in s.split()) for s in written]
    clean, unreadable = _shares(tm, written), _shares(tm, backwards)
    assert (unreadable < clean).all(), (clean, unreadable)
    assert unreadable.mean() < clean.mean() - 0.1


def test_the_importance_ranking_beats_random_pruning_orders(tm):
    cfg = tm.model.cfg
    src, ref = _lines("test_2016_flickr.de", 16), _lines("test_2016_flickr.en", 16)
    sources = [tm.encode_source(s)[0] for s in src]
    targets = [tm.tgt_tokenizer.encode(t)[: cfg.max_positions - 1] + [cfg.eos_id] for t in ref]
    curve = pruning_curve(tm.model, sources, targets, detokenize=tm.detokenize, references=ref, kinds=("cross",),
                          steps=[0, 8], random_orders=10, random_steps=[8])
    vs = curve.versus_random("cross", 8)
    assert vs["random_at_least_as_good"] <= 2, vs
    assert vs["importance"] > vs["random_mean"]


@pytest.mark.skipif(not (RWTH / "test.talp").is_file(), reason="needs the RWTH gold alignments")
def test_the_best_cross_attention_head_beats_the_diagonal_aligner(tm):
    n = 40
    gold_src = (RWTH / "test.de").read_text(encoding="utf-8").splitlines()[:n]
    gold_tgt = (RWTH / "test.en").read_text(encoding="utf-8").splitlines()[:n]
    gold = read_alignments(RWTH / "test.talp", base=1)[:n]
    aer, diagonal, _ = gold_aer(tm, gold_src, gold_tgt, gold, shift="awi")
    assert float(aer.iloc[0]["aer"]) < diagonal
    assert Path(shipped("multi30k-de-en")).is_dir()

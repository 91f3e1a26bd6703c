"""Head importance: an unused head changes nothing; a used one does; patching reproduces the donor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_helpers import make_model

from workbench import presets
from workbench.analysis.circuits.interventions_effect import (
    head_importance,
    intervention_effect,
    patch_effect,
    run_outcome,
)
from workbench.core.interventions import ablate_heads

SOURCES = [[5, 6, 7, 2], [8, 9, 2], [10, 11, 12, 13, 2]]
TARGETS = [[6, 7, 2], [9, 2], [11, 12, 2]]
DECODE = {"max_len_b": 6}


def _model():
    cfg = presets.tiny(vocab=20)
    return make_model(cfg, seed=3)


def test_ablating_an_unused_head_changes_nothing():
    model = _model()
    attn = model.dec[1].cross_attn
    with torch.no_grad():  # head 2 writes nothing: zero its columns of the output projection
        attn.out_proj.weight[:, 2 * attn.d_head:3 * attn.d_head] = 0
    table = head_importance(model, SOURCES, TARGETS, kinds=["cross"], detokenize=lambda ids: " ".join(map(str, ids)),
                            references=["6 7", "9", "11 12"], **DECODE)
    row = table[(table["layer"] == 1) & (table["head_index"] == 2)].iloc[0]
    assert row["d_ref_log_prob"] == 0.0 and row["changed_sentences"] == 0.0 and row["changed_tokens"] == 0.0
    assert row["d_bleu"] == 0.0 and row["d_chrf"] == 0.0
    # a head that writes does change the reference's probability
    others = table[~((table["layer"] == 1) & (table["head_index"] == 2))]
    assert (others["d_ref_log_prob"].abs() > 1e-6).all()
    assert len(table) == 2 * 4 and table.attrs["baseline"]["bleu"] is not None


def test_block_ablation_equals_ablating_all_its_heads():
    model = _model()
    blocks = head_importance(model, SOURCES, TARGETS, kinds=["enc_self"], units="block", decode=False)
    direct = intervention_effect(model, ablate_heads({("enc_self", 0): [0, 1, 2, 3]}), SOURCES, TARGETS,
                                 decode=False)
    row = blocks[blocks["layer"] == 0].iloc[0]
    assert row["head_index"] == "all" and row["d_ref_log_prob"] == direct["d_ref_log_prob"]


def test_reference_log_prob_matches_a_direct_computation_and_batching():
    model = _model()
    a = run_outcome(model, SOURCES, TARGETS, decode=False, batch_size=1).ref_log_prob
    b = run_outcome(model, SOURCES, TARGETS, decode=False, batch_size=3).ref_log_prob
    np.testing.assert_allclose(a, b, atol=1e-5)
    with torch.no_grad():
        logp = model(torch.tensor([SOURCES[0]]), torch.tensor([[1, 6, 7]])).log_softmax(-1)[0]
    assert abs(a[0] - sum(float(logp[t, tok]) for t, tok in enumerate(TARGETS[0]))) < 1e-5


def test_patching_the_memory_reproduces_the_donor():
    model = _model()
    src, donor = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[9, 10, 11, 2]])
    tgt = torch.tensor([[1, 6, 7]])
    out = patch_effect(model, "hook_memory", src, tgt, donor, tgt)
    torch.testing.assert_close(out["patched"], out["donor"])
    assert not torch.allclose(out["clean"], out["donor"])
    same = patch_effect(model, "hook_memory", src, tgt, src, tgt)
    torch.testing.assert_close(same["patched"], same["clean"])


def test_sentences_longer_than_the_positions_are_skipped_and_reported():
    """A corpus with one pair longer than max_positions (as newstest has): run_outcome warns, leaves that pair
    out (a cut reference would change its log p), keeps the others exactly, and filters the references to match."""
    cfg = presets.tiny(vocab=20, max_positions=6)
    model = make_model(cfg, seed=3)
    long_src, long_tgt = [5, 6, 7, 8, 9, 10, 11, 2], [6, 7, 2]
    sources, targets = [SOURCES[0], long_src, SOURCES[1]], [TARGETS[0], long_tgt, TARGETS[1]]
    with pytest.warns(UserWarning, match=r"run_outcome: 0 target\(s\) cut .* 1 sentence\(s\) skipped"):
        out = run_outcome(model, sources, targets, detokenize=lambda ids: " ".join(map(str, ids)),
                          references=["6 7", "long", "9"], **DECODE)
    alone = run_outcome(model, [SOURCES[0], SOURCES[1]], [TARGETS[0], TARGETS[1]], **DECODE)
    assert out.skipped == [1]
    np.testing.assert_allclose(out.ref_log_prob, alone.ref_log_prob)
    assert out.outputs == alone.outputs and out.bleu is not None

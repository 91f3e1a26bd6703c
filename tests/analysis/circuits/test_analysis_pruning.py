"""Pruning curves: the clean encoder output reused for decoder-side pruning gives exactly the re-encoded curve;
levels match ablating the same heads by hand; the removable count stops at the first drop past the loss, the
knee's bracket reaches the last level within it."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from model_helpers import make_model

from workbench import presets
from workbench.analysis.circuits.interventions_effect import run_outcome
from workbench.analysis.circuits.pruning import PruningCurve, importance_order, pruning_curve
from workbench.core.batching import pad_sequences
from workbench.core.interventions import ablate_heads
from workbench.decoding.search import beam_search, greedy

SOURCES = [[5, 6, 7, 8, 2], [9, 10, 2], [11, 12, 13, 2], [6, 14, 15, 16, 17, 2], [7, 7, 9, 2], [18, 5, 2]]
DECODE = {"max_len_b": 6, "max_len_a": 0.0}


def _text(ids) -> str:
    return " ".join(map(str, [i for i in ids if i > 3]))


def test_decoding_with_a_given_encoder_output_is_the_same_search():
    model = make_model(presets.tiny(vocab=24), seed=2)
    src = pad_sequences(SOURCES[:3], 0)
    enc = model.encode(src)
    for search in (greedy, lambda m, s, **kw: beam_search(m, s, beam=3, **kw)):
        a = [h.tokens for h in search(model, src, **DECODE).best]
        b = [h.tokens for h in search(model, src, encoded=enc, **DECODE).best]
        assert a == b
    with pytest.raises(ValueError, match="does not belong to a source batch"):
        greedy(model, src[:2], encoded=enc)


def test_curve_reusing_clean_runs_equals_reencoding_and_hand_ablation():
    model = make_model(presets.tiny(vocab=24), seed=2)
    with torch.no_grad():  # the clean outputs are the references: level 0 must score 100 BLEU
        refs = [_text(h.tokens) for h in greedy(model, pad_sequences(SOURCES, 0), **DECODE).best]
    targets = [[*[int(x) for x in r.split()], 2] if r else [2] for r in refs]
    kw = dict(detokenize=_text, references=refs, batch_size=4, **DECODE)
    reused = pruning_curve(model, SOURCES, targets, **kw)
    fresh = pruning_curve(model, SOURCES, targets, importance=reused.importance, reuse_clean=False, **kw)
    pd.testing.assert_frame_equal(reused.table, fresh.table)
    t = reused.table
    assert len(t) == 3 * 9 and t[t["removed"] == 0]["bleu"].tolist() == pytest.approx([100.0] * 3)
    assert (t["d_bleu"] < 0).any()  # removing heads does change this model's outputs
    # one level by hand: the 5 least important cross-attention heads zeroed, decoded and scored directly
    row = t[(t["kind"] == "cross") & (t["removed"] == 5)].iloc[0]
    heads = [("cross", int(x.split(":")[0]), int(x.split(":")[1])) for x in row["heads"].split()]
    imp = reused.importance
    assert [(h[1], h[2]) for h in heads] == [(int(imp.loc[i, "layer"]), int(imp.loc[i, "head_index"]))
                                            for i in importance_order(imp, "cross")[:5]]
    hand = run_outcome(model, SOURCES, targets, hooks=ablate_heads(heads), detokenize=_text, references=refs,
                       **DECODE)
    assert row["bleu"] == pytest.approx(hand.bleu) and row["chrf"] == pytest.approx(hand.chrf)


def test_importance_order_and_removable_count():
    imp = pd.DataFrame({"kind": ["enc_self"] * 4, "layer": [0, 0, 1, 1], "head_index": [0, 1, 0, 1],
                        "d_ref_log_prob": [-2.0, 0.1, -0.5, -0.5]})
    assert importance_order(imp, "enc_self") == [1, 2, 3, 0]  # helps first; ties by layer/head; most harmful last
    table = pd.DataFrame({"kind": "enc_self", "removed": [0, 1, 2, 3, 4], "total": 4,
                          "d_bleu": [0.0, -0.2, -0.7, -0.3, -5.0]})
    curve = PruningCurve(table, imp)
    assert curve.removable("enc_self") == (1, 0.25)  # the recovery at 3 does not count
    assert curve.removable("enc_self", max_loss=1.0) == (3, 0.75)
    assert curve.knee("enc_self") == (1, 3) and curve.knee("enc_self", max_loss=1.0) == (3, 3)
    with pytest.raises(KeyError, match="no curve for 'cross'"):
        curve.removable("cross")


def test_random_orders_are_the_control_and_agree_where_order_cannot_matter():
    model = make_model(presets.tiny(vocab=24), seed=2)
    with torch.no_grad():
        refs = [_text(h.tokens) for h in greedy(model, pad_sequences(SOURCES, 0), **DECODE).best]
    targets = [[*[int(x) for x in r.split()], 2] if r else [2] for r in refs]
    curve = pruning_curve(model, SOURCES, targets, detokenize=_text, references=refs, batch_size=4, kinds=("cross",),
                          steps=[0, 2, 4, 8], random_orders=3, random_steps=[0, 4, 8], seed=1, **DECODE)
    rnd = curve.curve("cross", "random")
    assert sorted(set(rnd["draw"])) == [0, 1, 2] and sorted(set(rnd["removed"])) == [0, 4, 8]
    imp = curve.curve("cross")
    # no head removed, or every head: the same heads whatever the order, so the same BLEU
    for k in (0, 8):
        assert set(rnd[rnd["removed"] == k]["bleu"]) == {float(imp[imp["removed"] == k]["bleu"].iloc[0])}
    # the draws are different orders
    assert len(set(rnd[rnd["removed"] == 4]["heads"])) > 1
    vs = curve.versus_random("cross", 4)
    assert vs["random_draws"] == 3 and 0 <= vs["random_at_least_as_good"] <= 3
    assert vs["random_mean"] == pytest.approx(float(rnd[rnd["removed"] == 4]["d_bleu"].mean()))
    assert curve.removable("cross") == PruningCurve(imp, curve.importance).removable("cross")
    with pytest.raises(KeyError, match="random_orders"):
        curve.versus_random("cross", 2)

"""Alignment error rate on constructed alignments (exact values) and head scoring."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.analysis.alignment.alignment import (
    aer,
    alignment_head_scores,
    attention_links,
    corpus_aer,
    parse_pharaoh,
)


def test_parse_pharaoh_sure_and_possible():
    sure, possible = parse_pharaoh("0-0 1-2 2?1\n")
    assert sure == {(0, 0), (1, 2)} and possible == {(0, 0), (1, 2), (2, 1)}
    with pytest.raises(ValueError, match="bad alignment link"):
        parse_pharaoh("0-0 1:2")


def test_aer_exact_on_constructed_alignment():
    sure = {(0, 0), (1, 1), (2, 2)}
    possible = sure | {(2, 3)}
    pred = {(0, 0), (1, 1), (2, 3), (3, 3)}
    # |A∩S| = 2, |A∩P| = 3, |A| = 4, |S| = 3: AER = 1 - 5/7
    assert aer(pred, sure, possible) == pytest.approx(2 / 7)
    assert aer(sure, sure) == 0.0 and aer({(5, 5)}, sure) == 1.0
    # corpus AER sums counts first: (2+3 + 1+1) / (4+3 + 1+1)
    assert corpus_aer([pred, {(0, 0)}], [sure, {(0, 0)}], [possible, set()]) == pytest.approx(1 - 7 / 9)


def test_attention_links_argmax_and_threshold():
    m = np.array([[0.9, 0.1, 0.0], [0.2, 0.3, 0.5]])  # (T=2, S=3)
    assert attention_links(m) == {(0, 0), (2, 1)}
    assert attention_links(m, method="threshold", threshold=0.25) == {(0, 0), (1, 1), (2, 1)}


def test_head_scores_find_the_aligning_head():
    rng = np.random.default_rng(0)
    sents, refs = [], []
    for n in (4, 5, 6):
        perm = rng.permutation(n)  # target t aligns to source perm[t]
        a = rng.dirichlet(np.ones(n), size=(2, 3, n))  # (L, H, T, S) noise
        a[1, 2] = np.eye(n)[perm] * 0.9 + 0.1 / n  # layer 1 head 2 is a perfect aligner
        sents.append(a)
        refs.append({(int(perm[t]), t) for t in range(n)})
    table = alignment_head_scores(sents, refs)
    best = table.iloc[0]
    assert (best["layer"], best["head_index"], best["aer"]) == (1, 2, 0.0)
    assert len(table) == 2 * 3 + 2 + 1 and set(table["reference"]) == {"reference alignments"}
    own = alignment_head_scores(sents)
    assert own["reference"].iloc[0].startswith("model-average aligner")
    assert own[(own["layer"] == "all")]["agreement"].item() == 1.0  # the average agrees with itself
    with pytest.raises(ValueError, match="outside"):
        alignment_head_scores(sents, [{(9, 0)}, refs[1], refs[2]])


def test_corpus_cross_attention_rows_and_shift():
    import torch
    from model_helpers import make_model

    from workbench import presets
    from workbench.analysis.alignment.alignment import corpus_cross_attention

    cfg = presets.tiny(vocab=30)
    model = make_model(cfg)
    sources, targets = [[5, 6, 7, 2], [8, 2]], [[9, 10, 2], [11, 12, 13, 2]]
    pred = corpus_cross_attention(model, sources, targets, batch_size=1)
    inp = corpus_cross_attention(model, sources, targets, shift="input")
    assert [a.shape for a in pred] == [(2, 4, 2, 3), (2, 4, 3, 1)]
    _, trace = model.run_with_cache(torch.tensor([[5, 6, 7, 2]]), torch.tensor([[1, 9, 10]]))
    full = trace.stack("dec.*.cross_attn.hook_probs")[:, 0].numpy()  # (L, H, 3, 4)
    np.testing.assert_allclose(pred[0], full[:, :, 0:2, :3], atol=1e-6)
    np.testing.assert_allclose(inp[0], full[:, :, 1:3, :3], atol=1e-6)


def test_long_sentences_are_skipped_and_the_references_follow():
    """A pair longer than max_positions is left out with a warning; the head scores take the corpus's
    references and pick the ones of the sentences kept."""
    import pytest
    from model_helpers import make_model

    from workbench import presets
    from workbench.analysis.alignment.alignment import alignment_head_scores, corpus_cross_attention

    model = make_model(presets.tiny(vocab=30, max_positions=5))
    sources = [[5, 6, 7, 2], [5, 6, 7, 8, 9, 10, 2], [8, 9, 2]]
    targets = [[9, 10, 2], [9, 10, 2], [11, 12, 2]]
    refs = [{(0, 0), (1, 1)}, {(5, 1)}, {(0, 0), (1, 1)}]  # the skipped sentence's links lie outside any kept one
    with pytest.warns(UserWarning, match=r"1 sentence\(s\) skipped"):
        cross = corpus_cross_attention(model, sources, targets)
    assert cross.ids == [0, 2] and cross.skipped == [1] and len(cross) == 2
    kept = corpus_cross_attention(model, [sources[0], sources[2]], [targets[0], targets[2]])
    for a, b in zip(cross, kept):
        np.testing.assert_allclose(a, b)
    table = alignment_head_scores(cross, refs)
    assert table.equals(alignment_head_scores(kept, [refs[0], refs[2]]))

"""Sub-word -> word merging: grouping per scheme, rows still sum to 1, merge == explicit loop."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.charts.tokens import merge_attention, merge_mask, word_groups


@pytest.mark.parametrize(
    ("pieces", "words"),
    [
        (["▁The", "▁cat", "s", "▁sat", ".", "</s>"], ["The", "cats", "sat.", "</s>"]),
        (["<s>", "s", "▁Die", "▁Katze", "n"], ["<s>", "s", "Die", "Katzen"]),
        (["the", "ca@@", "t@@", "s", "sat", "</s>"], ["the", "cats", "sat", "</s>"]),
        (["the</w>", "ca", "ts</w>", "sat</w>"], ["the", "cats", "sat"]),
        (["the", "ca", "##ts", "sat"], ["the", "cats", "sat"]),
        (["a", "b", "c"], ["a", "b", "c"]),
    ],
)
def test_word_groups_per_scheme(pieces, words):
    groups = word_groups(pieces)
    assert list(groups.words) == words
    assert sorted(i for g in groups.groups for i in g) == list(range(len(pieces)))


def test_unknown_scheme_is_refused():
    with pytest.raises(ValueError, match="unknown sub-word scheme"):
        word_groups(["a"], scheme="morfessor")


def _explicit_merge(attn, qg, kg):
    out = np.zeros((len(qg.words), len(kg.words)))
    for wq, q_pieces in enumerate(qg.groups):
        for wk, k_pieces in enumerate(kg.groups):
            out[wq, wk] = np.mean([attn[q, list(k_pieces)].sum() for q in q_pieces])
    return out


def test_merge_keeps_rows_summing_to_one_and_matches_loop():
    rng = np.random.default_rng(0)
    q = ["<s>", "▁Die", "▁Katze", "n", "▁sa", "ßen", "."]
    k = ["▁The", "▁cat", "s", "▁sat", ".", "</s>"]
    attn = rng.random((3, len(q), len(k)))
    attn /= attn.sum(-1, keepdims=True)
    qg, kg = word_groups(q), word_groups(k)
    merged = merge_attention(attn, qg, kg)
    assert merged.shape == (3, len(qg.words), len(kg.words))
    np.testing.assert_allclose(merged.sum(-1), 1.0, atol=1e-12)
    for h in range(3):
        np.testing.assert_allclose(merged[h], _explicit_merge(attn[h], qg, kg), atol=1e-12)


def test_merge_one_side_and_length_errors():
    k = word_groups(["▁a", "b", "▁c"])
    attn = np.full((2, 3), 1 / 3)
    np.testing.assert_allclose(merge_attention(attn, None, k), [[2 / 3, 1 / 3]] * 2)
    with pytest.raises(ValueError, match="4 key pieces"):
        merge_attention(attn, None, word_groups(["▁a", "b", "▁c", "d"]))


def test_word_cell_masked_only_when_all_pieces_masked():
    g = word_groups(["▁a", "b", "▁c"])
    masked = np.array([[False, True, True], [False, False, True], [False, False, False]])
    merged = merge_mask(masked, g, g)
    assert merged.tolist() == [[False, True], [False, False]]

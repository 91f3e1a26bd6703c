"""The controls notebook 08 builds its conclusions on (`workbench.features.concepts`), on a toy dictionary: the
removal control has as many features as the group, none of the excluded ones, and the same norm; the matched
attribution rows have the top rows' activations; words are counted once whatever their case; the plural verdict
counts only the nouns the clean model makes plural and applies its thresholds as stated."""

from __future__ import annotations

import torch

from workbench.features import DictionaryConfig, FeatureAttribution, SparseDictionary
from workbench.features.concepts import (
    PluralContrast,
    WordFiring,
    distinct,
    matched_control,
    plural_verdict,
    top_and_matched,
)


def test_distinct_counts_two_and_Two_once():  # noqa: N802 (the words themselves)
    assert distinct(["\u2581two", "\u2581Two", "\u2581three", "s", "\u2581two"]) == ["two", "three", "s"]


def test_the_removal_control_has_as_many_features_and_the_same_norm():
    torch.manual_seed(0)
    d = SparseDictionary(DictionaryConfig("hook_memory", 16, 64, k=8))
    acts = torch.rand(64)
    group, exclude = [3, 5, 9, 11], [3, 5, 9, 11, 20, 21]
    chosen, vector = matched_control(d, acts, group, exclude, torch.Generator().manual_seed(1))
    assert len(chosen) == len(set(chosen)) == len(group)
    assert not set(chosen) & set(exclude)
    target = acts[group] @ d.W_dec.detach()[group]
    assert torch.allclose(vector.norm(), target.norm())
    assert not torch.allclose(vector, target)  # other directions
    again, _ = matched_control(d, acts, group, exclude, torch.Generator().manual_seed(1))
    assert again == chosen  # seeded


def test_matched_rows_take_the_closest_activations_without_reuse():
    acts = torch.tensor([0.9, 0.5, 0.1, 0.88, 0.52, 0.3, 0.11], dtype=torch.float64)
    attr = torch.tensor([3.0, 2.0, 1.0, 0.1, 0.05, 0.0, -0.1], dtype=torch.float64)
    fa = FeatureAttribution("hook_memory", "src", 0, 0, "", "logprob", 0.0, [], torch.arange(7),
                            torch.arange(100, 107), acts, attr, torch.zeros(7), torch.zeros(7), torch.zeros(7))
    top, matched = top_and_matched(fa, 3)
    assert top == [(0, 100), (1, 101), (2, 102)]
    assert matched == [(3, 103), (4, 104), (6, 106)]


def test_precision_of_a_feature_that_fires_everywhere_is_the_base_rate():
    firing = WordFiring(torch.tensor([100.0, 10.0, 0.0]), torch.tensor([10.0, 9.0, 0.0]), tokens=100,
                        word_tokens=10)
    assert firing.base_rate == 0.1
    assert torch.allclose(firing.precision, torch.tensor([0.1, 0.9, 0.0]))
    assert torch.allclose(firing.recall, torch.tensor([1.0, 0.9, 0.0]))
    assert int(firing.f1().argmax()) == 1


def test_the_plural_verdict_counts_only_nouns_the_clean_model_makes_plural():
    def row(clean, to_a, to_other, zeroed):
        return PluralContrast("dogs", "dog", clean, to_a, to_other, zeroed, zeroed)

    rows = [row(5, -1, 5, 4)] * 8 + [row(5, 1, 5, -1), row(-0.2, -3, -0.2, 5)]
    v = plural_verdict(rows)
    assert (v.nouns, v.plural, v.to_a_singular, v.to_other_plural, v.zeroed_plural) == (10, 9, 8, 9, 8)
    assert v.turned_by_zeroing == ["dogs"] and v.decoder_decides and not v.survives_zeroing  # 8 of 9 < nine in ten
    assert plural_verdict([row(5, 1, 5, 4)] * 3 + [row(5, -1, 5, 4)] * 6).decoder_decides  # two thirds flip
    assert not plural_verdict([row(5, 1, 5, 4)] * 4 + [row(5, -1, 5, 4)] * 5).decoder_decides
    assert not plural_verdict([row(5, -1, -1, 4)] * 2 + [row(5, -1, 5, 4)] * 8).decoder_decides  # the control fails


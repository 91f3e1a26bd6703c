"""Noun swaps for English sources too: the shipped en->de default model gets a one-word contrast."""

from pathlib import Path

import pytest

from workbench.analysis.circuits.contrast import NOUNS_EN, noun_swaps

CKPT = Path(__file__).resolve().parents[3] / "checkpoints" / "general-en-de"
pytestmark = pytest.mark.skipif(not CKPT.is_dir(), reason="shipped checkpoint not present")


@pytest.fixture(scope="module")
def tm():
    from workbench import load

    return load(str(CKPT))


def test_an_english_sentence_gets_a_one_noun_swap(tm):
    text = "The animal didn't cross the street because it was too tired."
    (pair,) = noun_swaps(tm, [text])
    clean, changed = text.split(), pair.corrupted_text.split()
    diff = [(a, b) for a, b in zip(clean, changed) if a != b]
    assert len(clean) == len(changed) and len(diff) == 1 and diff[0][0] == "animal" and diff[0][1] in NOUNS_EN
    assert pair.src.shape == pair.corrupted_src.shape and pair.output != pair.corrupted_output


def test_an_explicit_list_is_the_only_one_tried(tm):
    assert noun_swaps(tm, ["The animal didn't cross the street."], nouns=["Mann", "Frau"]) == []

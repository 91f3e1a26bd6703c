"""Word alignment: the AER scorer against published aligner outputs and by hand, pieces to words, and the
per-layer/head maps from a trace (weights, norms, ALTI+)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_helpers import SHARED_DATA, make_model

from workbench import presets
from workbench.analysis.alignment.alignment import (
    bootstrap_aer,
    format_pharaoh,
    parse_pharaoh,
    read_alignments,
    score_alignments,
)
from workbench.analysis.alignment.word_align import (
    PAPER_EOS,
    PUBLISHED_AER,
    Words,
    alignment_maps,
    argmax_links,
    encode_words,
    hooks_for,
    maps_from_trace,
    papers_protocol,
    to_words,
)
from workbench.cli import main

ALIGN = SHARED_DATA / "alignments"
needs_gold = pytest.mark.skipif(not (ALIGN / "rwth-deen" / "test.talp").is_file(),
                                reason="gold alignments not in shared/data/alignments")

# (hypothesis, gold, published AER %, published precision %, recall %): aer-fixtures/SOURCES.md
FIXTURES = [
    ("lilt-giza.test.deen.talp", "rwth-deen/test.talp", 21.0, 86.2, 72.8),
    ("lilt-giza.test.deen.grow-diagonal-final.talp", "rwth-deen/test.talp", 20.6, 91.3, 70.2),
    ("lilt-fastalign.test.deen.talp", "rwth-deen/test.talp", 28.5, 71.3, 71.8),
    ("lilt-giza.test.enfr.talp", "hansards-enfr/enfr.gold", 8.0, 91.4, 92.9),
    ("lilt-giza.test.roen.talp", "wpt05-roen/roen.gold", 28.7, 82.7, 62.6),
    ("awesome-align.enfr.out", "hansards-enfr/enfr.gold", 4.1, None, None),
    ("awesome-align.roen.out", "wpt05-roen/roen.gold", 20.7, None, None),
]


@needs_gold
@pytest.mark.parametrize(("hyp", "gold", "published", "precision", "recall"), FIXTURES, ids=[f[0] for f in FIXTURES])
def test_aer_reproduces_published_numbers(hyp, gold, published, precision, recall, capsys):
    score = score_alignments([p for _, p in read_alignments(ALIGN / "aer-fixtures" / hyp)],
                             read_alignments(ALIGN / gold, base=1))
    assert abs(100 * score.aer - published) <= 0.1 + 1e-9
    if precision is not None:
        assert abs(100 * score.precision - precision) <= 0.1 and abs(100 * score.recall - recall) <= 0.1
    assert main(["aer", str(ALIGN / gold), str(ALIGN / "aer-fixtures" / hyp)]) == 0
    assert f"AER {published:.1f} %" in capsys.readouterr().out


def test_aer_by_hand_and_cli_flags(tmp_path, capsys):
    """Two sentences counted by hand; the same files with other bases and swapped columns agree."""
    gold = tmp_path / "gold.talp"
    gold.write_text("1-1 2-2 2p3\n1-1\n")  # 1-based: S1 = {00, 11}, P1 = S1 + {12}; S2 = {00}
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("0-0 1-2 2-2\n0-0 0-1\n")  # A1 = {00, 12, 22}; A2 = {00, 01}
    # |A∩S| = 1 + 1, |A∩P| = 2 + 1, |A| = 5, |S| = 3: AER = 1 - 5/8; precision 3/5; recall 2/3
    score = score_alignments([p for _, p in read_alignments(hyp)], read_alignments(gold, base=1))
    assert score.aer == pytest.approx(3 / 8) and score.precision == pytest.approx(3 / 5)
    assert score.recall == pytest.approx(2 / 3) and (score.links, score.sure) == (5, 3)
    swapped = tmp_path / "hyp_swapped_1based.txt"
    swapped.write_text("1-1 3-2 3-3\n1-1 2-1\n")
    assert main(["aer", str(gold), str(swapped), "--hyp-base", "1", "--swap-hyp", "--json"]) == 0
    assert '"aer": 0.375' in capsys.readouterr().out
    assert main(["aer", str(gold), str(hyp), "--hyp-base", "1"]) == 2  # 0-based file read as 1-based
    assert "is the file 0-based?" in capsys.readouterr().err
    (tmp_path / "short.txt").write_text("0-0\n")
    assert main(["aer", str(gold), str(tmp_path / "short.txt")]) == 2
    assert "one line per sentence pair" in capsys.readouterr().err


@needs_gold
def test_aer_hints_at_swapped_columns_with_the_shipped_gold_reversed(tmp_path, capsys):
    """The RWTH gold written target word first and scored as a hypothesis: 78.7 % as read, 0.0 % the other way
    round, so a one-line hint names --swap-hyp and --swap-gold; a hypothesis the right way round gets no hint."""
    gold = ALIGN / "rwth-deen" / "test.talp"
    reversed_gold = tmp_path / "reversed.talp"
    reversed_gold.write_text("".join(" ".join([*(f"{j + 1}-{i + 1}" for i, j in sorted(sure)),
                                               *(f"{j + 1}p{i + 1}" for i, j in sorted(possible - sure))]) + "\n"
                                     for sure, possible in read_alignments(gold, base=1)))
    assert main(["aer", str(gold), str(reversed_gold), "--hyp-base", "1"]) == 0
    out = capsys.readouterr()
    assert "AER 78.7 %" in out.out
    hint = [line for line in out.err.splitlines() if "hint" in line]
    assert len(hint) == 1 and "--swap-hyp or --swap-gold" in hint[0] and "AER is 0.0 %, not 78.7 %" in hint[0]
    assert main(["aer", str(gold), str(reversed_gold), "--hyp-base", "1", "--swap-gold"]) == 0
    assert "AER 0.0 %" in capsys.readouterr().out
    assert main(["aer", str(gold), str(reversed_gold), "--hyp-base", "1", "--swap-hyp"]) == 0
    out = capsys.readouterr()
    assert "AER 0.0 %" in out.out and "hint" not in out.err
    assert main(["aer", str(gold), str(ALIGN / "aer-fixtures" / "lilt-giza.test.deen.talp")]) == 0
    assert "hint" not in capsys.readouterr().err


def test_bootstrap_interval_resamples_sentences_from_summed_counts():
    """The vectorised interval equals resampling the link sets themselves and scoring each draw with
    `score_alignments`; identical sentences give a zero-width interval at the corpus AER."""
    rng = np.random.default_rng(3)
    gold, hyp = [], []
    for _ in range(30):
        n = int(rng.integers(2, 8))
        sure = {(i, i) for i in range(n)}
        gold.append((sure, sure | {(i, i + 1) for i in range(n - 1)}))
        hyp.append({(i, int(rng.integers(0, n))) for i in range(n)})
    low, high = bootstrap_aer(hyp, gold, draws=200, seed=7)
    draws = np.random.default_rng(7).integers(0, 30, size=(200, 30))
    by_hand = [score_alignments([hyp[k] for k in d], [gold[k] for k in d]).aer for d in draws]
    np.testing.assert_allclose([low, high], np.quantile(by_hand, [0.025, 0.975]))
    assert low <= score_alignments(hyp, gold).aer <= high
    same = bootstrap_aer([hyp[0]] * 10, [gold[0]] * 10, draws=50)
    assert same[0] == pytest.approx(same[1]) == pytest.approx(score_alignments([hyp[0]], [gold[0]]).aer)
    with pytest.raises(ValueError, match="gold ones"):
        bootstrap_aer(hyp, gold[:3])


def test_papers_protocol_takes_the_best_whole_layer_with_the_papers_eos_rule():
    model = make_model(presets.tiny(vocab=30))
    tok = CharTokenizer()
    pairs = [("ab c de", "xy z"), ("a bb", "bcd e f"), ("c d e", "e d c"), ("ab", "ba")]
    src = [encode_words(tok, s) for s, _ in pairs]
    tgt = [encode_words(tok, t) for _, t in pairs]
    gold = [({(0, 0), (1, 1)}, {(0, 0), (1, 1), (2, 1)}), ({(0, 0)}, {(0, 0)}), ({(0, 2), (2, 0)}, {(1, 1)}),
            ({(0, 0)}, {(0, 0)})]
    rows = papers_protocol(model, src, tgt, gold, methods=["weights", "alti"], shifts=["awi"], draws=100)
    assert [(r.method, r.shift, r.eos) for r in rows] == [("weights", "awi", "drop"), ("alti", "awi", "null")]
    for r in rows:
        maps = alignment_maps(model, src, tgt, method=r.method, shift="awi", heads=False)
        per_layer = [score_alignments([m.links(lay, None, eos=PAPER_EOS[r.method]) for m in maps], gold).aer
                     for lay in range(len(model.dec))]
        assert list(r.per_layer) == pytest.approx(per_layer)
        assert r.score.aer == min(per_layer) and r.layer == int(np.argmin(per_layer))
        assert r.interval[0] <= r.score.aer <= r.interval[1]
        assert r.published == PUBLISHED_AER[r.method]["awi"]
    assert [r.eos for r in papers_protocol(model, src, tgt, gold, methods=["alti"], shifts=["awi"], draws=10,
                                           eos="drop")] == ["drop"]
    with pytest.raises(ValueError, match="eos must be one of"):
        papers_protocol(model, src, tgt, gold, eos="keep")


def test_pharaoh_round_trip():
    links = {(2, 0), (0, 1), (1, 1)}
    line = format_pharaoh(links)
    assert line == "2-0 0-1 1-1" and parse_pharaoh(line)[0] == links
    assert parse_pharaoh("1p2 3-4", base=1, swap=True) == ({(3, 2)}, {(3, 2), (1, 0)})


class CharTokenizer:
    """Each character a piece (ids from 4): words of several pieces without a trained model."""

    def encode(self, text):
        return [4 + (ord(c) % 20) for c in text]


def test_to_words_sums_source_pieces_and_averages_target_pieces():
    src = Words(["ab", "c"], [1, 2, 3], [0, 0, 1])
    tgt = Words(["x", "yz"], [4, 5, 6], [0, 1, 1])
    m = np.arange(12, dtype=float).reshape(3, 4)  # (3 target pieces, 3 source pieces + EOS)
    w = to_words(m, src, tgt)
    expected = np.array([[0 + 1, 2, 3], [((4 + 5) + (8 + 9)) / 2, (6 + 10) / 2, (7 + 11) / 2]])
    np.testing.assert_allclose(w, expected)
    assert argmax_links(w) == {(1, 0), (0, 1)}
    assert argmax_links(w, eos="null") == {(0, 1)}  # row 0 is best at EOS: no link for target word 0
    words = encode_words(CharTokenizer(), " ab  c ")
    assert words.words == ["ab", "c"] and words.word_of == [0, 0, 1] and len(words.ids) == 3


@pytest.mark.parametrize("method", ["weights", "norms", "alti"])
def test_maps_from_trace_match_the_batched_maps_and_the_rows_shift(method):
    model = make_model(presets.tiny(vocab=30))
    tok = CharTokenizer()
    pairs = [("ab c de", "xy z"), ("a", "bcd e f")]
    src = [encode_words(tok, s) for s, _ in pairs]
    tgt = [encode_words(tok, t) for _, t in pairs]
    awi = alignment_maps(model, src, tgt, method=method, shift="awi", batch_size=2)
    awo = alignment_maps(model, src, tgt, method=method, shift="awo", batch_size=1)
    cfg = model.cfg
    s, t = src[0], tgt[0]
    _, trace = model.run_with_cache(torch.tensor([[*s.ids, cfg.eos_id]]), torch.tensor([[cfg.start_id, *t.ids]]),
                                    names=hooks_for(model, method))
    one = maps_from_trace(model, trace, s, t, method=method, shift="awi")
    np.testing.assert_allclose(one.heads, awi[0].heads, atol=1e-5)
    np.testing.assert_allclose(one.layers, awi[0].layers, atol=1e-5)
    assert one.heads.shape == (2, 4, 2, 4) and awi[1].layers.shape == (2, 3, 2)
    if method == "weights":  # by hand: the last target word "z" is one piece, read at row 4 (AWI) / 3 (AWO)
        p = trace["dec.1.cross_attn.hook_probs"][0, 2].numpy()  # (T, S) of layer 1 head 2
        col = [p[:, :2].sum(1), p[:, 2], p[:, 3:5].sum(1), p[:, 5]]  # "ab", "c", "de", EOS
        np.testing.assert_allclose(awi[0].heads[1, 2, 1], [c[3] for c in col], atol=1e-6)
        np.testing.assert_allclose(awo[0].heads[1, 2, 1], [c[2] for c in col], atol=1e-6)
        np.testing.assert_allclose(awi[0].layers, awi[0].heads.mean(1), atol=1e-6)
        np.testing.assert_allclose(awi[0].heads.sum(-1), 1.0, atol=1e-5)  # rows of weights stay distributions
    links = awi[0].links(1, 2)
    assert all(0 <= i < 3 and 0 <= j < 2 for i, j in links) and len(links) == 2
    combined = awi[0].links(units=[(0, 1), (1, None)])
    assert len(combined) == 2
    with pytest.raises(ValueError, match="method must be one of"):
        alignment_maps(model, src, tgt, method="gradients")


def test_symmetrize_by_hand():
    from workbench.analysis.alignment.word_align import symmetrize_links

    a = {(0, 0), (1, 1), (2, 1), (5, 0)}
    b = {(0, 0), (1, 1), (0, 1)}
    assert symmetrize_links(a, b, "intersect") == {(0, 0), (1, 1)}
    assert symmetrize_links(a, b, "union") == a | b
    # (2, 1) touches (1, 1) and aligns a new source word; (0, 1) joins two aligned words; (5, 0) is isolated
    assert symmetrize_links(a, b, "grow-diag") == {(0, 0), (1, 1), (2, 1)}
    assert symmetrize_links(a, b, "grow-diag-final") == {(0, 0), (1, 1), (2, 1), (5, 0)}
    m = np.array([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1]])  # both target words' best is source 0; source 1's best is t=1
    assert argmax_links(m) == {(0, 0), (0, 1)}
    assert argmax_links(m, symmetrize="intersect") == {(0, 0)}
    assert argmax_links(m, symmetrize="grow-diag") == {(0, 0), (0, 1), (1, 1)}  # each adds an unaligned word


def test_punctuation_apart_by_hand_and_through_maps_and_specs():
    """Rule "apart" (issue 38 point 6's default): a link joining a punctuation mark and a word is dropped, links
    between two marks or two words stay; maps made by hand without their words refuse the rule; an alignment.json
    without the key reads as "any" and the key round-trips."""
    from workbench.analysis.alignment.word_align import AlignmentSpec, WordMaps, punctuation_apart
    from workbench.analysis.attention.head_stats import is_punctuation

    assert [is_punctuation(w) for w in [".", ",", "--", "?!", "\u201e", "%", "'s", "3.", "\u20ac", "+", "Haus", ""]] \
        == [True] * 6 + [False] * 6
    links = {(0, 0), (1, 1), (2, 1), (1, 2), (2, 2), (1, 3), (3, 3), (3, 1)}
    src, tgt = ("dog", ",", "runs", "."), ("Hund", ",", "läuft", "angenommen.")
    # "runs"-"," and ","-"läuft" go (a mark and a plain word); two marks stay; a mark keeps a word that carries one
    assert punctuation_apart(links, src, tgt) == {(0, 0), (1, 1), (2, 2), (1, 3), (3, 3), (3, 1)}
    # source 0 "Hello" and 1 ","; target 0 "Hallo", 1 "," and 2 "Welt": the argmax links the comma to "Welt"
    m = np.array([[0.9, 0.1, 0.0], [0.2, 0.8, 0.0], [0.3, 0.7, 0.0]])
    maps = WordMaps(None, m[None], "weights", "awi", True, ("Hello", ","), ("Hallo", ",", "Welt"))
    assert maps.links(0, symmetrize="none") == {(0, 0), (1, 1), (1, 2)}
    assert maps.links(0, symmetrize="none", punctuation="apart") == {(0, 0), (1, 1)}
    with pytest.raises(ValueError, match="know their words"):
        WordMaps(None, m[None], "weights", "awi").links(0, punctuation="apart")
    with pytest.raises(ValueError, match="punctuation must be one of"):
        maps.links(0, punctuation="none")
    spec = AlignmentSpec("weights", "awi", "drop", ((0, None),), {}, "none", punctuation="apart")
    assert spec.links_of(maps) == {(0, 0), (1, 1)} and spec.label().endswith("punctuation apart)")
    assert AlignmentSpec.from_dict(spec.to_dict()) == spec
    old = {k: v for k, v in spec.to_dict().items() if k != "punctuation"}  # an alignment.json from before the rule
    assert AlignmentSpec.from_dict(old).punctuation == "any"
    with pytest.raises(ValueError, match="punctuation must be one of"):
        AlignmentSpec("weights", "awi", "drop", ((0, None),), punctuation="words")


def test_the_evidence_view_draws_what_workbench_align_writes():
    """One aligner for the CLI, the Evidence tab and notebook 07 (issue 38 point 6): the shipped checkpoint's
    alignment.json symmetrizes (grow-diag), and `sentence_evidence` draws exactly the links `workbench align`'s
    `align_pairs` writes with the spec it builds from no options; another method starts both from the fallback."""
    import argparse

    from workbench import load
    from workbench.analysis.alignment.word_align import align_pairs
    from workbench.analysis.attribution.sentence_evidence import sentence_evidence
    from workbench.checkpoint.shipped import shipped
    from workbench.cli.align import spec_of

    tm = load(shipped("multi30k-de-en"))
    sources = ["Ein Mann fährt mit dem Fahrrad durch die Stadt .", "Zwei Hunde spielen im Schnee ."]
    outputs = tm.translate(sources)
    no_options = argparse.Namespace(method=None, shift=None, units=None, eos=None, symmetrize=None,
                                    punctuation=None)
    spec, _ = spec_of(tm, no_options)
    assert spec.symmetrize == "grow-diag", "the point of the test: the stored aligner symmetrizes"
    written = align_pairs(tm.model, tm.src_tokenizer, tm.tgt_tokenizer, sources, outputs, spec)
    drawn = [sentence_evidence(tm, s, o).links for s, o in zip(sources, outputs)]
    assert drawn == written
    other = argparse.Namespace(method="weights", shift=None, units=None, eos=None, symmetrize=None,
                               punctuation=None)
    spec_w, origin = spec_of(tm, other)
    assert "fallback" in origin and spec_w.method == "weights"
    written_w = align_pairs(tm.model, tm.src_tokenizer, tm.tgt_tokenizer, sources, outputs, spec_w)
    assert [sentence_evidence(tm, s, o, method="weights").links for s, o in zip(sources, outputs)] == written_w

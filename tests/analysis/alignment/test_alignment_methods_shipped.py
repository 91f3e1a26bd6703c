"""Shift-Att and the default aligner of the shipped general-en-de on real RWTH lines: the CLI, the in-process
function and the Evidence tab give the same links, and AER computed two ways agrees (slow: a real model)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest
from model_helpers import ROOT, SHARED_DATA

from workbench.analysis.alignment.alignment import parse_pharaoh, read_alignments, score_alignments
from workbench.analysis.alignment.word_align import (
    AlignmentSpec,
    align_pairs,
    alignment_maps,
    argmax_links,
    encode_words,
    shift_att_spec,
)
from workbench.analysis.attribution.sentence_evidence import sentence_evidence
from workbench.cli import main
from workbench.cli.align import spec_of
from workbench.decoding.translator import load

RWTH = SHARED_DATA / "alignments" / "rwth-deen"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (RWTH / "test.talp").is_file(), reason="RWTH gold not in shared/data")]
LINES = slice(150, 162)  # held-out lines


def _lines(tmp_path):
    src = (RWTH / "test.en").read_text(encoding="utf-8").splitlines()[LINES]
    tgt = (RWTH / "test.de").read_text(encoding="utf-8").splitlines()[LINES]
    (tmp_path / "s.txt").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "t.txt").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return src, tgt


def test_shift_att_cli_equals_the_function_and_the_maps_by_hand(tmp_path, capsys):
    tm = load(ROOT / "checkpoints" / "general-en-de")
    src, tgt = _lines(tmp_path)
    out = tmp_path / "a.txt"
    assert main(["align", "--checkpoint", str(tm.meta["path"]), str(tmp_path / "s.txt"), str(tmp_path / "t.txt"),
                 "--method", "shift-att", "-o", str(out)]) == 0
    assert "Shift-Att (Chen et al. 2020)" in capsys.readouterr().err
    written = [parse_pharaoh(x)[0] for x in out.read_text(encoding="utf-8").splitlines()]
    spec = shift_att_spec(tm.model, tm.alignment)
    assert written == align_pairs(tm.model, tm.src_tokenizer, tm.tgt_tokenizer, src, tgt, spec)
    (layer, _), = spec.units
    maps = alignment_maps(tm.model, [encode_words(tm.src_tokenizer, s) for s in src],
                          [encode_words(tm.tgt_tokenizer, t) for t in tgt], method="weights", shift="awi", heads=False)
    assert written == [argmax_links(m.layers[layer], symmetrize=spec.symmetrize) for m in maps]


def test_the_default_aligner_is_one_aligner_and_aer_two_ways_agrees(tmp_path, capsys):
    """`workbench align` with no options, `align_pairs` with the spec it resolves and the Evidence tab's
    `sentence_evidence` give the same links; `workbench aer` on the written file, `score_alignments` and the
    AER formula counted here by hand give the same figure."""
    tm = load(ROOT / "checkpoints" / "general-en-de")
    src, tgt = _lines(tmp_path)
    out = tmp_path / "a.txt"
    assert main(["align", "--checkpoint", str(tm.meta["path"]), str(tmp_path / "s.txt"), str(tmp_path / "t.txt"),
                 "-o", str(out)]) == 0
    capsys.readouterr()
    written = [parse_pharaoh(x)[0] for x in out.read_text(encoding="utf-8").splitlines()]
    spec, _ = spec_of(tm, argparse.Namespace(method=None, shift=None, units=None, eos=None, symmetrize=None,
                                             punctuation=None))
    assert written == align_pairs(tm.model, tm.src_tokenizer, tm.tgt_tokenizer, src, tgt, spec)
    assert written[:4] == [sentence_evidence(tm, s, t).links for s, t in zip(src[:4], tgt[:4])]
    gold = read_alignments(RWTH / "test.talp", base=1, swap=True)[LINES]
    a = sum(len(x) for x in written)
    a_s = sum(len(x & s) for x, (s, _) in zip(written, gold))
    a_p = sum(len(x & p) for x, (_, p) in zip(written, gold))
    n_s = sum(len(s) for s, _ in gold)
    by_hand = 1 - (a_s + a_p) / (a + n_s)
    assert score_alignments(written, gold).aer == pytest.approx(by_hand, abs=1e-12)
    gold_file = tmp_path / "g.talp"
    gold_file.write_text("\n".join((RWTH / "test.talp").read_text(encoding="utf-8").splitlines()[LINES]) + "\n",
                         encoding="utf-8")
    assert main(["aer", str(gold_file), str(out), "--swap-gold", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["aer"] == pytest.approx(by_hand, abs=1e-12)


def test_the_default_aligner_scores_what_its_alignment_json_and_the_docs_say_on_the_held_out_lines():
    """The shipped default's figure, re-derived: `align_pairs` on RWTH lines 151-508 scores the held-out AER stored
    in alignment.json (docs/analysis.md: 19.04 %, issue 38's goal <= 20 %), below the same three layers without the
    punctuation rule (20.03 %, recomputed here), the aligner before them (round 4 of the alignment layer, 20.4 %:
    `provenance.replaces`) and the norms head it started from (24.4 %, recomputed here)."""
    tm = load(ROOT / "checkpoints" / "general-en-de")
    src = (RWTH / "test.en").read_text(encoding="utf-8").splitlines()[150:]
    tgt = (RWTH / "test.de").read_text(encoding="utf-8").splitlines()[150:]
    spec, _ = spec_of(tm, argparse.Namespace(method=None, shift=None, units=None, eos=None, symmetrize=None,
                                             punctuation=None))
    assert spec.method == "layer" and len(spec.layer.partners) == 2  # three layers read as one
    links = align_pairs(tm.model, tm.src_tokenizer, tm.tgt_tokenizer, src, tgt, spec)
    aer = score_alignments(links, read_alignments(RWTH / "test.talp", base=1, swap=True)[150:]).aer
    stored = tm.alignment["provenance"]
    assert aer == pytest.approx(stored["held_out_aer"], abs=5e-4)  # a few links: other CPUs may break a tie
    assert "20.4 %" in stored["replaces"] and aer < 0.204 and aer <= 0.20
    assert spec.punctuation == "apart"
    gold = read_alignments(RWTH / "test.talp", base=1, swap=True)[150:]
    without = score_alignments(align_pairs(tm.model, tm.src_tokenizer, tm.tgt_tokenizer, src, tgt,
                                           replace(spec, punctuation="any")), gold).aer
    assert without == pytest.approx(0.2003, abs=5e-4) and aer < without - 0.005  # the rule's control
    before = AlignmentSpec.from_dict(json.loads((ROOT / "docs" / "evidence" / "alignment_shipped_before.json")
                                                .read_text(encoding="utf-8")))  # the norms head, the control
    control = score_alignments(align_pairs(tm.model, tm.src_tokenizer, tm.tgt_tokenizer, src, tgt, before),
                               read_alignments(RWTH / "test.talp", base=1, swap=True)[150:]).aer
    assert control == pytest.approx(0.244, abs=5e-4) and aer < control - 0.04

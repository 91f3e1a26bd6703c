"""The shipped checkpoints' own aligners and ALTI+ source shares on real text (slow: real models)."""

from __future__ import annotations

import pytest
import torch
from model_helpers import ROOT, SHARED_DATA

from workbench.analysis.alignment.alignment import read_alignments, score_alignments
from workbench.analysis.alignment.word_align import align_pairs, aligner, fallback_spec
from workbench.analysis.attribution.source_share import LowShareThresholds, output_source_shares, sentence_share
from workbench.decoding.translator import load

RWTH = SHARED_DATA / "alignments" / "rwth-deen"
pytestmark = pytest.mark.slow


@pytest.mark.skipif(not (RWTH / "test.talp").is_file(), reason="RWTH gold not in shared/data/alignments")
@pytest.mark.parametrize(("name", "src", "tgt", "swap"), [("general-en-de", "en", "de", True),
                                                           ("multi30k-de-en", "de", "en", False)])
def test_the_stored_aligner_was_chosen_on_lines_1_150_and_beats_the_fallback_held_out(name, src, tgt, swap):
    tm = load(ROOT / "checkpoints" / name)
    assert tm.alignment is not None, f"checkpoints/{name}/alignment.json is missing"
    spec = aligner(tm.model, tm.alignment, directory=tm.meta["path"])[0].check(tm.model)
    assert spec.provenance["chosen_on"].startswith("test.talp lines 1-150")
    rows = slice(150, 190)  # 40 held-out lines
    s = (RWTH / f"test.{src}").read_text(encoding="utf-8").splitlines()[rows]
    t = (RWTH / f"test.{tgt}").read_text(encoding="utf-8").splitlines()[rows]
    gold = read_alignments(RWTH / "test.talp", base=1, swap=swap)[rows]
    own = score_alignments(align_pairs(tm.model, tm.src_tokenizer, tm.tgt_tokenizer, s, t, spec), gold)
    base = score_alignments(align_pairs(tm.model, tm.src_tokenizer, tm.tgt_tokenizer, s, t,
                                        fallback_spec(tm.model)), gold)
    assert own.aer < base.aer - 0.05
    if name == "general-en-de":  # issue 30's goal is <= 28 % on lines 151-508; these 40 lines are a sample
        assert own.aer < 0.30


def test_low_source_share_flags_catch_real_hallucinations():
    """Thresholds from 40 clean Multi30k test sentences. An out-of-domain Europarl sentence, which the shipped
    de->en model turns into invented English ("The Commuters has because the advention of ..."), is flagged
    token by token and as a sentence; the same caption words shuffled draw less on the source than the caption;
    a plain caption is not flagged. A mistranslated unknown word is not detached output: "Boston Terrier" ->
    "A body of jerrier" draws on the source as much as a correct word does, and its invented pieces stay
    unflagged (docs/analysis.md §10 says so)."""
    tm = load(ROOT / "checkpoints" / "multi30k-de-en")
    torch.manual_seed(0)
    clean = (SHARED_DATA / "multi30k" / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[2:42]
    rs = tm.translate(clean, return_tokens=True, beam=1)
    thr = LowShareThresholds.fit(output_source_shares(tm.model, [r.source_tokens for r in rs],
                                                      [r.tokens for r in rs]), [r.pieces for r in rs])

    def flagged(text):
        r = tm.translate([text], return_tokens=True, beam=1)[0]
        share = output_source_shares(tm.model, [r.source_tokens], [r.tokens])[0]
        return r.text, [p for p, f in zip(r.pieces, thr.flag(share, r.pieces)) if f], share

    text, flags, share = flagged("Die Kommission hat ihren Vorschlag zur Reform der Agrarpolitik noch nicht vorgelegt.")
    assert "commission" not in text.lower() and len(flags) >= 5 and thr.flag_sentence(share)
    text, flags, dog = flagged("Ein Hund läuft über grünes Gras vor einem weißen Zaun.")
    assert text.startswith("A dog runs") and flags == [] and not thr.flag_sentence(dog)
    _, _, shuffled = flagged("Zaun. weißen Gras grünes vor Ein über einem läuft Hund")
    assert sentence_share(shuffled) < sentence_share(dog)
    text, flags, _ = flagged("Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.")
    assert text.startswith("A body of jerrier") and not set(flags) & {"▁body", "▁j", "err", "ier"}

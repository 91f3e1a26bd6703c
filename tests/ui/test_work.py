"""The model work behind a page (`workbench.ui.work`): the Compare tab's B is `read_by`, not the tab's own code."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint  # noqa: E402

from workbench.ui import loader  # noqa: E402
from workbench.ui.work import Request, read_by, translate  # noqa: E402


def test_b_reads_a_s_exact_pieces_and_scores_them_as_teacher_forcing_would(tmp_path):
    a_dir = build_checkpoint(tmp_path / "a", seed=0, steps=0)
    b_dir = build_checkpoint(tmp_path / "b", seed=1, steps=0)  # its own tokenizer, trained on the same text
    a = translate(loader.load_model(str(a_dir)), Request(str(a_dir), "Zwei Hunde spielen im Schnee."))
    b = read_by(a, str(b_dir))
    assert b.forced and b.request.sentence == a.request.sentence
    tm_b = loader.load_model(str(b_dir))
    if tm_b.tgt_tokenizer.pieces(list(a.out_ids)) == list(a.out_pieces):  # one vocabulary: row for row
        assert b.out_ids == a.out_ids
    forced = tm_b.trace(a.request.sentence, target=list(b.out_ids), n_best=1)
    assert abs(forced.log_prob - b.log_prob) < 1e-4  # B's score of A's output is plain teacher forcing under B

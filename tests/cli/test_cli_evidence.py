"""`workbench prune` and `workbench formation` end to end on the shipped de-en checkpoints: files written, numbers
printed, bad arguments a one-line error."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from model_helpers import ROOT, SHARED_DATA

from workbench.cli import main

CKPT = ROOT / "checkpoints" / "multi30k-de-en"
RWTH = SHARED_DATA / "alignments" / "rwth-deen"


def _texts(tmp_path):
    src, ref = tmp_path / "t.de", tmp_path / "t.en"
    src.write_text("Ein Hund läuft im Schnee .\nZwei Männer spielen Fußball .\nEine Frau liest ein Buch .\n")
    ref.write_text("A dog runs in the snow .\nTwo men play soccer .\nA woman reads a book .\n")
    return src, ref


def test_prune_command(tmp_path, capsys):
    src, ref = _texts(tmp_path)
    out = tmp_path / "p"
    args = ["prune", str(CKPT), "--src", str(src), "--ref", str(ref), "--kinds", "cross", "--steps", "0,16",
            "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "3 sentences" in printed and "cross: 0 of 16 heads removable at <= 0.5 BLEU loss (0%)" in printed
    table = pd.read_csv(out / "pruning.csv")
    assert table["removed"].tolist() == [0, 16] and table["bleu"].iloc[1] < table["bleu"].iloc[0]
    data = json.loads((out / "pruning.json").read_text())
    assert data["removable"] == {"cross": {"heads": 0, "share": 0.0}} and len(data["importance"]) == 16
    assert (out / "pruning.html").stat().st_size > 0
    assert main([*args[:-2], "--kinds", "encoder", "--out", str(out)]) == 2
    assert "unknown kinds ['encoder']" in capsys.readouterr().err


@pytest.mark.skipif(not (RWTH / "test.talp").is_file(), reason="needs ../shared/data/alignments")
def test_formation_command(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "step_0000512").symlink_to(ROOT / "checkpoints" / "multi30k-de-en-early", target_is_directory=True)
    (run / "step_0008000").symlink_to(CKPT, target_is_directory=True)
    out = tmp_path / "f"
    gold = ["--gold-src", str(RWTH / "test.de"), "--gold-tgt", str(RWTH / "test.en"), "--gold", str(RWTH / "test.talp")]
    args = ["formation", str(run), *gold, "--gold-limit", "8", "--limit", "8", "--share-sentences", "4",
            "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "2 snapshots" in printed and "step    512: best AER" in printed and "step   8000: best AER" in printed
    records = json.loads((out / "formation.json").read_text())
    assert [r["step"] for r in records] == [512, 8000]
    rows = pd.read_csv(out / "formation.csv")
    assert len(rows) == 2 * 48 and rows[rows["kind"] == "cross"]["aer"].notna().all()
    assert main([*args[:-2], "--steps", "5x", "--out", str(out)]) == 2
    assert "--steps must be comma-separated integers" in capsys.readouterr().err

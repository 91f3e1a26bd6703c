"""`workbench align` and `workbench translate --alignments` on a tiny checkpoint; the checkpoint's own aligner
(alignment.json) is chosen on gold lines, stored, loaded and used."""

from __future__ import annotations

import json

import pytest
import torch

from workbench import Transformer, presets
from workbench.analysis.alignment import parse_pharaoh
from workbench.checkpoint.format import load_checkpoint, save_checkpoint
from workbench.checkpoint.tokenizer import SentencePieceTokenizer
from workbench.cli import main

SRC = ["Ein Hund läuft .", "Zwei Männer spielen Fußball im Park .", "Eine Frau liest ."]
TGT = ["A dog runs .", "Two men play soccer in the park .", "A woman reads ."]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from model_helpers import SHARED_DATA

    de = (SHARED_DATA / "multi30k" / "train.de").read_text(encoding="utf-8").splitlines()[:300]
    en = (SHARED_DATA / "multi30k" / "train.en").read_text(encoding="utf-8").splitlines()[:300]
    tok = SentencePieceTokenizer.train(sentences=de + en, vocab_size=400, num_threads=1)
    torch.manual_seed(0)
    model = Transformer(presets.tiny(vocab=tok.vocab_size, max_positions=48)).eval()
    path = tmp_path_factory.mktemp("align") / "ck"
    save_checkpoint(path, model, src_tokenizer=tok, tgt_tokenizer=tok, meta={"generation": {"beam": 1}})
    return path


def _files(tmp_path, src=SRC, tgt=TGT):
    (tmp_path / "s.txt").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "t.txt").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return str(tmp_path / "s.txt"), str(tmp_path / "t.txt")


def test_align_writes_one_pharaoh_line_per_pair_within_the_words(checkpoint, tmp_path, capsys):
    s, t = _files(tmp_path)
    variants = ([], ["--method", "alti", "--shift", "awi", "--units", "0:1,1"], ["--method", "norms", "--eos", "null"])
    for extra in variants:
        assert main(["align", "--checkpoint", str(checkpoint), s, t, *extra]) == 0
        out = capsys.readouterr()
        lines = out.out.splitlines()
        assert len(lines) == 3
        for line, src, tgt in zip(lines, SRC, TGT):
            links = parse_pharaoh(line)[0]
            assert all(0 <= i < len(src.split()) and 0 <= j < len(tgt.split()) for i, j in links)
            if "--eos" not in extra:
                assert sorted(j for _, j in links) == list(range(len(tgt.split())))  # one link per target word
    assert "3 pairs aligned" in out.err
    (tmp_path / "short").mkdir()
    s2, _ = _files(tmp_path / "short", src=SRC[:2])
    assert main(["align", "--checkpoint", str(checkpoint), s2, t]) == 2
    assert "has 2 lines but" in capsys.readouterr().err
    assert main(["align", "--checkpoint", str(checkpoint), s, t, "--units", "7:0"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_choose_saves_the_checkpoints_aligner_and_align_uses_it(checkpoint, tmp_path, capsys):
    s, t = _files(tmp_path)
    gold = tmp_path / "gold.talp"  # 1-based, diagonal-ish gold
    gold.write_text("1-1 2-2 3-3 4-4\n1-1 2-2 3-3 4-4 5-5 6-7 7-8\n1-1 2-2 3-3 4-4\n")
    report = tmp_path / "report.json"
    assert main(["align", "--checkpoint", str(checkpoint), s, t, "--choose", str(gold), "--lines", "1-2",
                 "--report", str(report), "--save", "--max-units", "3"]) == 0
    out = capsys.readouterr().out
    assert "chosen:" in out and "saved" in out
    data = json.loads(report.read_text())
    assert len(data["configs"]) == 3 * 2 * 2 * 5 and data["held_out_lines"] == 1
    best = min(data["configs"], key=lambda c: c["dev_aer"])
    assert data["chosen"]["method"] == best["method"] and data["chosen"]["units"] == best["units"]
    assert data["chosen"]["provenance"]["chosen_on"] == "gold.talp lines 1-2"
    loaded = load_checkpoint(checkpoint)
    assert loaded.alignment == data["chosen"]
    assert main(["align", "--checkpoint", str(checkpoint), s, t]) == 0
    label = f"{best['method']} {best['shift'].upper()}"
    assert label in capsys.readouterr().err
    inp = tmp_path / "in.txt"
    inp.write_text("Ein Hund läuft .\n\nEine Frau liest .\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(checkpoint), "--input", str(inp), "--alignments"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(" ||| " in line for line in lines) and lines[1] == " ||| "
    text, links = lines[0].split(" ||| ")
    assert all(0 <= i < 4 and 0 <= j < len(text.split()) for i, j in parse_pharaoh(links)[0])

"""`workbench align` and `workbench translate --alignments` on a tiny checkpoint; the checkpoint's own aligner
(alignment.json) is chosen on gold lines, stored, loaded and used."""

from __future__ import annotations

import json

import pytest
import torch

from workbench import Transformer, presets
from workbench.analysis.alignment.alignment import parse_pharaoh
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
    assert {c["punctuation"] for c in data["configs"]} <= {"any", "apart"}
    best = min(data["configs"], key=lambda c: c["dev_aer"])
    assert data["chosen"]["method"] == best["method"] and data["chosen"]["units"] == best["units"]
    assert data["chosen"]["punctuation"] == best["punctuation"]
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


def test_aligner_options_do_what_they_say_and_unknown_values_name_the_valid_ones(checkpoint, tmp_path, capsys):
    """A checkpoint whose alignment.json is a norms aligner (AWI, L0 H0, grow-diag): another --method starts from
    the fallback aligner, not from grow-diag and L0 H0; the same method keeps the file's other parts unless
    named; --symmetrize none gives one link per target word; each run's stderr names the aligner used."""
    import shutil

    from workbench.analysis.alignment.word_align import AlignmentSpec
    from workbench.checkpoint.format import save_alignment

    ck = tmp_path / "ck"
    shutil.copytree(checkpoint, ck)
    save_alignment(ck, AlignmentSpec("norms", "awi", "null", ((0, 0),), {}, "grow-diag").to_dict())
    s, t = _files(tmp_path)

    def label(*extra):
        assert main(["align", "--checkpoint", str(ck), s, t, *extra]) == 0
        out = capsys.readouterr()
        return out.out.splitlines(), out.err.splitlines()[-1]

    assert label()[1].endswith("norms AWI units 0:0 (eos null, symmetrize grow-diag): the checkpoint's alignment.json")
    lines, err = label("--method", "weights")
    assert "weights AWO units 1 (eos drop, symmetrize none): the fallback aligner (alignment.json is a norms " \
           "aligner)" in err
    assert all(sorted(j for _, j in parse_pharaoh(x)[0]) == list(range(len(y.split()))) for x, y in zip(lines, TGT))
    assert "weights AWI units 0:0 (eos drop, symmetrize grow-diag)" in label("--method", "weights", "--shift", "awi",
                                                                             "--units", "0:0", "--eos", "drop",
                                                                             "--symmetrize", "grow-diag")[1]
    lines, err = label("--symmetrize", "none")
    assert "norms AWI units 0:0 (eos null, symmetrize none): the checkpoint's alignment.json with the command" in err
    assert all(len({j for _, j in parse_pharaoh(x)[0]}) == len(parse_pharaoh(x)[0]) for x in lines)
    lines, err = label("--punctuation", "apart")  # the file's aligner, then links between a mark and a word dropped
    assert "norms AWI units 0:0 (eos null, symmetrize grow-diag, punctuation apart)" in err
    every, _ = label()
    for kept, all_links, src, tgt in zip(lines, every, SRC, TGT):
        kept, all_links = parse_pharaoh(kept)[0], parse_pharaoh(all_links)[0]
        mark = [w == "." for w in src.split()], [w == "." for w in tgt.split()]
        assert kept == {(i, j) for i, j in all_links if mark[0][i] == mark[1][j]}
    lines, err = label("--method", "shift-att")
    assert "weights AWI units 0 (eos drop, symmetrize grow-diag): Shift-Att (Chen et al. 2020)" in err
    assert main(["align", "--checkpoint", str(ck), s, t, "--method", "layer"]) != 0
    assert "no trained alignment layer" in capsys.readouterr().err
    for flag, bad, valid in [("--method", "attention", "weights, norms, alti, layer, shift-att"),
                             ("--shift", "AWI", "awo, awi"),
                             ("--eos", "keep", "drop, null"),
                             ("--symmetrize", "grow", "none, intersect, grow-diag, grow-diag-final, union"),
                             ("--punctuation", "words", "any, apart")]:
        assert main(["align", "--checkpoint", str(ck), s, t, flag, bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"workbench align: error: {flag} must be one of {valid}; got {bad!r}"]
    assert main(["align", "--checkpoint", str(ck), s, t, "--choose", s, "--method", "weights"]) == 2
    assert "go without it" in capsys.readouterr().err


def test_a_line_over_the_models_positions_is_left_empty_with_a_warning_naming_it(checkpoint, tmp_path, capsys):
    """The tiny checkpoint has 48 positions (47 pieces a side): a synthetic 200-word line between two normal ones
    gets an empty output line, one stderr warning naming line 2, and the other lines are aligned as alone."""
    long_src = " ".join(["Hund"] * 200)
    s, t = _files(tmp_path, src=[SRC[0], long_src, SRC[2]], tgt=[TGT[0], TGT[1], TGT[2]])
    assert main(["align", "--checkpoint", str(checkpoint), s, t, "--method", "weights"]) == 0
    out = capsys.readouterr()
    lines = out.out.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # three lines, the second empty
    warning = [x for x in out.err.splitlines() if "warning" in x]
    assert len(warning) == 1 and warning[0].startswith("workbench align: warning: line 2 has ")
    assert "more than the model's 47" in warning[0]
    assert "1 too long for the model left empty" in out.err
    (tmp_path / "alone").mkdir()
    s1, t1 = _files(tmp_path / "alone", src=[SRC[0], SRC[2]], tgt=[TGT[0], TGT[2]])
    assert main(["align", "--checkpoint", str(checkpoint), s1, t1, "--method", "weights"]) == 0
    assert capsys.readouterr().out.splitlines() == [lines[0], lines[2]]


def test_align_works_after_nnsight_is_imported(checkpoint, tmp_path):
    """nnsight mounts a `.save` on every object when imported (its PYMOUNT): argparse then skipped `--save`'s
    default, `args.save` was nnsight's bound method, and every plain `workbench align` was refused (seen in the
    suite, where the nnsight tests share the process)."""
    pytest.importorskip("nnsight")
    import nnsight  # noqa: F401

    s, t = _files(tmp_path)
    assert main(["align", "--checkpoint", str(checkpoint), s, t, "-o", str(tmp_path / "a.txt")]) == 0
    assert len((tmp_path / "a.txt").read_text(encoding="utf-8").splitlines()) == len(SRC)

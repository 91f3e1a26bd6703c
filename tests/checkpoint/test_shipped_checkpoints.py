"""The checkpoints shipped in checkpoints/: they load offline with no pickle, translate, and their model
cards' test2016 BLEU is what `workbench evaluate` measures now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from model_helpers import ROOT, SHARED_DATA

from workbench.checkpoint.format import is_checkpoint

SHIPPED = sorted(p for p in (ROOT / "checkpoints").iterdir() if p.is_dir() and is_checkpoint(p)) \
    if (ROOT / "checkpoints").is_dir() else []
SENTENCES = {"de": ["Ein Hund rennt durch das Gras.", "", "Zwei Männer spielen Fußball am Strand."],
             "en": ["The animal didn't cross the street because it was too tired.", "",
                    "Two men are playing football on the beach."]}
PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")


def test_the_default_checkpoint_is_shipped():
    default = (ROOT / "checkpoints" / "DEFAULT").read_text().strip()
    assert default in [p.name for p in SHIPPED]


def test_the_package_finds_what_ships_from_any_directory(tmp_path, monkeypatch):
    from workbench.checkpoint import shipped as ship

    monkeypatch.chdir(tmp_path)  # not the repository: nothing relative to the working directory
    assert ship.available() == [p.name for p in SHIPPED]
    assert ship.shipped("multi30k-de-en") == ROOT / "checkpoints" / "multi30k-de-en"
    assert ship.shipped() == ROOT / "checkpoints" / (ROOT / "checkpoints" / "DEFAULT").read_text().strip()
    copy_task = ROOT / "configs" / "copy_task.toml"
    assert ship.shipped_config("copy_task") == ship.shipped_config("copy_task.toml") == copy_task
    with pytest.raises(FileNotFoundError, match=r"no shipped checkpoint 'nope' in .*checkpoints; shipped: \["):
        ship.shipped("nope")
    with pytest.raises(FileNotFoundError, match=r"no shipped config 'nope' .*'copy_task'"):
        ship.shipped_config("nope")
    monkeypatch.setattr(ship, "CHECKPOINTS", tmp_path / "none")
    assert ship.available() == []


def test_the_tutorials_use_the_shipped_model_outside_quick_mode(tmp_path):
    from workbench.training.tutorial import tiny_config, tutorial_checkpoint

    path, how = tutorial_checkpoint(quick=False, steps=1)  # no training: the shipped model is there
    assert path == ROOT / "checkpoints" / "multi30k-de-en" and how == f"using the shipped checkpoint {path}"
    quick = tiny_config(quick=True, steps=7, out_dir=tmp_path)
    assert (quick.preset, quick.max_steps, quick.train_limit, quick.out_dir) == ("tiny", 7, 2000, str(tmp_path))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_loads_with_no_pickle_and_translates(path: Path):
    import workbench

    for file in path.rglob("*"):
        if file.is_file():
            assert not file.read_bytes()[:4].startswith(PICKLE_MAGIC), f"{file} looks like a pickle/zip"
    model = workbench.load(path)
    sentences = SENTENCES[model.meta["src_lang"]]
    out = model.translate(sentences)
    assert len(out) == 3 and out[1] == "" and out[0] and out[2]
    assert out[0] != sentences[0] and out[2] != sentences[2]  # translated, not copied
    assert (path / "README.md").is_file() and (path / "train_log.jsonl").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in SHIPPED if (p / "eval.json").is_file()], ids=lambda p: p.name)
def test_model_card_bleu_is_reproduced(path: Path, tmp_path, capsys):
    from workbench.cli import main

    results = json.loads((path / "eval.json").read_text(encoding="utf-8"))
    claimed = results.get("test2016")
    if claimed is None:
        pytest.skip(f"{path.name} reports no test2016 score")
    src = SHARED_DATA / claimed["file"]
    ref = src.with_suffix(".en" if src.suffix == ".de" else ".de")
    code = main(["evaluate", "--checkpoint", str(path), "--src", str(src), "--ref", str(ref),
                 "--beam", str(claimed["beam"]), "--json"])
    assert code == 0
    measured = json.loads(capsys.readouterr().out)
    assert abs(measured["bleu"] - claimed["bleu"]) <= 0.1, (measured["bleu"], claimed["bleu"])

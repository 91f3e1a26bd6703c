"""Old command-line spellings keep working for one release, each with one line on stderr."""

from __future__ import annotations

import pytest

from workbench.cli import import_ as import_cli
from workbench.cli import main


class _Imported:
    src_tokenizer = object()

    class report:  # noqa: N801  (stands in for the ConversionReport attribute)
        @staticmethod
        def summary() -> str:
            return "converted"

    def save(self, out):
        return out


def test_import_records_the_length_penalty_exponent(monkeypatch, capsys, tmp_path):
    seen = {}

    def fake_import(fmt, source, **options):
        seen.update(options, fmt=fmt)
        return _Imported()

    monkeypatch.setattr(import_cli, "import_checkpoint", fake_import)
    assert main(["import", "fairseq", str(tmp_path), "--out", str(tmp_path / "ck"), "--alpha", "0.6", "--quiet"]) == 0
    assert seen == {"fmt": "fairseq", "lenpen": 0.6}
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit):  # the old spelling is gone
        main(["import", "fairseq", str(tmp_path), "--out", str(tmp_path / "ck"), "--lenpen", "0.6", "--quiet"])
    assert "unrecognized arguments: --lenpen" in capsys.readouterr().err

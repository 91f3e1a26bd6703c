"""notebooks/06_why.ipynb is generated from notebooks/06_why.py (reviewers and ruff read the source)."""

import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebooks extra: pip install -e '.[notebooks]'")

ROOT = Path(__file__).resolve().parents[2]


def test_committed_why_notebook_matches_its_source():
    builder = ROOT / "scripts" / "build_notebooks.py"
    spec = importlib.util.spec_from_file_location("workbench_build_notebooks_why", builder)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)  # no sys.path or sys.modules change
    committed = nbformat.read(ROOT / "notebooks" / "06_why.ipynb", as_version=4)
    fresh = build.notebook(ROOT / "notebooks" / "06_why.py")
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in fresh.cells]
    assert "shipped(" in fresh.cells[2].source and "../checkpoints" not in "".join(c.source for c in fresh.cells)

"""notebooks/06_why.ipynb is notebooks/build_why.py's output (reviewers read the generator)."""

import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebooks extra: pip install -e '.[notebooks]'")

NB_DIR = Path(__file__).resolve().parents[1] / "notebooks"


def test_committed_why_notebook_matches_its_generator():
    spec = importlib.util.spec_from_file_location("workbench_notebooks_build_why", NB_DIR / "build_why.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)  # no sys.path or sys.modules change
    committed = nbformat.read(NB_DIR / build.NAME, as_version=4)
    fresh = build.notebook()
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in fresh.cells]

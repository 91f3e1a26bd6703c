"""The committed tutorial notebooks carry nothing the code did not compute, and are what build.py writes.

Running them is tests/test_jupyterlab.py's job: every notebook, in real JupyterLab in Chromium, quick mode
(it replaced an nbclient run here, which could not see a chart that fails to draw or a request to a CDN).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebooks extra: pip install -e '.[notebooks]'")

NB_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(p.name for p in NB_DIR.glob("*.ipynb"))
EXPECTED = ["01_tour.ipynb", "02_annotated_transformer.ipynb", "03_train_multi30k.ipynb", "04_wmt_checkpoints.ipynb"]

# Absolute paths: POSIX roots people's machines have, home directories, Windows drives.
ABSOLUTE = re.compile(r"(?<![\w.~/])/(?:work|home|tmp|usr|root|Users|mnt|opt|var|data|scratch)/|~/|\b[A-Za-z]:\\")
# A result typed into prose: a decimal number (BLEU 27.9, loss 1.23, 0.5 s). Prose explains; numbers come from cells.
CODE_SPAN = re.compile(r"`[^`\n]+`")
PASTED_NUMBER = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")


def problems(book) -> list[str]:
    """What makes a committed notebook unfit: outputs, execution counts, absolute paths, numbers in prose."""
    found = []
    for i, cell in enumerate(book.cells):
        where = f"cell {i} ({cell.cell_type})"
        if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count") is not None):
            found.append(f"{where}: committed with outputs; rebuild with `python notebooks/build.py`")
        for match in ABSOLUTE.finditer(cell.source):
            found.append(f"{where}: absolute path {match.group(0)!r}")
        if cell.cell_type == "markdown":
            # cited values stay allowed only as the paper's, in a line that names it ("the paper's 27.3")
            for line in CODE_SPAN.sub("`…`", cell.source).splitlines():  # formulas in `code` are not results
                if "paper" not in line.lower():
                    found.extend(f"{where}: number typed into the text: {m.group(0)!r} in {line.strip()!r}"
                                 for m in PASTED_NUMBER.finditer(line))
    return found


def test_every_notebook_of_the_issue_is_there():
    assert set(EXPECTED) <= set(NOTEBOOKS), f"missing: {sorted(set(EXPECTED) - set(NOTEBOOKS))}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_is_clean(name):
    book = nbformat.read(NB_DIR / name, as_version=4)
    nbformat.validate(book)
    assert problems(book) == []
    params = [c for c in book.cells if "parameters" in c.metadata.get("tags", [])]
    assert params and "WORKBENCH_QUICK" in params[0].source, "the first code cell must read WORKBENCH_QUICK"


def load_build():
    """notebooks/build.py as a module, without touching sys.path or sys.modules (no state leaks into other tests)."""
    spec = importlib.util.spec_from_file_location("workbench_notebooks_build", NB_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_notebooks_match_the_generator():
    """The .ipynb files are build.py's output: reviewers read build.py, so they must not drift apart."""
    build = load_build()

    for name, cells in build.NOTEBOOKS.items():
        committed = nbformat.read(NB_DIR / name, as_version=4)
        assert [c.source for c in committed.cells] == [text for _, text in cells], name


def test_the_cleanliness_check_catches_what_it_should():
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    bad = new_notebook(cells=[
        new_markdown_cell("After training the model reaches BLEU 34.7 on test2016."),
        new_code_cell("ckpt = '/home/me/runs/m30k'"),
        new_code_cell("x = 1"),
        new_markdown_cell("The paper's base model reaches 27.3 BLEU."),  # a cited figure: allowed
        new_code_cell("open('../shared/data/README.md')"),                # relative: allowed
    ])
    bad.cells[2].outputs = [nbformat.v4.new_output("stream", text="1\n")]
    found = problems(bad)
    assert len(found) == 3, found
    assert "34.7" in found[0] and "/home/" in found[1] and "outputs" in found[2]

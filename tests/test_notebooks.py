"""The committed tutorial notebooks carry nothing the code did not compute, are what their jupytext sources
(notebooks/*.py) generate, and find the shipped checkpoints from wherever they sit.

Running them is tests/test_jupyterlab.py's job: every notebook, in real JupyterLab in Chromium, quick mode
(it replaced an nbclient run here, which could not see a chart that fails to draw or a request to a CDN).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebooks extra: pip install -e '.[notebooks]'")

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
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
            found.append(f"{where}: committed with outputs; rebuild with `python scripts/build_notebooks.py`")
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


def load_builder():
    """scripts/build_notebooks.py as a module, without touching sys.path or sys.modules (no state leaks)."""
    spec = importlib.util.spec_from_file_location("workbench_build_notebooks", ROOT / "scripts" / "build_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_notebook_has_a_python_source():
    assert [p.with_suffix(".ipynb").name for p in load_builder().sources()] == NOTEBOOKS


def test_committed_notebooks_are_generated_from_their_sources():
    """The .ipynb files are what scripts/build_notebooks.py writes from notebooks/*.py (which reviews and ruff
    read), byte for byte: edit the .py and run `make notebooks`."""
    assert load_builder().stale() == []


def test_the_generator_check_sees_an_edited_source(tmp_path, monkeypatch):
    build = load_builder()
    (tmp_path / "01_demo.py").write_text('# %% [markdown]\n# A title\n\n# %% tags=["parameters"]\nQUICK = True\n',
                                         encoding="utf-8")
    monkeypatch.setattr(build, "NB_DIR", tmp_path)
    assert build.stale() == [tmp_path / "01_demo.ipynb"]  # missing
    assert build.main([]) == 0 and build.stale() == []
    book = nbformat.read(tmp_path / "01_demo.ipynb", as_version=4)
    assert [c.id for c in book.cells] == ["cell-00", "cell-01"] and book.cells[1].metadata == {"tags": ["parameters"]}
    (tmp_path / "01_demo.py").write_text("# %%\nQUICK = False\n", encoding="utf-8")
    assert build.main(["--check"]) == 1


def test_ruff_reads_the_notebook_sources():
    """The sources are linted like the package (only E402 and B018 are off there: see pyproject.toml)."""
    ruff = pytest.importorskip("ruff")
    binary = Path(ruff.find_ruff_bin())
    listed = subprocess.run([binary, "check", "--show-files", "notebooks"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60).stdout
    assert [Path(line).name for line in listed.split() if line.endswith(".py")] == [
        p.with_suffix(".py").name for p in map(Path, NOTEBOOKS)]
    out = subprocess.run([binary, "check", "--no-cache", "notebooks"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout


@pytest.mark.slow
def test_a_notebook_copied_elsewhere_finds_the_shipped_checkpoints(tmp_path):
    """06_why's opening cells, run from a copy in another directory: the checkpoint comes through the package
    (`workbench.checkpoint.shipped`), not a path relative to notebooks/."""
    nbclient = pytest.importorskip("nbclient")
    book = nbformat.read(NB_DIR / "06_why.ipynb", as_version=4)
    upto = next(i for i, c in enumerate(book.cells) if "shipped(" in c.source)
    book.cells = [c for c in book.cells[: upto + 1] if c.cell_type == "code"]
    # quick mode, as CI runs the notebooks: the opening cell then builds 3 sentence pairs, not 40 from 600 lines
    book.cells.insert(0, nbformat.v4.new_code_cell("import os\nos.environ['WORKBENCH_QUICK'] = '1'"))
    book.cells.append(nbformat.v4.new_code_cell("print(tm.translate(['Ein Hund läuft.'])[0])"))
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    nbformat.write(book, elsewhere / "06_why.ipynb")
    done = nbclient.NotebookClient(book, timeout=300, kernel_name="python3",
                                   resources={"metadata": {"path": str(elsewhere)}}).execute()
    printed = "".join(o.get("text", "") for o in done.cells[-1].outputs)
    assert "dog" in printed.lower(), printed


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

"""Write notebooks/*.ipynb from their sources, the jupytext percent files notebooks/*.py (`# %%` cells).

Reviews and ruff read the .py; the .ipynb is what JupyterLab opens, generated here without outputs, with
stable cell ids (`cell-00`, ...) so a rebuild changes only the cells whose text changed.

    python scripts/build_notebooks.py            # rewrite every notebook whose source changed
    python scripts/build_notebooks.py --check    # exit 1 naming the notebooks that differ from their source

`make notebooks` runs the first; tests/test_notebooks.py runs the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat

NB_DIR = Path(__file__).resolve().parents[1] / "notebooks"
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def sources() -> list[Path]:
    """The notebook sources: notebooks/NN_name.py."""
    return sorted(p for p in NB_DIR.glob("[0-9][0-9]_*.py"))


def notebook(source: Path) -> nbformat.NotebookNode:
    """The notebook `source` describes: its cells, the `parameters` tag kept, no outputs."""
    book = jupytext.read(source, fmt="py:percent")
    for number, cell in enumerate(book.cells):
        tags = cell.metadata.get("tags")
        cell.metadata = nbformat.NotebookNode({"tags": tags} if tags else {})
        cell.id = f"cell-{number:02d}"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    book.metadata = nbformat.NotebookNode({"kernelspec": KERNELSPEC, "language_info": {"name": "python"}})
    book.nbformat, book.nbformat_minor = 4, 5
    return book


def text(book: nbformat.NotebookNode) -> str:
    return nbformat.writes(book) + "\n"


def stale() -> list[Path]:
    """The .ipynb files that are missing or differ from what their source generates."""
    out = []
    for source in sources():
        target = source.with_suffix(".ipynb")
        if not target.is_file() or target.read_text(encoding="utf-8") != text(notebook(source)):
            out.append(target)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report notebooks that differ from their source")
    args = parser.parse_args(argv)
    changed = stale()
    if args.check:
        for path in changed:
            print(f"{path.relative_to(NB_DIR.parent)} differs from its source; run python scripts/build_notebooks.py",
                  file=sys.stderr)
        return 1 if changed else 0
    for path in changed:
        path.write_text(text(notebook(path.with_suffix(".py"))), encoding="utf-8")
        print(f"wrote {path.relative_to(NB_DIR.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The tree's shape in figures, for the CHANGELOG's before/after (issue 37 point 6): modules and lines per folder of
`workbench/`, the functions over 60 lines, the longest ones, and test files per folder of `tests/`.

A function over the limit that reads as one step says why in its docstring, on a line beginning "One step:"; it is
counted apart, as accepted (`accepted_over_60_lines`), and the others are the ones still to split.

    python scripts/tree_figures.py [--rev REV] [--json]

`--rev` reads the files as they were at a commit (git show), so the same script gives the before and the after.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60
ONE_STEP = "One step:"


def states_one_step(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the function's docstring has a line beginning "One step:" (why it stays whole)."""
    doc = ast.get_docstring(node) or ""
    return any(line.strip().startswith(ONE_STEP) for line in doc.splitlines())


def files(rev: str | None, prefix: str) -> dict[str, str]:
    """{path: text} of the .py files under `prefix`, in the working tree or at `rev`."""
    if rev is None:
        return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in sorted((ROOT / prefix).rglob("*.py"))}
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", rev, prefix],
                           capture_output=True, text=True, check=True).stdout.split()
    return {n: subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{n}"], capture_output=True, text=True,
                              check=True).stdout for n in names if n.endswith(".py")}


def figures(rev: str | None) -> dict:
    code = files(rev, "workbench")
    modules, lines = Counter(), Counter()
    long: list[tuple[int, str]] = []
    accepted: list[tuple[int, str]] = []
    for path, text in code.items():
        parts = Path(path).parts
        folder = parts[1] if len(parts) > 2 else "(root)"
        modules[folder] += 1
        lines[folder] += text.count("\n")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > LIMIT:
                    (accepted if states_one_step(node) else long).append((n, f"{path}:{node.lineno} {node.name}"))
    long.sort(reverse=True)
    accepted.sort(reverse=True)
    tests = Counter(Path(p).parts[1] if len(Path(p).parts) > 2 else "(tests/)" for p in files(rev, "tests")
                    if Path(p).name.startswith("test_"))
    return {"rev": rev or "working tree", "modules": dict(sorted(modules.items())),
            "lines": dict(sorted(lines.items())), "total_lines": sum(lines.values()),
            f"functions_over_{LIMIT}_lines": len(long), f"accepted_over_{LIMIT}_lines": len(accepted),
            "longest": [f"{n} {where}" for n, where in long[:10]],
            "accepted": [f"{n} {where}" for n, where in accepted], "test_files": dict(sorted(tests.items()))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    f = figures(args.rev)
    if args.json:
        print(json.dumps(f, indent=2))
        return
    print(f"{f['rev']}: {f['total_lines']} lines in workbench/; modules per folder {f['modules']}")
    print(f"functions over {LIMIT} lines: {f[f'functions_over_{LIMIT}_lines']} (and "
          f"{f[f'accepted_over_{LIMIT}_lines']} accepted, their docstrings saying why they are one step); longest:")
    for row in f["longest"]:
        print("  " + row)
    for row in f["accepted"]:
        print("  accepted: " + row)
    print(f"test files per folder: {f['test_files']}")


if __name__ == "__main__":
    main()

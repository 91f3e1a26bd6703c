"""Figures of workbench's import graph: cycles, function-level imports, largest files.

    python scripts/import_graph.py [ROOT]        # ROOT: a checkout (default: this one)

Edges are every `import` of a workbench module, at module level or inside a function (an import
inside a function still ties the two modules together). `from .pkg import name` points at
`pkg/name.py` when that file exists, else at `pkg`. Cycles are elementary cycles (networkx's
Johnson), so one tangle of n modules can hold many.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import networkx as nx


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path, modules: set[str]) -> list[tuple[str, int, bool]]:
    """(imported name, line, inside a function) for every import in the file; names fully resolved."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(base + ([child.module] if child.module else []))
                else:
                    base = child.module or ""
                for a in child.names:
                    full = f"{base}.{a.name}"
                    out.append((full if full in modules else base, child.lineno, in_function))
            visit(child, nested)

    visit(tree, False)
    return out


def graph(root: Path) -> tuple[nx.DiGraph, list[tuple[str, str, int, str]]]:
    files = sorted((root / "workbench").rglob("*.py"))
    modules = {module_name(f, root) for f in files}
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    local = []  # (file, imported, line, top-level package of the import) for imports inside functions
    for f in files:
        src = module_name(f, root)
        for target, line, in_function in imports(f, root, modules):
            if in_function:
                local.append((str(f.relative_to(root)), target, line, target.split(".")[0]))
            if target in modules and target != src:
                g.add_edge(src, target)
    return g, local


def main(root: Path) -> None:
    g, local = graph(root)
    cycles = list(nx.simple_cycles(g))
    tangled = {m for c in cycles for m in c}
    print(f"import cycles: {len(cycles)} among {len(tangled)} modules")
    for c in sorted(cycles, key=len)[:5]:
        print("   ", " -> ".join(c + [c[0]]))
    statements = {(f, line): top for f, _, line, top in local}  # `from x import a, b` is one import
    own = {k for k, top in statements.items() if top == "workbench"}
    print(f"function-level import statements: {len(statements)} in {len({f for f, _ in statements})} files "
          f"(of workbench modules: {len(own)} in {len({f for f, _ in own})} files)")
    sizes = sorted(((len(f.read_text(encoding='utf-8').splitlines()), f.relative_to(root))
                    for f in (root / "workbench").rglob("*.py")), reverse=True)
    print("largest files:", ", ".join(f"{p} {n}" for n, p in sizes[:10]))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]).resolve())

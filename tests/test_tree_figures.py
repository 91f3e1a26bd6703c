"""scripts/tree_figures.py counts a long function as accepted only when its docstring says why it is one step."""

import ast
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("tree_figures", Path(__file__).parents[1] / "scripts" / "tree_figures.py")
tree_figures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tree_figures)


def _fn(doc: str) -> ast.FunctionDef:
    return ast.parse(f'def f():\n    """{doc}"""\n').body[0]


def test_one_step_needs_a_line_that_begins_with_it():
    assert tree_figures.states_one_step(_fn("Decode.\n\n    One step: the loop's state is shared."))
    assert not tree_figures.states_one_step(_fn("Decode in one step: not a stated reason."))
    assert not tree_figures.states_one_step(ast.parse("def f():\n    pass\n").body[0])

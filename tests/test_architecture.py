"""The import graph obeys docs/architecture.md: layers, no cycles, imports at the top, a light CLI.

Every `import` of every module under workbench/ (and apps/) is read with `ast`, at module level and
inside functions alike, so a lazy import cannot hide an edge.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import workbench
import workbench.decoding.translator
import workbench.importers
from workbench import Transformer, presets
from workbench.checkpoint.format import save_checkpoint
from workbench.checkpoint.tokenizer import SentencePieceTokenizer
from workbench.checkpoint.toolkit_tokenizers import SpmVocabTokenizer

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workbench"

# Layers, lowest first. A module's layer is the folder it sits in (workbench/core/model.py is in "core"; apps/ is
# "apps"); folders listed together share a rank. A module may import its own folder (if that stays acyclic) and
# the layers below, never a higher layer and never a sibling folder of its own rank.
LAYERS = [{"core"}, {"checkpoint"}, {"corpus", "decoding"}, {"training", "importers"}, {"features"}, {"analysis"},
          {"charts"}, {"ui"}, {"apps"}, {"cli"}]
RANK = {folder: rank for rank, folders in enumerate(LAYERS) for folder in folders}
MODEL_SIDE = {"core", "checkpoint", "corpus", "decoding", "training", "importers"}

# Optional or heavy third-party modules that may be imported inside a function without a comment:
# extras (transformers, sacremoses), the drawing/serving stack (pandas, altair, bokeh, panel, vl_convert,
# selenium, playwright), notebook display (IPython), scoring only when scoring (sacrebleu), DDP only under
# torchrun (torch.distributed, torch.nn.parallel), and tomllib (Python 3.11+; JSON configs work on 3.10).
OPTIONAL_HEAVY = {"transformers", "sacremoses", "pandas", "altair", "bokeh", "panel", "param", "vl_convert",
                  "selenium", "playwright", "IPython", "sacrebleu", "torch.distributed", "torch.nn.parallel",
                  "tomllib", "triton"}
UI_LIBRARIES = {"panel", "param", "bokeh", "altair", "pandas", "vl_convert", "selenium"}


@dataclass(frozen=True)
class Import:
    file: Path
    line: int
    target: str  # the imported module, resolved (relative imports made absolute)
    in_function: bool
    commented: bool  # the import line carries a comment (the reason it is inside a function)

    def __str__(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}: {self.target}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str | None:
    """The folder a module sits in: "core" for workbench.core.model, "apps" for apps.attention; None for a
    module directly under workbench/ (only the package root may sit there)."""
    parts = module.split(".")
    if parts[0] == "apps":
        return "apps"
    if module == "workbench":
        return "cli"  # the package root: the public facade, on top (it imports lazily, via importlib)
    if parts[0] != "workbench" or not (PACKAGE / parts[1]).is_dir():
        return None
    return parts[1] if parts[1] in RANK else None


def source_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "apps").glob("*.py"))


MODULES = {module_name(f) for f in source_files()}


def imports_of(path: Path) -> list[Import]:
    """Every import in the file; `from pkg import name` yields pkg.name when that is a module, else pkg."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found: list[Import] = []

    def add(node: ast.stmt, target: str, in_function: bool) -> None:
        found.append(Import(path, node.lineno, target, in_function, "#" in lines[node.lineno - 1]))

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(child, alias.name, in_function)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1] + ([child.module] if child.module else []))
                else:
                    base = child.module or ""
                submodules = [f"{base}.{a.name}" for a in child.names if f"{base}.{a.name}" in MODULES]
                if base != "__future__" and len(submodules) < len(child.names):
                    add(child, base, in_function)  # a name defined in base: needs base's own code
                for target in submodules:
                    add(child, target, in_function)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(text), False)
    return found


ALL_IMPORTS = [imp for f in source_files() for imp in imports_of(f)]


def is_edge(imp: Import) -> bool:
    """An import of another workbench module (`from . import __version__` in a submodule is one: it
    needs the package root's code to have run)."""
    return imp.target in MODULES and imp.target != module_name(imp.file)


def own_edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in ALL_IMPORTS:
        if is_edge(imp):
            graph[module_name(imp.file)].add(imp.target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle (as a closed path), or None; iterative depth-first search."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if layer(m) is None)
    assert not missing, (f"put these modules in a layer folder (LAYERS in tests/test_architecture.py, "
                         f"docs/architecture.md): {missing}")


def test_layers_are_the_folders_of_the_tree():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(RANK) - {"apps"}, "every package folder is a layer, and every layer a folder"
    assert [p.name for p in PACKAGE.glob("*.py")] == ["__init__.py"], "modules live in layer folders"
    assert layer("workbench.core.model") == "core" and layer("workbench.training.config") == "training"
    assert layer("workbench.nowhere") is None


def test_no_import_cycles():
    cycle = find_cycle(own_edges())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_finds_one():  # the checker itself: a cycle three modules long, and none once it is cut
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    graph["c"] = {"d"}
    assert find_cycle(graph) is None


def against_the_order(imports: list[Import]) -> list[str]:
    """Imports of a higher layer, or of a sibling folder of the same rank."""
    out = set()
    for imp in imports:
        own, other = layer(module_name(imp.file)), layer(imp.target)
        if is_edge(imp) and own and other and (RANK[other] > RANK[own] or (RANK[other] == RANK[own] and other != own)):
            out.add(f"{imp} ({own} imports {other})")
    return sorted(out)


def test_imports_follow_the_layer_order():
    against = against_the_order(ALL_IMPORTS)
    assert not against, "imports against the layer order:\n" + "\n".join(against)


def test_the_order_check_catches_a_wrong_import():  # the checker itself, on made-up edges
    def edge(source: str, target: str) -> Import:
        return Import(PACKAGE / source, 1, target, False, False)

    assert against_the_order([edge("core/model.py", "workbench.corpus.data"),
                              edge("decoding/search.py", "workbench.corpus.data"),
                              edge("training/trainer.py", "workbench.corpus.data")]) == [
        "workbench/core/model.py:1: workbench.corpus.data (core imports corpus)",
        "workbench/decoding/search.py:1: workbench.corpus.data (decoding imports corpus)"]


def test_the_model_and_decoding_load_without_corpus_or_training():
    code = ("import sys\nimport workbench.core.model, workbench.core.presets, workbench.decoding.search\n"
            "import workbench.decoding.translator, workbench.checkpoint.format\n"
            "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['workbench', 'corpus'], "
            "['workbench', 'training'], ['workbench', 'importers'])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_apps_import_only_the_ui_and_the_library():
    bad = [str(imp) for imp in ALL_IMPORTS if module_name(imp.file).startswith("apps.")
           and imp.target.startswith("workbench") and layer(imp.target) in ("cli", "apps")]
    assert not bad, f"apps import the command line or the package facade: {bad}"


def test_model_side_never_imports_ui_or_plotting_libraries():
    bad = [str(imp) for imp in ALL_IMPORTS if layer(module_name(imp.file)) in MODEL_SIDE
           and imp.target.split(".")[0] in UI_LIBRARIES]
    assert not bad, f"model-side modules import UI/plotting/dataframe libraries: {bad}"


def test_charts_never_import_panel():
    bad = [str(imp) for imp in ALL_IMPORTS if layer(module_name(imp.file)) == "charts"
           and imp.target.split(".")[0] in ("panel", "param")]
    assert not bad, f"charts are data in, chart out, no Panel: {bad}"


# The page's store: the one place in the UI that turns a checkpoint path into a model (issue 28 point 1).
STORE = {"ui/loader.py", "ui/session.py", "ui/work.py", "ui/workbench_app.py"}


def _calls_load_model(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("load_model", "load_checkpoint")]


def test_views_get_models_from_the_store_never_from_a_path():
    bad = {str(p.relative_to(PACKAGE)): lines for p in sorted((PACKAGE / "ui").glob("*.py"))
           if str(p.relative_to(PACKAGE)) not in STORE and (lines := _calls_load_model(p))}
    assert not bad, f"UI modules that load a checkpoint themselves (take the session's model): {bad}"
    assert _calls_load_model(PACKAGE / "ui" / "work.py"), "the checker itself: the store's own call is seen"


def test_no_workbench_module_is_imported_inside_a_function():
    """One exception: a CLI subcommand may import the chart modules (Bokeh, Altair) in its `run`, with a comment,
    so that its `--help` stays light; the layer test above still sees those edges."""
    def cli_charts(imp: Import) -> bool:
        return (imp.file.is_relative_to(ROOT / "workbench" / "cli") and imp.commented
                and imp.target.startswith("workbench.charts"))

    lazy = [str(imp) for imp in ALL_IMPORTS if imp.in_function and imp.target.split(".")[0] == "workbench"
            and not cli_charts(imp)]
    assert not lazy, "import these at the top of the file (a lazy import hides the graph):\n" + "\n".join(lazy)


def test_function_level_imports_are_optional_heavy_or_say_why():
    def allowed(target: str) -> bool:
        return any(target == m or target.startswith(m + ".") for m in OPTIONAL_HEAVY)

    bad = [str(imp) for imp in ALL_IMPORTS if imp.in_function and imp.target.split(".")[0] != "workbench"
           and not allowed(imp.target) and not imp.commented]
    assert not bad, ("import at the top, or add a one-line comment saying why it waits:\n" + "\n".join(bad))


# ------------------------------------------------------------------------------ a light command line

HEAVY = ["torch", "pandas", "altair", "bokeh", "panel", "transformers", "vl_convert", "sacrebleu"]
PLOTTING = ["pandas", "altair", "bokeh", "panel", "transformers", "vl_convert"]


def loaded_by(code: str) -> list[str]:
    """Which HEAVY modules a fresh interpreter has loaded after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def help_of(*argv: str) -> str:
    return ("from contextlib import redirect_stdout\nimport io\nfrom workbench.cli import main\n"
            f"with redirect_stdout(io.StringIO()):\n    try:\n        main({list(argv)!r})\n"
            "    except SystemExit:\n        pass")


def test_workbench_help_imports_nothing_heavy():
    assert loaded_by(help_of("--help")) == []


def test_import_workbench_is_light():
    assert loaded_by("import workbench") == []


@pytest.mark.parametrize("command", ["train", "translate", "evaluate", "import", "views", "heads", "average", "info"])
def test_subcommand_help_loads_no_plotting_library(command):
    assert not set(loaded_by(help_of(command, "--help"))) & set(PLOTTING)


# ------------------------------------------------------------------- own checkpoints skip the importers

def _checkpoint(directory: Path, *, toolkit: bool) -> Path:
    """A tiny untrained checkpoint; `toolkit`: with an imported model's tokenizer kind (spm_vocab)."""
    words = "the a dog cat runs sleeps on grass red blue house small big man woman child".split()
    sentences = [" ".join(words[(i * k) % len(words)] for k in range(1, 7)) for i in range(200)]
    tok = SentencePieceTokenizer.train(sentences=sentences, vocab_size=40, byte_fallback=False, num_threads=1)
    if toolkit:
        specials = {role: tok.pieces([getattr(tok, f"{role}_id")])[0] for role in ("unk", "pad", "eos", "bos")}
        tok = SpmVocabTokenizer(tok.proto, tok.pieces(list(range(tok.vocab_size))), **specials)
    torch.manual_seed(0)
    model = Transformer(presets.tiny(vocab=tok.vocab_size))
    return save_checkpoint(directory, model, src_tokenizer=tok, tgt_tokenizer=tok)


@pytest.mark.parametrize("toolkit", [False, True], ids=["sentencepiece", "spm_vocab"])
def test_load_of_a_checkpoint_directory_never_imports_the_importers(tmp_path, toolkit):
    path = _checkpoint(tmp_path / "ck", toolkit=toolkit)
    code = (f"import sys, workbench\ntm = workbench.load({str(path)!r}, beam=1, max_len=5)\n"
            "print(tm.src_tokenizer.kind, len(tm.translate(['the dog'])), "
            "sorted(m for m in sys.modules if m.startswith('workbench.importers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["spm_vocab" if toolkit else "sentencepiece", "1", "[]"]


def test_load_sends_only_format_specs_to_the_importers(monkeypatch):
    calls = []
    monkeypatch.setattr(workbench.importers, "load", lambda spec, **kw: calls.append(("importers", spec, kw)))
    monkeypatch.setattr(workbench.decoding.translator, "load",
                        lambda spec, **kw: calls.append(("translator", spec, kw)))
    workbench.load("marian:hf:Helsinki-NLP/opus-mt-en-de", beam=2)
    workbench.load("runs/marian:copy", device="cpu")  # a directory whose name has a colon
    workbench.load("fairseq:")  # nothing after the colon: not a spec
    assert calls == [("importers", "marian:hf:Helsinki-NLP/opus-mt-en-de", {"device": "cpu", "beam": 2}),
                     ("translator", "runs/marian:copy", {"device": "cpu"}),
                     ("translator", "fairseq:", {"device": "cpu"})]


# ------------------------------------------------------------------------------ the residual stream, named once
# Hook names and the decoder-input shift live in workbench/core (issue 29 point 8): the layers publish their
# sub-layers (`layer.sublayers()`, `model.stream(stack)`), hook points carry their `.name`, module paths come from
# `core.hooks.path_of`, and `core.batching.decoder_input` / `teacher_forced` is the one shift. Elsewhere a hook
# name is taken by reference (`model.dec[i].cross_attn.hook_probs.name`), never spelled with a formatted index.
# Importers are exempt: their strings are foreign state-dict keys, not hook names.
NAMING_HOMES = ("core/", "importers/")
# f"{i}.ffn", f"{i}.ffn_norm", f"{p}.hook_out"
_AFTER_FIELD = re.compile(r"^\w*(\.\w+)*\.hook_\w|^\.(self_attn|cross_attn|ffn)(_norm)?\b")
_BEFORE_FIELD = re.compile(r"hook_(\w+_)?$")  # f"hook_{side}_tok", f"hook_resid_{attn}"
_PLACEHOLDER = re.compile(r"\{[^{}]*\}|%[-#0 +]*\d*(?:\.\d+)?[sdrif]")
# Where the shift may still be written, and why.
SHIFT_HOMES = {
    "core/batching.py": "the one shift (decoder_input, teacher_forced)",
    "corpus/data.py": "Corpus.collate fills the trainer's numpy rows in place, 5x cheaper per sentence than "
                      "decoder_input on the training hot path; tests/corpus/test_data.py checks its rows equal "
                      "decoder_input's",
}


def _spelled(parts: list[str | None]) -> bool:
    """A string built from constant parts (str) and formatted fields (None): does a hook path follow a field, or
    a field complete a hook leaf?"""
    for k, part in enumerate(parts):
        if part is None:
            continue
        if k > 0 and parts[k - 1] is None and _AFTER_FIELD.search(part):
            return True
        if k + 1 < len(parts) and parts[k + 1] is None and _BEFORE_FIELD.search(part):
            return True
    return False


def _template(text: str) -> list[str | None]:
    """A str.format / %-template as constant parts and fields."""
    parts: list[str | None] = []
    last = 0
    for m in _PLACEHOLDER.finditer(text):
        parts += [text[last : m.start()], None]
        last = m.end()
    return [*parts, text[last:]]


def _const(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def spelled_hook_names(code: str) -> list[int]:
    """Lines that build a hook name by formatting: f-strings, str.format, %, and `+` of a string constant."""
    lines = []
    for node in ast.walk(ast.parse(code)):
        parts: list[str | None] | None = None
        if isinstance(node, ast.JoinedStr):
            parts = [_const(v) if _const(v) is not None else None for v in node.values]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format" \
                and _const(node.func.value) is not None:
            parts = _template(_const(node.func.value))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and _const(node.left) is not None:
            parts = _template(_const(node.left))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and \
                (_const(node.left) is None) != (_const(node.right) is None):
            parts = [_const(node.left), None] if _const(node.left) is not None else [None, _const(node.right)]
        if parts is not None and _spelled(parts):
            lines.append(node.lineno)
    return sorted(set(lines))


def _is_start(node: ast.AST) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name in ("start_id", "decoder_start_id")


def hand_shifts(code: str) -> list[int]:
    """Lines that write the decoder-input shift by hand: a start id in a display with a starred rest
    (`[cfg.start_id, *out[:-1]]`) or added to one (`[start_id] + out[:-1]`), stored into a tensor row
    (`tgt_in[row, 0] = cfg.start_id`), or concatenated (`torch.cat([start column, tgt[:, :-1]], 1)`)."""
    lines = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, (ast.List, ast.Tuple)) and any(_is_start(e) for e in node.elts) and \
                any(isinstance(e, ast.Starred) for e in node.elts):
            lines.append(node.lineno)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and any(
                isinstance(side, (ast.List, ast.Tuple)) and any(_is_start(e) for e in side.elts)
                for side in (node.left, node.right)):
            lines.append(node.lineno)
        elif isinstance(node, ast.Assign) and _is_start(node.value) and \
                any(isinstance(t, ast.Subscript) for t in node.targets):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                "cat", "concat", "concatenate", "hstack") and any(_is_start(n) for a in node.args for n in ast.walk(a)):
            lines.append(node.lineno)
    return sorted(set(lines))


def _outside(homes) -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if not str(p.relative_to(PACKAGE)).startswith(tuple(homes))]


def test_hook_names_are_taken_by_reference_outside_core():
    bad = {str(p.relative_to(ROOT)): lines for p in _outside(NAMING_HOMES)
           if (lines := spelled_hook_names(p.read_text(encoding="utf-8")))}
    assert not bad, ("hook names spelled with a formatted index (take them from the model: "
                     f"`layer.sublayers()`, `model.stream(stack)`, `hook.name`, `path_of(module)`): {bad}")


def test_the_hook_name_checker_catches_spelled_names():  # the checker itself, on made-up code
    spelled = ['f"dec.{i}.cross_attn.hook_probs"', 'f"{stack}.{layer}.hook_norm_ffn"', 'f"{p}.{b}_norm.hook_scale"',
               'f"{stack}.{i}.ffn"', 'f"{stack}.{i}.ffn_norm"', 'f"{spec}.hook_out"', 'f"hook_{side}_tok"',
               'f"{s}.{i}.hook_resid_{attn}"',
               '"dec.{}.self_attn.hook_q".format(i)', '"enc.%d.hook_resid_in" % i', 'prefix + ".hook_v"',
               '"hook_resid_" + name']
    for code in spelled:
        assert spelled_hook_names(f"x = {code}\n") == [1], code
    fine = ['layer.cross_attn.hook_probs.name', 'f"{path_of(norm)}.bias"', 'f"error {stack}.{i} @{q}"',
            'f"hook on {point.name} must return None"', 'f"no attention probabilities (*.hook_probs) in {path}"',
            'f"{kind}:{layer}:{head}"', '"dec.*.cross_attn.hook_probs"', 'f"{label} @{q}"']
    for code in fine:
        assert spelled_hook_names(f"x = {code}\n") == [], code


def test_the_decoder_input_shift_is_written_once():
    bad = {str(p.relative_to(ROOT)): lines for p in _outside(SHIFT_HOMES)
           if (lines := hand_shifts(p.read_text(encoding="utf-8")))}
    assert not bad, f"decoder inputs shifted by hand (use core.batching.decoder_input / teacher_forced): {bad}"
    assert hand_shifts((PACKAGE / "corpus" / "data.py").read_text(encoding="utf-8")), \
        "corpus/data.py no longer shifts by hand: drop it from SHIFT_HOMES"


def test_the_shift_checker_catches_hand_shifts():  # the checker itself, on made-up code
    shifts = ["tgt = [cfg.start_id, *out_ids[:-1]]", "tgt = torch.tensor([[model.cfg.start_id, *r.tokens[:-1]]])",
              "rows = [[start_id, *t] for t in targets]", "tgt = [cfg.decoder_start_id] + out[:-1]",
              "tgt_in[row, 0] = cfg.start_id",
              "t = torch.cat([torch.full((b, 1), cfg.start_id), tgt[:, :-1]], 1)"]
    for code in shifts:
        assert hand_shifts(code + "\n") == [1], code
    fine = ["tgt = decoder_input(out_ids, cfg.start_id)", "tokens = torch.full((b, 1), cfg.start_id)",
            "b = teacher_forced(s, o, pad_id=cfg.pad_id, start_id=cfg.start_id)", "body = ids[:-1]",
            "_Beams.start(limits, K, w, start_id=model.cfg.start_id, pad=pad)"]
    for code in fine:
        assert hand_shifts(code + "\n") == [], code

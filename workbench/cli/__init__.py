"""`workbench` command line: one module per subcommand, imported only when that subcommand runs.

Each subcommand module provides `add_arguments(parser)` and `run(args) -> int`; register it in
COMMANDS. `workbench --help` imports none of them (no torch, no plotting library); `workbench X ...`
imports only X's module. Errors the user can fix (bad paths, bad configs) print one clear line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module, one-line help)
    "info": ("workbench.cli.info", "show a model preset or checkpoint config and its hook points"),
    "train": ("workbench.cli.train", "train a model from a TOML/JSON config (--key=value overrides; torchrun for DDP)"),
    "average": ("workbench.cli.average", "average the weights of several checkpoints (e.g. --last 5 RUN_DIR)"),
    "translate": ("workbench.cli.translate", "translate text line by line (stdin or a file) with a checkpoint"),
    "evaluate": ("workbench.cli.evaluate", "translate a test set and print sacrebleu BLEU and chrF with signatures"),
    "import": ("workbench.cli.import_", "convert a Marian/opus-mt, FSMT, fairseq or OpenNMT-py checkpoint"),
    "views": ("workbench.cli.views", "write a saved trace's attention views as offline HTML files"),
    "heads": ("workbench.cli.heads", "head statistics of a checkpoint over a test set (CSV + HTML report)"),
    "prune": ("workbench.cli.prune", "BLEU and chrF as heads are removed in order of importance, per attention kind"),
    "formation": ("workbench.cli.formation", "per-head AER, source share and roles at every snapshot of a run"),
    "align": ("workbench.cli.align", "word alignments of sentence pairs from a checkpoint (Pharaoh i-j per line)"),
    "aer": ("workbench.cli.aer", "alignment error rate, precision and recall of an alignment file against gold"),
    "features": ("workbench.cli.features", "sparse dictionaries (SAEs, transcoders): train, eval, corpus stats, "
                 "Neuronpedia export"),
    "graph": ("workbench.cli.graph", "attribution graphs of a translation's output tokens as circuit-tracer files"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported to add its arguments (None: just the names)."""
    parser = argparse.ArgumentParser(prog="workbench", description="Attention Workbench")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the top-level parser has no options but --help, so the first word that is not one names the command
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    module = importlib.import_module(args._module)

    def one_line(message, category, filename, lineno, line=None) -> str:
        # a warning is news for the user (a line truncated, skipped...), said as the errors are: one line, no source.
        # The format, not `showwarning`: a caller recording warnings (catch_warnings(record=True)) still gets them
        return f"workbench {args.command}: warning: {message}\n"

    shown, warnings.formatwarning = warnings.formatwarning, one_line
    try:
        return int(module.run(args) or 0)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"workbench {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"workbench {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = shown

"""Attention Workbench: see inside encoder-decoder Transformers.

The public surface, imported on first use (PEP 562), so `import workbench` and `workbench --help`
load nothing heavy; `from workbench import Transformer` works as usual.
"""

from __future__ import annotations

import importlib

from .core.version import __version__

__all__ = ["DecoderCache", "Encoded", "ModelConfig", "Trace", "TranslationModel", "Transformer", "__version__",
           "load"]

_IMPORT_FORMATS = ("marian", "fsmt", "fairseq", "opennmt")  # the formats workbench.importers converts

# public name -> module that defines it
_LAZY = {"ModelConfig": "core.config", "DecoderCache": "core.model", "Encoded": "core.model",
         "Transformer": "core.model", "Trace": "core.trace", "TranslationModel": "decoding.translator"}
_MODULES = {"presets": "core.presets"}  # public modules by their short name: `from workbench import presets`


def load(path_or_id, *, device="cpu", **decode):
    """A `TranslationModel` (text in, text out) from a workbench checkpoint directory, or from a
    published checkpoint imported on the fly: "marian:hf:Helsinki-NLP/opus-mt-en-de",
    "fairseq:/data/wmt16.en-de/model.pt", ... (see workbench.importers)."""
    fmt, _, rest = str(path_or_id).partition(":")
    # own checkpoints go straight to the translator; only "FORMAT:SOURCE" needs the importers
    module = "importers" if fmt in _IMPORT_FORMATS and rest else "decoding.translator"
    return importlib.import_module(f"{__name__}.{module}").load(path_or_id, device=device, **decode)


def __getattr__(name):  # PEP 562: the public classes, and submodules as attributes (workbench.core.config ...)
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{_MODULES[name]}")
    if not name.startswith("_"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")

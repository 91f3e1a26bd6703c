"""Attention Workbench: see inside encoder-decoder Transformers.

The public surface; heavy modules (training, decoding, importers, apps) are imported only when used.
"""

from .config import ModelConfig
from .model import DecoderCache, Encoded, Transformer
from .trace import Trace

__all__ = ["DecoderCache", "Encoded", "ModelConfig", "Trace", "TranslationModel", "Transformer", "load"]
__version__ = "0.1.0"


def load(path_or_id, *, device="cpu", **decode):
    """A `TranslationModel` (text in, text out) from a workbench checkpoint directory, or from a
    published checkpoint imported on the fly: "marian:hf:Helsinki-NLP/opus-mt-en-de",
    "fairseq:/data/wmt16.en-de/model.pt", ... (see workbench.importers)."""
    from .importers import load as _load

    return _load(path_or_id, device=device, **decode)


def __getattr__(name):  # PEP 562: TranslationModel without importing the translator at package import
    if name == "TranslationModel":
        from .translator import TranslationModel

        return TranslationModel
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")

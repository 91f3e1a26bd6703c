"""Attention Workbench: see inside encoder-decoder Transformers.

The public surface; heavy modules (training, apps) are imported only when used.
"""

from .config import ModelConfig
from .model import DecoderCache, Encoded, Transformer
from .trace import Trace

__all__ = ["DecoderCache", "Encoded", "ModelConfig", "Trace", "TranslationModel", "Transformer", "load"]


def load(path, *, device="cpu", **decode):
    """A checkpoint directory as a `TranslationModel` (text in, text out; see workbench.translator)."""
    from .translator import load as _load

    return _load(path, device=device, **decode)


def __getattr__(name):  # PEP 562: TranslationModel without importing the translator at package import
    if name == "TranslationModel":
        from .translator import TranslationModel

        return TranslationModel
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
__version__ = "0.1.0"

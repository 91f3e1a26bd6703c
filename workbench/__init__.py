"""Attention Workbench: see inside encoder-decoder Transformers.

The public surface; heavy modules (training, apps) are imported only when used.
"""

from .config import ModelConfig
from .model import DecoderCache, Encoded, Transformer
from .trace import Trace

__all__ = ["DecoderCache", "Encoded", "ModelConfig", "Trace", "Transformer"]
__version__ = "0.1.0"

"""Old single home of what the importers share, kept so existing imports work. The pieces now live in
errors.py (the two errors), reading.py (safe file reading), keymap.py (key-map tables, transforms,
convert, checks), result.py (ImportReport, Imported) and hf.py (what Marian and FSMT share).
"""

from __future__ import annotations

from .errors import ConversionError, UnsafeCheckpointError
from .hf import layer_table as fairseq_layers
from .keymap import (
    ACTIVATIONS,
    Source,
    Transform,
    build_model,
    check_aliases,
    check_table,
    chunk,
    convert,
    copy,
    first_present,
    flatten,
    layer_count,
    per_stack,
    target_state,
    transpose,
)
from .reading import StandIn, namespace_dict, read_json, read_state_dict, stand_in, torch_load
from .result import Imported, ImportReport

__all__ = [
    "ACTIVATIONS", "ConversionError", "ImportReport", "Imported", "Source", "StandIn", "Transform",
    "UnsafeCheckpointError", "build_model", "check_aliases", "check_table", "chunk", "convert", "copy",
    "fairseq_layers", "first_present", "flatten", "layer_count", "namespace_dict", "per_stack", "read_json",
    "read_state_dict", "stand_in", "target_state", "torch_load", "transpose",
]

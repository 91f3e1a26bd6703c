"""Importers for published translation checkpoints: Marian/opus-mt, FSMT, fairseq, OpenNMT-py.

    imported = import_checkpoint("marian", "path/to/opus-mt-en-de")   # or "hf:Helsinki-NLP/opus-mt-en-de"
    imported.save("ckpt/opus-mt-en-de")                               # config + safetensors + tokenizers
    tm = load("ckpt/opus-mt-en-de")                                   # a TranslationModel, like our own

Each importer is a key-map table plus named transforms, checked key by key and shape by shape
(keymap.py); files are read without running their code (reading.py); what the two Hugging Face
formats share is in hf.py; downloads are workbench.corpus.download's. The model itself has no per-toolkit
branches, only config values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..corpus.download import resolve_source
from ..decoding.translator import TranslationModel, decode_config_from_meta
from ..decoding.translator import load as load_own
from .errors import ConversionError, UnsafeCheckpointError
from .fairseq import import_fairseq
from .fsmt import import_fsmt
from .marian import import_marian
from .opennmt import import_opennmt
from .result import Imported, ImportReport

__all__ = ["ConversionError", "ImportReport", "Imported", "UnsafeCheckpointError", "import_checkpoint", "load"]


def import_checkpoint(fmt: str, source: str | Path, **options: Any) -> Imported:
    """Convert `source` (local path, hf:owner/name or URL) from toolkit `fmt` into an in-memory model."""
    path = resolve_source(str(source), fmt)
    if fmt == "marian":
        return import_marian(path, **options)
    if fmt == "fsmt":
        return import_fsmt(path, **options)
    if fmt == "fairseq":
        return import_fairseq(path, **options)
    if fmt == "opennmt":
        return import_opennmt(path, **options)
    raise ValueError(f"unknown format {fmt!r}; choose marian, fsmt, fairseq or opennmt")


def load(path_or_id: str | Path, *, device: str = "cpu", **decode: Any):
    """A TranslationModel from our own checkpoint directory, or from "FORMAT:SOURCE" imported on the fly
    (e.g. "marian:hf:Helsinki-NLP/opus-mt-en-de", "fairseq:/data/wmt16.en-de/model.pt")."""

    text = str(path_or_id)
    fmt, _, rest = text.partition(":")
    if fmt in ("marian", "fsmt", "fairseq", "opennmt") and rest:
        imported = import_checkpoint(fmt, rest)
        if imported.src_tokenizer is None:
            raise ValueError(f"{text} has no tokenizer files, so it cannot translate text")
        generation = dict(imported.generation)
        append_eos = bool(generation.pop("append_eos", True))
        tm = TranslationModel(imported.model.to(device), imported.src_tokenizer, imported.tgt_tokenizer,
                              decode=decode_config_from_meta(generation), append_eos=append_eos,
                              meta=imported.meta())
        if decode:
            tm.decode_config = tm.config_with(**decode)
        return tm
    return load_own(text, device=device, **decode)

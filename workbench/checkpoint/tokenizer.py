"""Tokenizers behind one small protocol; sentencepiece training and loading with the model's special ids.

Checkpoints store each tokenizer's files plus a JSON spec (`{"kind": ..., ...}`); `load_tokenizer`
dispatches on the kind: sentencepiece, and the toolkit kinds of imported checkpoints (`toolkit_tokenizers`:
Marian's spm pair, Moses+BPE); `register_tokenizer` adds more.
Special ids follow `ModelConfig`'s defaults: pad 0, bos 1, eos 2, unk 3.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import sentencepiece as spm

from .toolkit_tokenizers import MosesBPETokenizer, SpmVocabTokenizer


@runtime_checkable
class Tokenizer(Protocol):
    kind: str
    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int
    unk_id: int

    def encode(self, text: str) -> list[int]:
        """Ids for `text`, without BOS/EOS."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenized text; special ids are skipped."""
        ...

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """One display string per id (keeps sentencepiece's "▁")."""
        ...

    def save(self, directory: Path, name: str) -> dict:
        """Write this tokenizer's files into `directory`; return a JSON-able spec for `load`."""
        ...

    @classmethod
    def load(cls, directory: Path, spec: dict) -> Tokenizer: ...


_REGISTRY: dict[str, type] = {}


def register_tokenizer(kind: str, cls: type) -> None:
    """Make `load_tokenizer` understand specs with {"kind": kind}."""
    _REGISTRY[kind] = cls


def load_tokenizer(directory: str | Path, spec: dict) -> Tokenizer:
    kind = spec.get("kind") if isinstance(spec, dict) else None
    if kind not in _REGISTRY:
        raise ValueError(f"unknown tokenizer kind {kind!r} in spec {spec!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[kind].load(Path(directory), spec)


class SentencePieceTokenizer:
    """A sentencepiece model (unigram or BPE) whose special ids agree with `ModelConfig`."""

    kind: ClassVar[str] = "sentencepiece"

    def __init__(self, model_proto: bytes) -> None:
        self.proto = bytes(model_proto)
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(self.proto)
        except Exception as exc:  # sentencepiece raises RuntimeError/OSError with a C++ message
            raise ValueError(f"not a valid sentencepiece model ({len(self.proto)} bytes): {exc}") from None
        self.vocab_size = self.sp.get_piece_size()
        self.pad_id = self.sp.pad_id()
        self.bos_id = self.sp.bos_id()
        self.eos_id = self.sp.eos_id()
        self.unk_id = self.sp.unk_id()
        self._skip = {i for i in (self.pad_id, self.bos_id, self.eos_id) if i >= 0}

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def train(
        cls,
        input_files: str | Path | Sequence[str | Path] | None = None,
        *,
        vocab_size: int,
        model_type: str = "unigram",
        character_coverage: float = 1.0,
        byte_fallback: bool = True,
        sentences: Iterable[str] | None = None,
        max_sentences: int = 0,
        num_threads: int | None = None,
        **options: Any,
    ) -> SentencePieceTokenizer:
        """Train in memory on text files (one sentence a line) and/or an iterable of sentences.

        Special ids are pad 0, bos 1, eos 2, unk 3. `byte_fallback` maps unseen characters to
        UTF-8 byte pieces (needs vocab_size > 259); without it they become unk. Deterministic:
        every sentence is used unless `max_sentences` > 0, and then the first ones are taken.
        `hard_vocab_limit=False` is passed so a tiny corpus gives a smaller vocab, not an error.
        """
        if model_type not in ("unigram", "bpe", "char", "word"):
            raise ValueError(f"model_type must be unigram, bpe, char or word, got {model_type!r}")
        if vocab_size < 8:
            raise ValueError(f"vocab_size ({vocab_size}) is too small")
        if byte_fallback and vocab_size < 4 + 256 + 1:
            raise ValueError(f"byte_fallback needs vocab_size > 260 (4 specials + 256 bytes), got {vocab_size}")
        files = [] if input_files is None else [input_files] if isinstance(input_files, (str, Path)) else input_files
        lines = _read_sentences([Path(f) for f in files], sentences, max_sentences)
        if not lines:
            raise ValueError("no sentences to train the sentencepiece model on")
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            byte_fallback=byte_fallback,
            pad_id=0, bos_id=1, eos_id=2, unk_id=3,
            hard_vocab_limit=False,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            num_threads=num_threads or min(4, os.cpu_count() or 1),
            minloglevel=2,
            **options,
        )
        return cls(model.getvalue())

    @classmethod
    def from_file(cls, path: str | Path) -> SentencePieceTokenizer:
        path = Path(path)
        try:
            return cls(path.read_bytes())
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    # -- the protocol -----------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Many sentences at once (sentencepiece's C++ loop; much faster than a Python loop)."""
        return self.sp.encode(list(texts))

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        return self.sp.decode([i for i in ids if i not in self._skip])

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.sp.id_to_piece(int(i)) for i in ids]

    def save(self, directory: str | Path, name: str) -> dict:
        file = f"{name}.spm.model"
        (Path(directory) / file).write_bytes(self.proto)
        return {"kind": self.kind, "file": file, "vocab_size": self.vocab_size}

    @classmethod
    def load(cls, directory: str | Path, spec: dict) -> SentencePieceTokenizer:
        if "file" not in spec:
            raise ValueError(f"sentencepiece spec {spec!r} has no 'file'")
        tok = cls.from_file(Path(directory) / spec["file"])
        if "vocab_size" in spec and spec["vocab_size"] != tok.vocab_size:
            raise ValueError(f"{spec['file']}: vocab_size {tok.vocab_size} != {spec['vocab_size']} in its spec")
        return tok

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer(vocab_size={self.vocab_size})"


# imported checkpoints keep their toolkit's tokenizer (Marian's spm+vocab, Moses+BPE): known here, so a
# saved imported checkpoint loads without the importers
register_tokenizer(SentencePieceTokenizer.kind, SentencePieceTokenizer)
register_tokenizer(SpmVocabTokenizer.kind, SpmVocabTokenizer)
register_tokenizer(MosesBPETokenizer.kind, MosesBPETokenizer)


def check_special_ids(tokenizer: Tokenizer, cfg: Any, side: str) -> None:
    """Raise unless the tokenizer's vocabulary and special ids fit the model config on `side`."""
    vocab = cfg.src_vocab if side == "src" else cfg.tgt_vocab
    if tokenizer.vocab_size > vocab:
        raise ValueError(f"{side} tokenizer has {tokenizer.vocab_size} ids but the model's {side}_vocab is {vocab}")
    for key in ("pad_id", "bos_id", "eos_id", "unk_id"):
        if getattr(tokenizer, key) != getattr(cfg, key):
            raise ValueError(
                f"{side} tokenizer {key}={getattr(tokenizer, key)} disagrees with the model config's "
                f"{key}={getattr(cfg, key)}"
            )


def _read_sentences(files: list[Path], sentences: Iterable[str] | None, limit: int) -> list[str]:
    out: list[str] = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            out.extend(line.rstrip("\n") for line in fh)
    if sentences is not None:
        out.extend(sentences)
    out = [s for s in out if s.strip()]
    return out[:limit] if limit > 0 else out

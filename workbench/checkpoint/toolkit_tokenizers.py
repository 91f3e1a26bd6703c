"""Tokenizers of imported models, done the original toolkit's way, behind the workbench protocol.

- `SpmVocabTokenizer` ("spm_vocab"): sentencepiece splits text into pieces, and the model's own
  vocabulary (Marian's vocab.json, OpenNMT-py's token list) maps pieces to ids. Marian's
  `>>xx<<` target-language prefix is split off first and looked up whole, as MarianTokenizer does.
- `MosesBPETokenizer` ("moses_bpe"): Moses normalisation/tokenisation (sacremoses) then BPE merges
  (the subword-nmt / fastBPE algorithm with `</w>` word ends). Vocabulary tokens are either FSMT's
  ("lo</w>" ends a word) or fairseq's ("hel@@" continues one).

They sit beside `workbench.checkpoint.tokenizer`, below the importers, because a saved imported checkpoint
loads with them and must not need the importers; `workbench.importers.tokenizers` builds them from
each toolkit's files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import sentencepiece as spm


class SpmVocabTokenizer:
    kind: ClassVar[str] = "spm_vocab"

    def __init__(self, model_proto: bytes, vocab: Sequence[str], *, unk: str, pad: str, eos: str, bos: str | None,
                 lang_codes: bool = False, decode_proto: bytes | None = None, skip_unk: bool = False) -> None:
        self.proto = bytes(model_proto)
        self.decode_proto = None if decode_proto is None else bytes(decode_proto)
        self.sp = _spm(self.proto)
        self.sp_decode = self.sp if decode_proto is None else _spm(self.decode_proto)
        self.vocab = list(vocab)
        self.index = {t: i for i, t in enumerate(self.vocab)}
        self.tokens = {"unk": unk, "pad": pad, "eos": eos, "bos": bos}
        for role, tok in self.tokens.items():
            if tok is not None and tok not in self.index:
                raise ValueError(f"{role} token {tok!r} is not in the vocabulary")
        self.vocab_size = len(self.vocab)
        self.unk_id = self.index[unk]
        self.pad_id = self.index[pad]
        self.eos_id = self.index[eos]
        self.bos_id = self.index[bos] if bos is not None else self.pad_id
        self.lang_codes = lang_codes
        self.skip_unk = skip_unk  # MarianTokenizer.decode(skip_special_tokens=True) drops <unk> too
        self._skip = {self.pad_id, self.eos_id, self.bos_id} | ({self.unk_id} if skip_unk else set())

    def encode(self, text: str) -> list[int]:
        code: list[str] = []
        if self.lang_codes and text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        pieces = code + self.sp.encode(text, out_type=str)
        return [self.index.get(p, self.unk_id) for p in pieces]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of output ids, as MarianTokenizer decodes: the decoding sentencepiece model joins the pieces, and
        a word marker it leaves (a piece of a shared vocabulary only the *other* side's model knows, kept
        verbatim) becomes a space."""
        pieces = [self.vocab[i] for i in ids if i not in self._skip and 0 <= i < self.vocab_size]
        pieces = [p for p in pieces if not (self.lang_codes and p.startswith(">>") and p.endswith("<<"))]
        return self.sp_decode.decode_pieces(pieces).replace("\u2581", " ").strip()

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.vocab[i] if 0 <= i < self.vocab_size else "<?>" for i in ids]

    def save(self, directory: str | Path, name: str) -> dict[str, Any]:
        directory = Path(directory)
        (directory / f"{name}.spm").write_bytes(self.proto)
        (directory / f"{name}.vocab.json").write_text(json.dumps(self.vocab, ensure_ascii=False), encoding="utf-8")
        spec = {"kind": self.kind, "model": f"{name}.spm", "vocab": f"{name}.vocab.json",
                "tokens": self.tokens, "lang_codes": self.lang_codes, "skip_unk": self.skip_unk}
        if self.decode_proto is not None:
            (directory / f"{name}.decode.spm").write_bytes(self.decode_proto)
            spec["decode_model"] = f"{name}.decode.spm"
        return spec

    @classmethod
    def load(cls, directory: str | Path, spec: dict[str, Any]) -> SpmVocabTokenizer:
        directory = Path(directory)
        dec = spec.get("decode_model")
        return cls((directory / spec["model"]).read_bytes(), read_json(directory / spec["vocab"]),
                   **spec["tokens"], lang_codes=spec.get("lang_codes", False), skip_unk=spec.get("skip_unk", False),
                   decode_proto=(directory / dec).read_bytes() if dec else None)

    def __repr__(self) -> str:
        return f"SpmVocabTokenizer(vocab_size={self.vocab_size}, lang_codes={self.lang_codes})"


def _spm(proto: bytes) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(proto)
    except Exception as exc:  # sentencepiece raises RuntimeError/OSError with a C++ message
        raise ValueError(f"not a valid sentencepiece model ({len(proto)} bytes): {exc}") from None
    return sp


class MosesBPETokenizer:
    kind: ClassVar[str] = "moses_bpe"

    def __init__(self, *, lang: str, vocab: Sequence[str], merges: Sequence[tuple[str, str]], style: str,
                 specials: dict[str, str] | None = None, normalize: bool = True, lowercase: bool = False,
                 skip_unk: bool | None = None) -> None:
        if style not in ("fsmt", "fairseq"):
            raise ValueError(f"style must be 'fsmt' or 'fairseq', got {style!r}")
        try:
            import sacremoses
        except ImportError as exc:
            raise ImportError("Moses tokenization needs sacremoses: pip install 'attention-workbench[import]'") from exc
        self.lang, self.style, self.normalize, self.lowercase = lang, style, normalize, lowercase
        self.vocab = list(vocab)
        self.index = {t: i for i, t in enumerate(self.vocab)}
        self.merges = [tuple(m) for m in merges]
        self.ranks = {m: i for i, m in enumerate(self.merges)}
        self.specials = dict(specials or {"bos": "<s>", "pad": "<pad>", "eos": "</s>", "unk": "<unk>"})
        for role, tok in self.specials.items():
            if tok not in self.index:
                raise ValueError(f"{role} token {tok!r} is not in the vocabulary")
            setattr(self, f"{role}_id", self.index[tok])
        self.vocab_size = len(self.vocab)
        self._norm = sacremoses.MosesPunctNormalizer(lang=lang)
        self._tok = sacremoses.MosesTokenizer(lang=lang)
        self._detok = sacremoses.MosesDetokenizer(lang=lang)
        self._cache: dict[str, list[str]] = {}
        # FSMTTokenizer.decode(skip_special_tokens=True) drops <unk>; fairseq prints it
        self.skip_unk = style == "fsmt" if skip_unk is None else skip_unk
        self._skip = {self.bos_id, self.pad_id, self.eos_id}  # type: ignore[attr-defined]
        if self.skip_unk:
            self._skip.add(self.unk_id)  # type: ignore[attr-defined]

    # BPE over one word, exactly the loop of subword-nmt / FSMT's bpe(): merge the lowest-ranked pair
    def bpe(self, word: str) -> list[str]:
        if word in self._cache:
            return self._cache[word]
        parts = list(word[:-1]) + [word[-1] + "</w>"]
        while len(parts) > 1:
            pairs = {(a, b) for a, b in zip(parts, parts[1:])}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(parts):
                if i < len(parts) - 1 and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        self._cache[word] = parts
        return parts

    def _vocab_token(self, piece: str) -> str:
        if self.style == "fsmt":
            return piece
        return piece[: -len("</w>")] if piece.endswith("</w>") else piece + "@@"

    def tokens(self, text: str) -> list[str]:
        if self.lowercase:
            text = text.lower()
        if self.normalize:
            text = self._norm.normalize(text)
        words = self._tok.tokenize(text, aggressive_dash_splits=True, return_str=False, escape=True)
        return [self._vocab_token(p) for w in words if w for p in self.bpe(w)]

    def encode(self, text: str) -> list[int]:
        return [self.index.get(t, self.unk_id) for t in self.tokens(text)]  # type: ignore[attr-defined]

    def decode(self, ids: Sequence[int]) -> str:
        toks = [self.vocab[i] for i in ids if i not in self._skip and 0 <= i < self.vocab_size]
        if self.style == "fsmt":
            words = "".join(t.replace("</w>", " ") for t in toks).split()
        else:
            words = (" ".join(toks) + " ").replace("@@ ", "").split()
        return self._detok.detokenize(words)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.vocab[i] if 0 <= i < self.vocab_size else "<?>" for i in ids]

    def save(self, directory: str | Path, name: str) -> dict[str, Any]:
        data = {"vocab": self.vocab, "merges": [list(m) for m in self.merges]}
        (Path(directory) / f"{name}.bpe.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        return {"kind": self.kind, "file": f"{name}.bpe.json", "lang": self.lang, "style": self.style,
                "specials": self.specials, "normalize": self.normalize, "lowercase": self.lowercase,
                "skip_unk": self.skip_unk}

    @classmethod
    def load(cls, directory: str | Path, spec: dict[str, Any]) -> MosesBPETokenizer:
        data = read_json(Path(directory) / spec["file"])
        return cls(lang=spec["lang"], vocab=data["vocab"], merges=[tuple(m) for m in data["merges"]],
                   style=spec["style"], specials=spec["specials"], normalize=spec["normalize"],
                   lowercase=spec["lowercase"], skip_unk=spec.get("skip_unk"))

    def __repr__(self) -> str:
        return f"MosesBPETokenizer({self.style}, lang={self.lang}, vocab_size={self.vocab_size})"


def read_json(path: Path) -> Any:
    """A JSON file of a tokenizer or of an imported checkpoint; a missing or broken file is a one-line error."""
    if not path.is_file():
        raise FileNotFoundError(f"expected {path.name} in {path.parent}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None

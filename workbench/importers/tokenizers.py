"""Each toolkit's tokenizers, built from the files beside its checkpoint.

The tokenizer classes themselves (`SpmVocabTokenizer`, `MosesBPETokenizer`) live in
`workbench.checkpoint.toolkit_tokenizers`, below the importers, so a saved imported checkpoint loads without them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..checkpoint.toolkit_tokenizers import MosesBPETokenizer, SpmVocabTokenizer
from .errors import ConversionError
from .reading import read_json

__all__ = ["fairseq_dictionary", "fairseq_tokenizers", "fsmt_tokenizers", "marian_tokenizers", "opennmt_tokenizers"]


def _vocab_list(mapping: dict[str, int], what: str) -> list[str]:
    size = max(mapping.values()) + 1
    out = [""] * size
    for tok, i in mapping.items():
        out[i] = tok
    holes = [i for i, t in enumerate(out) if t == ""]
    if holes:
        raise ConversionError(f"{what} leaves ids {holes[:5]} without a token")
    return out


def marian_tokenizers(directory: Path, hf: dict[str, Any]) -> tuple[SpmVocabTokenizer, SpmVocabTokenizer]:
    """Source/target tokenizers of an opus-mt directory (source.spm, target.spm, vocab.json)."""
    vocab = _vocab_list(read_json(directory / "vocab.json"), "vocab.json")
    tgt_vocab = vocab
    if (directory / "target_vocab.json").is_file():
        tgt_vocab = _vocab_list(read_json(directory / "target_vocab.json"), "target_vocab.json")
    tokens = {"unk": "<unk>", "pad": "<pad>", "eos": "</s>", "bos": None}
    src_proto, tgt_proto = (directory / "source.spm").read_bytes(), (directory / "target.spm").read_bytes()
    multilingual = any(t.startswith(">>") and t.endswith("<<") for t in vocab)
    src = SpmVocabTokenizer(src_proto, vocab, **tokens, lang_codes=multilingual, skip_unk=True)
    tgt = SpmVocabTokenizer(tgt_proto, tgt_vocab, **tokens, lang_codes=multilingual, skip_unk=True)
    return src, tgt


def _merges(path: Path) -> list[tuple[str, str]]:
    """BPE merges from subword-nmt codes ("#version" header), fastBPE codes or FSMT merges.txt ("a b count")."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#version"):
            continue
        parts = line.split()
        if len(parts) < 2:
            raise ConversionError(f"{path}: bad merge line {line!r}")
        out.append((parts[0], parts[1]))
    return out


def fsmt_tokenizers(directory: Path, hf: dict[str, Any]) -> tuple[MosesBPETokenizer, MosesBPETokenizer]:
    langs = list(hf.get("langs", ["en", "de"]))
    merges = _merges(directory / "merges.txt")
    src_vocab = _vocab_list(read_json(directory / "vocab-src.json"), "vocab-src.json")
    tgt_vocab = _vocab_list(read_json(directory / "vocab-tgt.json"), "vocab-tgt.json")
    lower = bool(read_json(directory / "tokenizer_config.json").get("do_lower_case", False)) if (
        directory / "tokenizer_config.json").is_file() else False
    return (MosesBPETokenizer(lang=langs[0], vocab=src_vocab, merges=merges, style="fsmt", lowercase=lower),
            MosesBPETokenizer(lang=langs[1], vocab=tgt_vocab, merges=merges, style="fsmt", lowercase=lower))


def fairseq_dictionary(path: Path) -> list[str]:
    """fairseq Dictionary order: <s> <pad> </s> <unk>, then one "token count" line each."""
    vocab = ["<s>", "<pad>", "</s>", "<unk>"]
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        token = line.rsplit(" ", 1)[0] if " " in line else line
        if token.endswith(" #fairseq:overwrite"):
            token = token[: -len(" #fairseq:overwrite")]
        if not token:
            raise ConversionError(f"{path}:{n}: empty token")
        vocab.append(token)
    return vocab


def fairseq_tokenizers(directory: Path, src_lang: str | None, tgt_lang: str | None):
    """Tokenizers from dict.{src,tgt}.txt and bpecodes (or code/codes) beside a fairseq model; None if absent."""
    codes = next((directory / n for n in ("bpecodes", "code", "codes", "bpe.codes") if (directory / n).is_file()), None)
    if not src_lang or not tgt_lang or codes is None:
        return None
    dicts = [directory / f"dict.{lang}.txt" for lang in (src_lang, tgt_lang)]
    if not all(d.is_file() for d in dicts):
        return None
    merges = _merges(codes)
    return tuple(MosesBPETokenizer(lang=lang, vocab=fairseq_dictionary(d), merges=merges, style="fairseq",
                                   normalize=False) for lang, d in zip((src_lang, tgt_lang), dicts))


def opennmt_tokenizers(where: Path, src_itos: list[str], tgt_itos: list[str], cfg: Any):
    """sentencepiece model(s) beside an OpenNMT-py checkpoint: one shared *.model, or source/target ones."""
    if where.is_file():
        models = [where]
    else:
        models = sorted(where.glob("*.model"))
    if not models:
        return None
    by_name = {p.stem: p for p in models}
    src_m = by_name.get("source", by_name.get("src", models[0]))
    tgt_m = by_name.get("target", by_name.get("tgt", src_m if len(models) == 1 else models[-1]))
    tokens = {"unk": "<unk>", "pad": "<blank>", "eos": "</s>", "bos": "<s>"}
    src_tokens = dict(tokens) if all(t in src_itos for t in tokens.values()) else {**tokens, "eos": "<blank>",
                                                                                     "bos": None}
    return (SpmVocabTokenizer(src_m.read_bytes(), src_itos, **src_tokens),
            SpmVocabTokenizer(tgt_m.read_bytes(), tgt_itos, **tokens))

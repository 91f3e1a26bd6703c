"""Sub-word pieces -> words, and attention merged to match.

Merging rule (the one BertViz's and Clark et al.'s "What does BERT look at?" use):
  * over KEY pieces we SUM: the weight a query puts on a word is the total it puts on its pieces;
  * over QUERY pieces we AVERAGE: a word's attention is the mean of its pieces' distributions.
Both keep every row a distribution, so a row that summed to 1 over pieces still sums to 1 over words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Scheme = Literal["auto", "sentencepiece", "bpe", "endword", "wordpiece", "none"]
SPM_SPACE = "\u2581"  # "▁", sentencepiece's word-start marker
SPECIALS = frozenset({"<s>", "</s>", "<pad>", "<unk>", "<bos>", "<eos>", "[CLS]", "[SEP]", "[PAD]", "<mask>"})


@dataclass(frozen=True)
class WordGroups:
    """Which pieces make each word: `words[w]` is spelled from pieces `groups[w]`."""

    pieces: tuple[str, ...]
    words: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...]

    @property
    def piece_to_word(self) -> np.ndarray:
        """(n_pieces,) int: the word each piece belongs to."""
        out = np.empty(len(self.pieces), dtype=np.int64)
        for w, group in enumerate(self.groups):
            out[list(group)] = w
        return out


def detect_scheme(pieces: Sequence[str]) -> Scheme:
    """Guess the sub-word convention from the pieces themselves."""
    if any(SPM_SPACE in p for p in pieces):
        return "sentencepiece"
    if any(p.endswith("@@") for p in pieces):
        return "bpe"
    if any(p.endswith("</w>") for p in pieces):
        return "endword"
    if any(p.startswith("##") and len(p) > 2 for p in pieces):
        return "wordpiece"
    return "none"


def word_groups(pieces: Sequence[str], scheme: Scheme = "auto") -> WordGroups:
    """Group pieces into words. Special tokens (`</s>`, `<pad>`, ...) are always words of their own.

    sentencepiece: a piece starting with "▁" starts a word; bpe (subword-nmt): "@@" at the end joins the
    next piece; endword (original BPE): "</w>" ends a word; wordpiece: "##" continues the previous word.
    """
    pieces = [str(p) for p in pieces]
    if scheme == "auto":
        scheme = detect_scheme(pieces)
    if scheme not in ("sentencepiece", "bpe", "endword", "wordpiece", "none"):
        raise ValueError(f"unknown sub-word scheme {scheme!r}; use auto, sentencepiece, bpe, endword, wordpiece, none")
    groups: list[list[int]] = []
    open_word = False  # may the next piece join the last group?
    for i, p in enumerate(pieces):
        special = p in SPECIALS
        if special or scheme == "none":
            starts = True
        elif scheme == "sentencepiece":
            starts = p.startswith(SPM_SPACE) or not open_word
        elif scheme == "wordpiece":
            starts = not (p.startswith("##") and open_word)
        else:  # bpe / endword: the previous piece decides
            starts = not open_word
        if starts:
            groups.append([i])
        else:
            groups[-1].append(i)
        if special:
            open_word = False
        elif scheme == "bpe":
            open_word = p.endswith("@@")
        elif scheme == "endword":
            open_word = not p.endswith("</w>")
        else:
            open_word = scheme != "none"
    words = tuple(_spell([pieces[i] for i in g], scheme) for g in groups)
    return WordGroups(tuple(pieces), words, tuple(tuple(g) for g in groups))


def _spell(parts: list[str], scheme: str) -> str:
    if scheme == "sentencepiece":
        text = "".join(parts).replace(SPM_SPACE, " ").strip()
    elif scheme == "bpe":
        text = "".join(p[:-2] if p.endswith("@@") else p for p in parts)
    elif scheme == "endword":
        text = "".join(p[:-4] if p.endswith("</w>") else p for p in parts)
    elif scheme == "wordpiece":
        text = "".join(p[2:] if k and p.startswith("##") else p for k, p in enumerate(parts))
    else:
        text = "".join(parts)
    return text or parts[0]


def sum_matrix(groups: WordGroups) -> np.ndarray:
    """(n_pieces, n_words) 0/1 matrix: `attn @ M` sums key pieces into words."""
    m = np.zeros((len(groups.pieces), len(groups.words)), dtype=np.float64)
    m[np.arange(len(groups.pieces)), groups.piece_to_word] = 1.0
    return m


def mean_matrix(groups: WordGroups) -> np.ndarray:
    """(n_words, n_pieces) averaging matrix: `M @ attn` averages query pieces into words."""
    m = sum_matrix(groups).T
    return m / m.sum(axis=1, keepdims=True)


def merge_attention(
    attn: np.ndarray, queries: WordGroups | None, keys: WordGroups | None
) -> np.ndarray:
    """(..., Lq, Lk) piece attention -> (..., Wq, Wk): sum over key pieces, mean over query pieces.

    Pass None for a side to keep its pieces (e.g. words on the source only).
    """
    attn = np.asarray(attn, dtype=np.float64)
    if keys is not None:
        if attn.shape[-1] != len(keys.pieces):
            raise ValueError(f"attention has {attn.shape[-1]} keys but {len(keys.pieces)} key pieces were given")
        attn = attn @ sum_matrix(keys)
    if queries is not None:
        if attn.shape[-2] != len(queries.pieces):
            raise ValueError(
                f"attention has {attn.shape[-2]} queries but {len(queries.pieces)} query pieces were given"
            )
        attn = mean_matrix(queries) @ attn
    return attn


def merge_mask(masked: np.ndarray, queries: WordGroups | None, keys: WordGroups | None) -> np.ndarray:
    """A word cell is masked only when every piece cell under it is masked."""
    allowed = merge_attention((~np.asarray(masked, dtype=bool)).astype(np.float64), queries, keys)
    return allowed == 0

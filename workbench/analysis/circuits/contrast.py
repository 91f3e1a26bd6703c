"""Clean/corrupted sentence pairs for patching: swap one source noun, keep every length.

    pairs = noun_swaps(tm, sentences)          # a German noun (else an English one) swapped, one piece for another
    p = pairs[0]
    p.src, p.corrupted_src, p.tgt            # (1, S), (1, S), (1, T): the clean greedy output, teacher-forced
    p.position, p.good, p.bad                # the first output position where the two translations differ,
                                             # and the clean and corrupted tokens there (a logit difference)

Only swaps that change the translation are kept: the question "which heads carry the noun into the output"
needs an output token that depends on it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...core.batching import decoder_input

NOUNS = ("Mann", "Frau", "Hund", "Kind", "Junge", "Mädchen", "Auto", "Ball", "Haus", "Straße", "Pferd", "Katze",
         "Wasser", "Fahrrad", "Strand", "Gitarre", "Boot", "Baum", "Hut", "Buch")
NOUNS_EN = ("man", "woman", "dog", "child", "boy", "girl", "animal", "car", "ball", "house", "street", "horse", "cat",
            "water", "bike", "beach", "guitar", "boat", "tree", "hat", "book", "bird", "city", "table", "field", "park",
            "men", "women", "people", "children", "boys", "girls", "dogs", "football", "game", "shirt", "road", "river")
"""English nouns (lower case, as they stand mid-sentence) for English sources; tried after the German list."""


@dataclass
class ContrastPair:
    src: torch.Tensor  # (1, S) clean source ids (EOS-terminated)
    corrupted_src: torch.Tensor  # (1, S)
    tgt: torch.Tensor  # (1, T) decoder input: start + the clean greedy output without its EOS
    position: int  # decoder position whose next token differs between the two outputs
    good: int  # the clean output's token there
    bad: int  # the corrupted output's token there
    swapped: int  # source position of the swapped noun
    text: str
    corrupted_text: str
    output: str
    corrupted_output: str


def _one_piece(tm, word: str) -> int | None:
    ids = tm.src_tokenizer.encode(word)
    return ids[0] if len(ids) == 1 else None


def noun_swaps(tm, sentences: Sequence[str], nouns: Sequence[str] | None = None, max_pairs: int | None = None,
               max_len: int = 60) -> list[ContrastPair]:
    """For each sentence, swap its first noun from `nouns` for the next one in the list that changes the greedy
    translation (lengths are unchanged: both are single pieces). Default: the German list (NOUNS), and for a
    sentence with none of those, the English one (NOUNS_EN)."""
    lists = [nouns] if nouns is not None else [NOUNS, NOUNS_EN]
    vocab = [[i for w in words if (i := _one_piece(tm, w)) is not None] for words in lists]
    vocab = [list(dict.fromkeys(ids)) for ids in vocab]  # two words may share a piece
    cfg = tm.model.cfg
    pairs: list[ContrastPair] = []
    for text in sentences:
        ids, _ = tm.encode_source(text)
        if not ids or len(ids) > max_len:
            continue
        found = next(((k, choices) for choices in vocab for k, t in enumerate(ids) if t in choices), None)
        if found is None:
            continue
        hit, choices = found
        swaps = []
        for wid in choices:
            if wid == ids[hit]:
                continue
            swapped = ids[:hit] + [wid] + ids[hit + 1:]
            c_text = tm.src_tokenizer.decode(swapped[:-1] if swapped[-1] == cfg.eos_id else swapped)
            if tm.encode_source(c_text)[0] == swapped:  # keep pairs exact: the text re-encodes to the ids
                swaps.append((swapped, c_text))
        outs = tm.translate([text] + [c for _, c in swaps], return_tokens=True, beam=1)  # one batch
        a = list(outs[0].tokens)
        for (swapped, c_text), corr in zip(swaps, outs[1:]):
            b = list(corr.tokens)
            diff = next((t for t in range(min(len(a), len(b))) if a[t] != b[t]), None)
            if diff is None:
                continue
            dev = tm.model.device
            pairs.append(ContrastPair(
                src=torch.tensor([ids], device=dev), corrupted_src=torch.tensor([swapped], device=dev),
                tgt=torch.tensor([decoder_input(a, cfg.start_id)], device=dev), position=diff, good=a[diff],
                bad=b[diff],
                swapped=hit, text=text, corrupted_text=c_text, output=outs[0].text, corrupted_output=corr.text))
            break
        if max_pairs is not None and len(pairs) >= max_pairs:
            break
    return pairs


def _phrases(dets: Sequence[str], pairs: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((f"{d} {a}", f"{d} {b}") for d in dets for a, b in pairs)


GENDER_EN = _phrases(("A", "a", "The", "the"), (("man", "woman"), ("boy", "girl"), ("dog", "cat"), ("men", "women"),
                                               ("father", "mother"), ("gentleman", "lady"), ("guy", "woman")))
"""English subject swaps whose German translation changes the article's gender (Ein/Eine, Der/Die, einen/eine):
gender agreement, for an English-to-German model."""

NUMBER_EN = _phrases(("The", "the"), (("man", "men"), ("woman", "women"), ("dog", "dogs"), ("boy", "boys"),
                                      ("girl", "girls"), ("child", "children"), ("person", "people"), ("car", "cars")))
"""English singular/plural swaps after "the", whose German article changes with number (der/die, dem/den):
number agreement, for an English-to-German model."""

NUMBER_DE = tuple((f"{d} {a}", f"{p} {b}") for cap in (True, False) for d, a, p, b in (
    ("Der", "Mann", "Die", "Männer"), ("Der", "Hund", "Die", "Hunde"), ("Der", "Junge", "Die", "Jungen"),
    ("Die", "Frau", "Die", "Frauen"), ("Das", "Kind", "Die", "Kinder"), ("Das", "Mädchen", "Die", "Mädchen"))
    for d, p in [(d, p) if cap else (d.lower(), p.lower())])
"""German singular/plural subjects (article and noun; the English output's noun and verb change number), for a
German-to-English model."""


def word_swaps(tm, sentences: Sequence[str], swaps: Sequence[tuple[str, str]], max_pairs: int | None = None,
               max_len: int = 60, chunk: int = 64) -> list[ContrastPair]:
    """For each sentence, the first phrase of `swaps` (either side, whole words) it contains is replaced by its
    partner; the pair is kept when both sources have the same number of pieces and the greedy translations
    differ. `position`/`good`/`bad`: the first output position where they differ and the two tokens there."""
    both = [(a, b) for a, b in swaps if a != b] + [(b, a) for a, b in swaps if a != b]
    pats = [(re.compile(rf"(?<!\w){re.escape(a)}(?!\w)"), a, b) for a, b in both]
    cfg = tm.model.cfg
    cands = []
    for text in sentences:
        hit = next(((m, b) for pat, _, b in pats if (m := pat.search(text))), None)
        if hit is None:
            continue
        m, repl = hit
        c_text = text[: m.start()] + repl + text[m.end():]
        ids, _ = tm.encode_source(text)
        c_ids, _ = tm.encode_source(c_text)
        if len(ids) == len(c_ids) and len(ids) <= max_len and ids != c_ids:
            cands.append((text, c_text, ids, c_ids))
    pairs: list[ContrastPair] = []
    dev = tm.model.device
    for start in range(0, len(cands), chunk):
        part = cands[start: start + chunk]
        outs = tm.translate([t for c in part for t in c[:2]], return_tokens=True, beam=1)
        for k, (text, c_text, ids, c_ids) in enumerate(part):
            a, b = list(outs[2 * k].tokens), list(outs[2 * k + 1].tokens)
            diff = next((t for t in range(min(len(a), len(b))) if a[t] != b[t]), None)
            if diff is None:
                continue
            swapped = next(j for j in range(len(ids)) if ids[j] != c_ids[j])
            pairs.append(ContrastPair(
                src=torch.tensor([ids], device=dev), corrupted_src=torch.tensor([c_ids], device=dev),
                tgt=torch.tensor([decoder_input(a, cfg.start_id)], device=dev), position=diff, good=a[diff],
                bad=b[diff],
                swapped=swapped, text=text, corrupted_text=c_text, output=outs[2 * k].text,
                corrupted_output=outs[2 * k + 1].text))
            if max_pairs is not None and len(pairs) >= max_pairs:
                return pairs
    return pairs

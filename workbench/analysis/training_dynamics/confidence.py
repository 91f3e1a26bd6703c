"""How confident a trained model is in the reference word, next to what its label smoothing asked for.

Label smoothing (Szegedy et al. 2016; the paper's ε_ls = 0.1) trains against a target that keeps 1 - ε + ε/V on
the reference token and spreads ε over the vocabulary, so the loss is lowest when the model's probability of
the reference is exactly that mass (`smoothed_gold_mass`), not 1. `gold_confidence` measures where a trained
model really puts it, token by token, teacher-forced on held-out text: the probability of the reference token
and the probability of the model's own top choice. A model trained with smoothing piles up just below the
smoothed mass and seldom above it; one trained without piles up at 1.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ...core.batching import corpus_batches
from ...core.model import evaluating
from ...corpus.data import MIXTURES, dataset_files, read_parallel


def smoothed_gold_mass(vocab: int, smoothing: float) -> float:
    """The probability the smoothed target gives the reference token: the loss-minimising confidence."""
    if vocab < 2 or not 0.0 <= smoothing < 1.0:
        raise ValueError(f"need vocab >= 2 and 0 <= smoothing < 1, got vocab {vocab}, smoothing {smoothing}")
    return 1.0 - smoothing + smoothing / vocab


@dataclass(frozen=True)
class Confidence:
    """Per target token (EOS included) of teacher-forced held-out text."""

    gold: np.ndarray
    """p(reference token | source, reference prefix)."""
    top: np.ndarray
    """The largest probability at that position (the model's own first choice)."""
    smoothing: float
    vocab: int
    sentences: int

    @property
    def optimum(self) -> float:
        return smoothed_gold_mass(self.vocab, self.smoothing)

    def share_above(self, p: float) -> float:
        """The share of tokens whose reference probability exceeds p."""
        return float((self.gold > p).mean()) if self.gold.size else float("nan")

    def summary(self) -> str:
        """One sentence for a caption: median confidence, and how often it exceeds the smoothed optimum."""
        if not self.gold.size:
            return "no tokens measured"
        return (f"{self.gold.size:,} tokens of {self.sentences} held-out sentences: median p(reference) "
                f"{np.median(self.gold):.2f}, {self.share_above(self.optimum):.1%} above the smoothed optimum "
                f"{self.optimum:.3f} (ε = {self.smoothing:g}); median top-1 probability {np.median(self.top):.2f}")


def gold_confidence(model, sources: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], *,
                    smoothing: float, batch_size: int = 32) -> Confidence:
    """Teacher-forced probabilities of each reference token (`outputs` end with EOS) and of the top choice.

    `smoothing` is the ε the model was trained with (recorded, and used for the optimum); the probabilities
    are the model's, in eval mode (no dropout), in fp32.
    """
    if len(sources) != len(outputs):
        raise ValueError(f"{len(sources)} sources but {len(outputs)} references")
    empty = [i for i, o in enumerate(outputs) if len(o) == 0]
    if empty:
        raise ValueError(f"outputs {empty[:5]} are empty: every output needs at least its EOS")
    cfg = model.cfg
    gold, top = [], []
    device = next(model.parameters()).device
    with evaluating(model), torch.no_grad():
        for _, batch in corpus_batches(sources, outputs, pad_id=cfg.pad_id, start_id=cfg.start_id,
                                       batch_size=batch_size, order=range(len(sources)), device=device):
            probs = model(batch.src, batch.tgt_in).float().softmax(-1)
            keep = torch.arange(batch.tgt_out.shape[1], device=device)[None, :] < batch.tgt_lengths[:, None]
            gold.append(probs.gather(-1, batch.tgt_out.unsqueeze(-1)).squeeze(-1)[keep].cpu())
            top.append(probs.amax(-1)[keep].cpu())
    as_array = lambda parts: torch.cat(parts).double().numpy() if parts else np.zeros(0)  # noqa: E731
    return Confidence(as_array(gold), as_array(top), float(smoothing), int(cfg.tgt_vocab), len(sources))


def held_out_text(train_config: dict | None, *, limit: int = 200) -> tuple[list[str], list[str], str]:
    """The first `limit` validation pairs of the data a checkpoint was trained on (its stored training config),
    read from the local data folder only (nothing downloads), and their name; ValueError when there are none."""
    if not train_config or not train_config.get("dataset"):
        raise ValueError("this checkpoint stores no training dataset (meta.json train_config), so it has no "
                         "held-out text to measure its confidence on")
    name, src_lang, tgt_lang = train_config["dataset"], train_config["src_lang"], train_config["tgt_lang"]
    parts = MIXTURES[name]["valid"] if name in MIXTURES else [(name, "valid")]
    sources: list[str] = []
    references: list[str] = []
    for part, split in parts:
        try:
            paths = dataset_files(part, split, src_lang, tgt_lang, train_config.get("data_root"), download=False)
        except (FileNotFoundError, ValueError):  # the message names no server path: it may reach a web page
            raise ValueError(f"no local validation text for {name} ({part} {split}) in the data folder "
                             "($WORKBENCH_DATA)") from None
        s, t = read_parallel(*paths, limit=limit - len(sources))
        sources += s
        references += t
        if len(sources) >= limit:
            break
    what = ", ".join(f"{part} {split}" for part, split in parts)
    return sources, references, what if name not in MIXTURES else f"{name} ({what})"


def checkpoint_confidence(tm, *, limit: int = 200) -> tuple[Confidence, str]:
    """`gold_confidence` of a `TranslationModel` on its own validation text, with the ε it was trained with."""
    config = tm.meta.get("train_config") or {}
    sources, references, name = held_out_text(config, limit=limit)
    eos, room = tm.model.cfg.eos_id, tm.model.cfg.max_positions - 1
    pairs = [(src, [*tm.tgt_tokenizer.encode(ref)[:room], eos])
             for src, ref in ((tm.encode_source(s)[0], r) for s, r in zip(sources, references)) if src and ref.strip()]
    smoothing = float(config.get("label_smoothing", 0.0))
    return gold_confidence(tm.model, [p[0] for p in pairs], [p[1] for p in pairs], smoothing=smoothing), name


# -- is this source what the model was trained on? ------------------------------------------------------------------
LANGUAGES = {"de": "German", "en": "English", "fr": "French", "ro": "Romanian", "es": "Spanish", "it": "Italian",
             "nl": "Dutch", "cs": "Czech", "ru": "Russian", "zh": "Chinese", "ja": "Japanese"}


@dataclass(frozen=True, eq=False)
class CharProfile:
    """Character 1-, 2- and 3-gram counts of one language's text: an interpolated character trigram model.

    Why hand-written: no language-identification library is among the project's dependencies (torch, panel, bokeh,
    altair, pandas, sentencepiece, sacrebleu, safetensors), and the app is offline by design, so the check is built
    from what a checkpoint already has, its validation text, in both of its languages (Cavnar & Trenkle 1994's
    n-gram profiles, scored as a likelihood rather than by rank distance). Trigrams seen once are dropped: about
    9-11 thousand entries per language for newstest2013, 3-4 thousand for Multi30k's validation captions."""

    counts: Mapping[str, int] = field(repr=False)
    """Counts of the character n-grams (n = 1, 2, 3) of the lines, each padded with a space on both sides."""
    chars: int
    lines: int

    WEIGHTS = (0.6, 0.3, 0.09, 0.01)
    """Interpolation of p(c | two before), p(c | one before), p(c), and a floor of 1/256 for unseen characters."""

    @classmethod
    def of(cls, lines: Sequence[str], *, min_count: int = 2) -> CharProfile:
        counts: Counter[str] = Counter()
        for line in lines:
            padded = f" {line} "
            for n in (1, 2, 3):
                counts.update(padded[i:i + n] for i in range(len(padded) - n + 1))
        chars = sum(v for k, v in counts.items() if len(k) == 1)
        return cls({k: v for k, v in counts.items() if len(k) < 3 or v >= min_count}, chars, len(lines))

    def log_likelihood(self, text: str) -> float:
        """log p(text) in nats: each character after the opening space given the two before it (cased)."""
        c, (w3, w2, w1, w0) = self.counts, self.WEIGHTS
        padded, total = f" {text} ", 0.0
        for i in range(1, len(padded)):
            one, two, ch = padded[i - 1], padded[max(0, i - 2):i], padded[i]
            p = w1 * c.get(ch, 0) / max(1, self.chars) + w0 / 256
            if c.get(one):
                p += w2 * c.get(one + ch, 0) / c[one]
            if len(two) == 2 and c.get(two):
                p += w3 * c.get(two + ch, 0) / c[two]
            total += math.log(p)
        return total


@dataclass(frozen=True, eq=False)
class LanguageCheck:
    """Does a source look like the model's target language rather than its source language (issue 37 point 5)?

    The rule (`looks_like_target`): with r = log p_target(x) - log p_source(x) over the n = len(x) + 1 predicted
    characters of the two `CharProfile`s, hint when r >= 3 nats (odds of 20 to 1), r / n >= 0.1 nats per character
    (so a long English news line with a few German names is not taken for German), and the text fits the target
    language about as well as real target text does: log p_target(x) / n at least `floor`, the 1st percentile of
    that figure on 200 validation lines kept out of the profiles, less 0.2 nats. The last condition keeps a third
    language (French, say: closer to English than to German in letters) out of the hint, which the model's
    confidence (`Familiarity.low`) covers instead.

    Measured on text not used for the profiles, the first 200 lines (the whole set in brackets), short lines
    counted: general-en-de (profiles from newstest2013), on newstest2014: English sources hinted 0/200 (3/3003: lines
    full of German names, "Anke Gellert-Helpenstein"), their German side 199/200 (2990/3003; missed: "Eine Blackbox
    im Auto?"), French (NTREX) 0/200 (1/1997); multi30k-de-en (profiles from its validation captions), on test2016:
    German sources 0/200 (0/1000), their English side 200/200 (988/1000), French 2/200 (6/1000)."""

    source: CharProfile
    target: CharProfile
    floor: float
    """Least log p_target(x) / n (nats per character) for the hint: see the class docstring."""

    MARGIN = 3.0
    MARGIN_PER_CHAR = 0.1
    SLACK = 0.2
    CALIBRATION = 200

    @classmethod
    def of(cls, sources: Sequence[str], targets: Sequence[str]) -> LanguageCheck | None:
        """From validation pairs: the first `CALIBRATION` target lines set `floor`, the rest make the profiles; None
        when there are too few lines for either."""
        sources, targets = [s for s in sources if s.strip()], [t for t in targets if t.strip()]
        if min(len(sources), len(targets)) < cls.CALIBRATION + 100:
            return None
        target = CharProfile.of(targets[cls.CALIBRATION:])
        fits = [target.log_likelihood(t) / (len(t) + 1) for t in targets[:cls.CALIBRATION]]
        return cls(CharProfile.of(sources[cls.CALIBRATION:]), target, float(np.percentile(fits, 1)) - cls.SLACK)

    def scores(self, text: str) -> tuple[float, float]:
        """(r, log p_target(x) / n): the log-likelihood ratio in nats, and the target fit per character."""
        target, n = self.target.log_likelihood(text), len(text) + 1
        return target - self.source.log_likelihood(text), target / n

    def looks_like_target(self, text: str) -> bool:
        text = text.strip()
        if not text:
            return False
        ratio, fit = self.scores(text)
        return ratio >= self.MARGIN and ratio / (len(text) + 1) >= self.MARGIN_PER_CHAR and fit >= self.floor


@dataclass(frozen=True)
class Familiarity:
    """How sure a model is of its own greedy outputs on its validation text: the yardstick for `source_hints`.

    A source in another language, or far from the training text, gets outputs the model itself is unsure of:
    on the shipped de->en Multi30k model, its validation sentences score -0.36 mean log p per output piece
    (median; 5th percentile -0.68), an English source -1.26, a French one -1.86 (docs/app.md). A source in the
    model's target language is also named as such (`languages`), since a model can be sure of a wrong translation
    of it (general-en-de turns "Das ist gut." into "Das Zufall nicht." without doubt)."""

    low: float
    """5th percentile of the mean log-probability per output piece, over the validation sentences."""
    median: float
    sentences: int
    src_lang: str | None = None
    tgt_lang: str | None = None
    languages: LanguageCheck | None = field(default=None, repr=False)
    """Character profiles of its two languages, from the same validation text (None: too little of it)."""


def familiarity(tm, *, limit: int = 40, profile_lines: int = 3000) -> Familiarity:
    """`Familiarity` from greedy translations of the first `limit` sentences of the checkpoint's validation text, and
    its `LanguageCheck` from up to `profile_lines` pairs of it (both sides: 0.5 s for newstest2013's 3,000)."""
    config = tm.meta.get("train_config") or {}
    sources, references, _ = held_out_text(config, limit=max(limit, profile_lines))
    outputs = tm.translate(sources[:limit], beam=1, return_scores=True)
    per_piece = np.array([o.log_prob / max(1, len(o.tokens)) for o in outputs if o.tokens])
    if per_piece.size < 10:
        raise ValueError(f"only {per_piece.size} validation sentences were translated: too few to calibrate")
    return Familiarity(float(np.percentile(per_piece, 5)), float(np.median(per_piece)), int(per_piece.size),
                       config.get("src_lang"), config.get("tgt_lang"), LanguageCheck.of(sources, references))


def lacks(text: str) -> str | None:
    """What a non-empty source lacks for a model to translate it: "letters or digits" (emoji, punctuation, symbols
    only), "letters" (numbers only), or None (it has words, or it is empty). The one home of this rule: the app
    hints at both (`source_hints`), `workbench translate` warns at the first only, since a test file's numbers-only
    lines ("2 : 1") translate fine by copying."""
    if not text.strip() or any(ch.isalpha() for ch in text):
        return None
    return "letters" if any(ch.isdigit() for ch in text) else "letters or digits"


def source_hints(text: str, mean_log_prob: float | None, known: Familiarity | None) -> list[str]:
    """One-line hints about a source the model is likely to mistranslate: no words at all; words of the model's
    target language (`LanguageCheck.looks_like_target`, said whether or not the model is sure of its output); or an
    output the model is less sure of than of 95 % of its own validation outputs (`mean_log_prob`: per output piece;
    None when the output was given, not decoded)."""
    missing = lacks(text)
    if missing == "letters":
        return ["The source has no words, only numbers: there is nothing to translate, and the output below is "
                "at best the numbers copied."]
    if missing:
        return ["The source has no words (no letters), so the model has nothing to translate: the output below "
                "is what it makes of the pieces, and means nothing."]
    if known is None:
        return []
    src = LANGUAGES.get(known.src_lang or "", known.src_lang)
    tgt = LANGUAGES.get(known.tgt_lang or "", known.tgt_lang)
    if known.languages is not None and src and tgt and known.languages.looks_like_target(text):
        return [f"This looks like {tgt}: this model translates {src} into {tgt} and reads any source as {src}, so the "
                f"output below is {tgt} misread as {src}. Type {src} to get {tgt}."]
    if mean_log_prob is None or mean_log_prob >= known.low:
        return []
    which = f"This model translates {src} into {tgt}: is the source {src}, and like the text it was trained on? " \
        if src and tgt else "Is the source in the model's source language, and like the text it was trained on? "
    mine, low = math.exp(mean_log_prob), math.exp(known.low)
    digits = next((d for d in range(2, 6) if f"{mine:.{d}f}" != f"{low:.{d}f}"), 6)  # never "0.04 ... than 0.04"
    return [f"The model is unsure of this output: {mine:.{digits}f} mean probability per piece, where "
            f"95 % of its own validation translations get more than {low:.{digits}f}. " + which.strip()]

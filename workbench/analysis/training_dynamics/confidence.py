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
from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Familiarity:
    """How sure a model is of its own greedy outputs on its validation text: the yardstick for `source_hints`.

    A source in another language, or far from the training text, gets outputs the model itself is unsure of:
    on the shipped de->en Multi30k model, its validation sentences score -0.36 mean log p per output piece
    (median; 5th percentile -0.68), an English source -1.26, a French one -1.86 (docs/app.md)."""

    low: float
    """5th percentile of the mean log-probability per output piece, over the validation sentences."""
    median: float
    sentences: int
    src_lang: str | None = None
    tgt_lang: str | None = None


def familiarity(tm, *, limit: int = 40) -> Familiarity:
    """`Familiarity` from greedy translations of the first `limit` sentences of the checkpoint's validation text."""
    config = tm.meta.get("train_config") or {}
    sources, _, _ = held_out_text(config, limit=limit)
    outputs = tm.translate(sources, beam=1, return_scores=True)
    per_piece = np.array([o.log_prob / max(1, len(o.tokens)) for o in outputs if o.tokens])
    if per_piece.size < 10:
        raise ValueError(f"only {per_piece.size} validation sentences were translated: too few to calibrate")
    return Familiarity(float(np.percentile(per_piece, 5)), float(np.median(per_piece)), int(per_piece.size),
                       config.get("src_lang"), config.get("tgt_lang"))


def lacks(text: str) -> str | None:
    """What a non-empty source lacks for a model to translate it: "letters or digits" (emoji, punctuation, symbols
    only), "letters" (numbers only), or None (it has words, or it is empty). The one home of this rule: the app
    hints at both (`source_hints`), `workbench translate` warns at the first only, since a test file's numbers-only
    lines ("2 : 1") translate fine by copying."""
    if not text.strip() or any(ch.isalpha() for ch in text):
        return None
    return "letters" if any(ch.isdigit() for ch in text) else "letters or digits"


def source_hints(text: str, mean_log_prob: float | None, known: Familiarity | None) -> list[str]:
    """One-line hints about a source the model is likely to mistranslate: no words at all, or an output the model
    is less sure of than of 95 % of its own validation outputs (`mean_log_prob`: per output piece; None when
    the output was given, not decoded)."""
    if lacks(text):
        return ["The source has no words (no letters), so the model has nothing to translate: the output below "
                "is what it makes of the pieces, and means nothing."]
    if known is None or mean_log_prob is None or mean_log_prob >= known.low:
        return []
    src = LANGUAGES.get(known.src_lang or "", known.src_lang)
    tgt = LANGUAGES.get(known.tgt_lang or "", known.tgt_lang)
    which = f"This model translates {src} into {tgt}: is the source {src}, and like the text it was trained on? " \
        if src and tgt else "Is the source in the model's source language, and like the text it was trained on? "
    mine, low = math.exp(mean_log_prob), math.exp(known.low)
    digits = next((d for d in range(2, 6) if f"{mine:.{d}f}" != f"{low:.{d}f}"), 6)  # never "0.04 ... than 0.04"
    return [f"The model is unsure of this output: {mine:.{digits}f} mean probability per piece, where "
            f"95 % of its own validation translations get more than {low:.{digits}f}. " + which.strip()]

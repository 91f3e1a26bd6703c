"""Does steering a feature move translations the way its meaning predicts, more than steering random features?

    f = selective_feature(tm, d, corpus_sources, {"frau", "frauen", "mädchen"})   # a "woman" feature of hook_memory
    male = [s for s in test_sources if re.search(r"\\b(Mann|Männer|Junge)\\b", s)]
    r = steering_effect(tm, d, f, male, 0.3, toward=FEMALE, away=MALE, controls=8)
    r.toward, r.control_toward, r.examples          # shares of sentences, and (source, plain, steered) triples

A translation moves in the predicted direction when its steered version holds more `toward` words minus `away`
words than the plain one (words: lower-cased letter runs, so "Woman," counts as "woman"). The control steers
`controls` other features of the same dictionary, drawn at random (seeded), each with the edit scaled by the ratio
of decoder norms ‖W_dec[f]‖ / ‖W_dec[g]‖, so that every steer writes a vector of the same norm at each position
(a TopK dictionary keeps unit decoder rows: the same value). The figure to read is `toward` beside
`control_toward`: a steer that moves 60 % of translations toward "woman" while random features of the same norm
move 2 % says the feature, not the size of the push, did it. `changed` beside `control_changed` says how much of
the output any push of that size disturbs.

The steering is `TranslationModel.translate(steer=...)` with the dictionary spliced in (`features.splice`): a
clamp or an addition at every position, in greedy or beam search with the KV cache.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from ..core.splice import FeatureEdit
from ..decoding.translator import TranslationModel
from .dictionary import SparseDictionary
from .sites import capture_site, site_of, splice

FEMALE = frozenset({"woman", "women", "girl", "girls", "lady", "ladies", "she", "her", "hers", "female", "mother",
                    "daughter", "sister", "wife", "bride"})
MALE = frozenset({"man", "men", "boy", "boys", "gentleman", "gentlemen", "he", "him", "his", "male", "father", "son",
                  "brother", "husband", "groom", "guy", "guys"})
_WORD = re.compile(r"[^\W\d_]+")


@dataclass
class SteeringEffect:
    site: str
    feature: int
    edit: str
    sentences: int
    changed: float
    """Share of translations the steer changed."""
    toward: float
    """Share that moved in the predicted direction (more `toward` words minus `away` words)."""
    control_features: list[int] = field(default_factory=list)
    control_changed: list[float] = field(default_factory=list)
    control_toward: list[float] = field(default_factory=list)
    """Per control feature (same decoder norm x edit), the same two shares."""
    examples: list[tuple[str, str, str]] = field(default_factory=list)
    """(source, plain, steered) of translations that moved toward, first ones first."""

    @property
    def control_toward_mean(self) -> float:
        return sum(self.control_toward) / len(self.control_toward) if self.control_toward else float("nan")

    @property
    def control_changed_mean(self) -> float:
        return sum(self.control_changed) / len(self.control_changed) if self.control_changed else float("nan")

    def summary(self) -> str:
        return (f"{self.site} #{self.feature} {self.edit} on {self.sentences} sentences: {self.toward:.0%} moved "
                f"toward ({self.changed:.0%} changed); {len(self.control_features)} random features of the same norm: "
                f"{self.control_toward_mean:.0%} toward ({self.control_changed_mean:.0%} changed)")


def direction(text: str, toward: Iterable[str], away: Iterable[str] = ()) -> int:
    """Words of `toward` minus words of `away` in `text` (lower-cased letter runs)."""
    words = _WORD.findall(text.lower())
    toward, away = set(toward), set(away)
    return sum(w in toward for w in words) - sum(w in away for w in words)


def _shares(plain: Sequence[str], steered: Sequence[str], toward, away) -> tuple[float, float, list[int]]:
    moved = [i for i, (p, s) in enumerate(zip(plain, steered))
             if direction(s, toward, away) > direction(p, toward, away)]
    changed = sum(p != s for p, s in zip(plain, steered))
    return changed / len(plain), len(moved) / len(plain), moved


@torch.no_grad()
def selective_feature(tm: TranslationModel, dictionary: SparseDictionary, sources: Sequence[str],
                      words: Iterable[str]) -> int:
    """The feature of an encoder-side dictionary whose mean activation on source words of `words` (lower-cased,
    a word's pieces joined) most exceeds its mean on every other real source token of `sources`."""
    site = site_of(dictionary)
    if site.side != "src":
        raise ValueError(f"selective_feature reads source words; {site.name} is a decoder-side site")
    words = {w.lower() for w in words}
    b = tm.encode_batch(list(sources))
    start = torch.full((b.src.size(0), 1), tm.model.cfg.start_id, device=b.src.device)
    acts = dictionary.encode(capture_site(tm.model, b.src, start, site)[site.hook_in].float())  # (B, S, n)
    on = torch.zeros(b.src.shape, dtype=torch.bool, device=b.src.device)
    for i, n in enumerate(b.src_lengths.tolist()):
        ids = b.src[i, :n].tolist()
        pieces = tm.src_tokenizer.pieces(ids)
        j = 0
        while j < n:  # a word: a piece starting with "▁" and the pieces that continue it
            k = j + 1
            while k < n and not pieces[k].startswith("\u2581"):
                k += 1
            if "".join(pieces[j:k]).replace("\u2581", "").lower() in words:
                on[i, j:k] = True
            j = k
    if not bool(on.any()):
        raise ValueError(f"none of {sorted(words)} occurs in the {len(sources)} sources")
    real = torch.arange(b.src.size(1), device=b.src.device)[None, :] < b.src_lengths[:, None]
    return int((acts[on].mean(0) - acts[real & ~on].mean(0)).argmax())


@torch.no_grad()
def steering_effect(tm: TranslationModel, dictionary: SparseDictionary, feature: int, sources: Sequence[str],
                    edit: float | str | FeatureEdit, *, toward: Iterable[str], away: Iterable[str] = (),
                    controls: int = 5, seed: int = 0, examples: int = 5, **options) -> SteeringEffect:
    """Steer `feature` by `edit` on every sentence, and `controls` random features of the same decoder norm, and
    count the translations that move toward `toward` words (and away from `away` ones); `options` are decoding
    options (beam=, ...)."""
    if not sources:
        raise ValueError("steering_effect needs at least one source sentence")
    n = dictionary.cfg.d_sae
    if not 0 <= feature < n:
        raise ValueError(f"feature {feature} is out of range: the dictionary has {n} (0..{n - 1})")
    if controls < 0 or controls >= n:
        raise ValueError(f"controls ({controls}) must lie in [0, {n - 1}]")
    edit = FeatureEdit.parse(edit)
    toward, away = frozenset(toward), frozenset(away)
    site = site_of(dictionary).name
    norms = dictionary.W_dec.detach().norm(dim=1)
    g = torch.Generator().manual_seed(seed)
    others = [f for f in torch.randperm(n, generator=g).tolist() if f != feature][:controls]
    with splice(tm.model, dictionary):
        plain = tm.translate(list(sources), **options)
        steered = tm.translate(list(sources), steer={site: {feature: edit}}, **options)
        changed, moved, which = _shares(plain, steered, toward, away)
        result = SteeringEffect(site, feature, str(edit), len(sources), changed, moved,
                                examples=[(sources[i], plain[i], steered[i]) for i in which[:examples]])
        for other in others:
            scaled = FeatureEdit(edit.value * float(norms[feature] / norms[other]), edit.add)
            out = tm.translate(list(sources), steer={site: {other: scaled}}, **options)
            c, m, _ = _shares(plain, out, toward, away)
            result.control_features.append(other)
            result.control_changed.append(c)
            result.control_toward.append(m)
    return result

"""A concept's features checked against controls of the same size: where they fire, what removing them does.

    firing = word_firing(tm, d, held_out_sources, NUMBERS_DE)   # per feature: firings, how many on those words
    firing.precision[f], firing.recall[f], firing.base_rate     # a feature firing at random has precision = base rate
    cases = number_cases(tm, sources, references, NUMBERS_DE_EN)  # source number word -> English number word
    r = remove_with_control(tm, d, cases[0], number_features, generator=g)
    r.drop, r.control_drop, r.norm, r.control_norm               # log p(English number word) lost, same count and norm
    plural_contrasts(tm, case)                                  # the plural noun after it, under the decoder edits
    plural_verdict(rows)                                        # counted; decoder_decides, survives_zeroing
    raised_words(fd, f, NUMBERS_EN)                             # the distinct words removing f lowers most
    raised_words_in_place(fd, f, others, NUMBERS_EN)            # the same with other directions at f's contexts

Notebook 08 and `tests/analysis/test_features_claims.py` compute their conclusions with these, so the test
asserts what the notebook prints on a smaller set. Every causal number has its control of the same size:

- `remove_with_control` removes, at the source number word, the given features' part Σ a_f W_dec[f] of
  `hook_memory`, and as control as many other features' directions (drawn at random among the features outside
  the concept's, seeded), each with the activation of the group feature it stands for, the sum rescaled to the
  group's norm: the same count and the same norm, only the directions differ.
- `plural_contrasts` reads logit(plural noun) − logit(singular) at the English noun after the number word,
  teacher-forced on the reference, with the decoder's own number word replaced by *a* (singular) and, as the
  edit of the same size, by another number word (still plural); and with `hook_memory` zeroed at every source
  position, or only at the German number word and the source piece after it (the noun, or its first adjective).
- `raised_words_in_place` measures other features' directions removed where `raised_words` removes the feature's
  own: at its top contexts, with its activations, scaled to its decoder norm; only the direction differs, so what
  the position alone makes the model raise (at a number word, other number words) is not credited to the feature.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ..core.batching import decoder_input
from ..decoding.translator import TranslationModel
from .dictionary import SparseDictionary
from .sites import capture_site, site_of

NUMBERS_DE_EN = {"zwei": "two", "drei": "three", "vier": "four", "fünf": "five", "sechs": "six", "sieben": "seven",
                 "acht": "eight", "neun": "nine", "zehn": "ten", "zwölf": "twelve"}
"""German number words and their English translations (one piece each in the shipped tokenizers)."""


def words(pieces: Iterable[str]) -> list[str]:
    """Pieces as lower-cased words: the word-start mark dropped."""
    return [p.replace("\u2581", "").lower() for p in pieces]


def distinct(tokens: Iterable[str]) -> list[str]:
    """Lower-cased words without repeats, first seen first: *two* and *Two* are one word."""
    return list(dict.fromkeys(words(tokens)))


# ------------------------------------------------------------------------------------------ where features fire


@dataclass(frozen=True)
class WordFiring:
    """How often each feature fires on a set of source words, counted over every token of some sentences."""

    fires: torch.Tensor  # (F,) tokens the feature fires on
    on_words: torch.Tensor  # (F,) of those, tokens that are one of the words
    tokens: int
    word_tokens: int

    @property
    def base_rate(self) -> float:
        """The share of tokens that are one of the words: the precision of a feature that fires at random."""
        return self.word_tokens / max(self.tokens, 1)

    @property
    def precision(self) -> torch.Tensor:
        """(F,) the share of each feature's firings that are on one of the words (0 for a feature that never fires)."""
        return self.on_words / self.fires.clamp(min=1)

    @property
    def recall(self) -> torch.Tensor:
        """(F,) the share of the words' tokens each feature fires on."""
        return self.on_words / max(self.word_tokens, 1)

    def f1(self) -> torch.Tensor:
        p, r = self.precision, self.recall
        return torch.where(p + r > 0, 2 * p * r / (p + r).clamp(min=1e-12), torch.zeros_like(p))


@torch.no_grad()
def word_firing(tm: TranslationModel, dictionary: SparseDictionary, sentences: Sequence[str],
                vocabulary: Iterable[str]) -> WordFiring:
    """Count, over every source token of `sentences`, each feature's firings and those on a word of `vocabulary`
    (lower-cased, compared with the token's piece). For an encoder-side dictionary (`hook_memory`, `enc.*`)."""
    site = site_of(dictionary)
    if site.side != "src":
        raise ValueError(f"word_firing counts source tokens; {site.name} is a decoder-side site")
    vocabulary = {w.lower() for w in vocabulary}
    cfg = tm.model.cfg
    fires = torch.zeros(dictionary.cfg.d_sae)
    on_words = torch.zeros(dictionary.cfg.d_sae)
    tokens = word_tokens = 0
    for text in sentences:
        ids, _ = tm.encode_source(text)
        if not ids:
            continue
        acts = capture_site(tm.model, torch.tensor([ids]), torch.tensor([[cfg.start_id]]), site)[site.hook_in][0]
        active = (dictionary.encode(acts.float()) > 0).float()  # (L, F)
        is_word = torch.tensor([w in vocabulary for w in words(tm.src_tokenizer.pieces(ids))])
        fires += active.sum(0)
        on_words += active[is_word].sum(0)
        tokens += len(ids)
        word_tokens += int(is_word.sum())
    return WordFiring(fires, on_words, tokens, word_tokens)


# ------------------------------------------------------------------------------------------ held-out cases


@dataclass(frozen=True)
class NumberCase:
    """A sentence whose source number word the reference translates as the matching English number word."""

    source: str
    reference: str
    src_ids: list[int]  # EOS included
    tgt_ids: list[int]  # the reference, without start or EOS
    word: str  # the German number word
    position: int  # its source position
    out_pos: int  # the output position that produces the English number word (teacher-forced on the reference)


def number_cases(tm: TranslationModel, sources: Sequence[str], references: Sequence[str],
                 numbers: Mapping[str, str] = NUMBERS_DE_EN, *, limit: int | None = None) -> list[NumberCase]:
    """The sentence pairs whose first German number word is one source piece and whose reference has its English
    number word as one piece; the first `limit` of them."""
    out = []
    for source, reference in zip(sources, references):
        if limit is not None and len(out) == limit:
            break
        src_ids, _ = tm.encode_source(source)
        src_words = words(tm.src_tokenizer.pieces(src_ids))
        word = next((w for w in src_words if w in numbers), None)
        if word is None:
            continue
        tgt_ids = tm.tgt_tokenizer.encode(reference)
        en = words(tm.tgt_tokenizer.pieces(tgt_ids))
        if numbers[word] not in en:
            continue
        out.append(NumberCase(source, reference, src_ids, tgt_ids, word, src_words.index(word),
                              en.index(numbers[word])))
    return out


# ------------------------------------------------------------------------------------------ removal and control


@dataclass(frozen=True)
class Removal:
    """Log p(English number word) lost when features are removed at the source number word, and the control's."""

    group: list[int]  # the group's features active at the number word
    control: list[int]  # as many other features
    norm: float  # ‖Σ a_f W_dec[f]‖ over the group
    control_norm: float  # the control's (equal up to rounding)
    drop: float
    control_drop: float


@torch.no_grad()
def _log_probs(tm: TranslationModel, case: NumberCase, deltas: Sequence[torch.Tensor]) -> torch.Tensor:
    """log p(the English number word) at its output position: clean (row 0), then with each delta subtracted from
    `hook_memory` at the number word; one batch."""
    model, cfg = tm.model, tm.model.cfg
    n = 1 + len(deltas)
    src = torch.tensor([case.src_ids]).expand(n, -1)
    tgt_in = torch.tensor([decoder_input(case.tgt_ids, cfg.start_id, prefix=True)]).expand(n, -1)
    stack = torch.stack([torch.zeros_like(deltas[0]), *deltas]) if deltas else None

    def remove(x: torch.Tensor, hook) -> torch.Tensor:
        x = x.clone()
        x[:, case.position] -= stack.to(x.dtype)
        return x

    with model.hooks([("hook_memory", remove)] if deltas else []):
        logits = model(src, tgt_in)
    return logits[:, case.out_pos].float().log_softmax(-1)[:, case.tgt_ids[case.out_pos]]


def matched_control(dictionary: SparseDictionary, activations: torch.Tensor, group: Sequence[int],
                    exclude: Iterable[int], generator: torch.Generator) -> tuple[list[int], torch.Tensor]:
    """As many features as `group`, drawn at random outside `exclude`, each with the activation of the group
    feature it stands for, and the vector they write rescaled to the norm of the group's: (features, vector)."""
    banned = set(exclude) | set(group)
    pool = torch.tensor([f for f in range(dictionary.cfg.d_sae) if f not in banned])
    chosen = pool[torch.randperm(len(pool), generator=generator)[: len(group)]].tolist()
    w = dictionary.W_dec.detach()
    target = activations[list(group)] @ w[list(group)]
    vector = activations[list(group)] @ w[chosen]
    return chosen, vector * (target.norm() / vector.norm().clamp(min=1e-12))


@torch.no_grad()
def remove_with_control(tm: TranslationModel, dictionary: SparseDictionary, case: NumberCase,
                        features: Iterable[int], *, generator: torch.Generator) -> Removal | None:
    """Remove the features of `features` active at the case's number word from `hook_memory` there, and as control
    as many other features of the same norm (`matched_control`); None when none of them is active."""
    site = site_of(dictionary)
    features = list(features)
    acts = capture_site(tm.model, torch.tensor([case.src_ids]), torch.tensor([[tm.model.cfg.start_id]]),
                        site)[site.hook_in][0, case.position]
    feats = dictionary.encode(acts.float())
    group = [f for f in features if feats[f] > 0]
    if not group:
        return None
    delta = feats[group] @ dictionary.W_dec.detach()[group]
    control, control_delta = matched_control(dictionary, feats, group, features, generator)
    lp = _log_probs(tm, case, [delta, control_delta])
    return Removal(group, control, float(delta.norm()), float(control_delta.norm()), float(lp[0] - lp[1]),
                   float(lp[0] - lp[2]))


# ------------------------------------------------------------------------------------------ the plural noun


@dataclass(frozen=True)
class PluralContrast:
    """logit(plural noun) − logit(singular) at the English noun after the number word, teacher-forced."""

    noun: str
    singular: str
    clean: float
    number_to_a: float  # the decoder's own number word replaced by a / A
    number_to_other: float  # replaced by another number word (the same-size edit that keeps the plural)
    memory_zeroed: float  # hook_memory zeroed at every source position (the decoder's number word kept)
    memory_zeroed_at_words: float  # hook_memory zeroed only at the German number word and the source piece after it


def plural_noun(tm: TranslationModel, case: NumberCase) -> tuple[int, int] | None:
    """(output position, singular token id) of the English plural noun right after the number word: one piece
    ending in -s whose singular is one piece too; None when the reference has none there."""
    en = tm.tgt_tokenizer.pieces(case.tgt_ids)
    at = case.out_pos + 1
    if at >= len(en) or not (en[at].startswith("\u2581") and en[at].endswith("s") and len(en[at]) > 2):
        return None
    if at + 1 < len(en) and not en[at + 1].startswith("\u2581") and en[at + 1] not in ".,":
        return None  # the noun goes on in the next piece
    singular = tm.tgt_tokenizer.encode(en[at][1:-1])
    return (at, singular[0]) if len(singular) == 1 else None


def _one_piece(tm: TranslationModel, word: str, like: str) -> int:
    """The target id of `word`, capitalised like the piece `like`; ValueError when it is not one piece."""
    text = word.capitalize() if like.lstrip("\u2581")[:1].isupper() else word
    ids = tm.tgt_tokenizer.encode(text)
    if len(ids) != 1:
        raise ValueError(f"{text!r} is {len(ids)} target pieces, not one")
    return ids[0]


@torch.no_grad()
def plural_contrasts(tm: TranslationModel, case: NumberCase, numbers: Mapping[str, str] = NUMBERS_DE_EN
                     ) -> PluralContrast | None:
    """The plural contrast at the noun after the case's number word under the edits of the module docstring;
    None when the reference has no one-piece plural noun there."""
    found = plural_noun(tm, case)
    if found is None:
        return None
    at, singular = found
    model, cfg = tm.model, tm.model.cfg
    noun = case.tgt_ids[at]
    piece = tm.tgt_tokenizer.pieces([case.tgt_ids[case.out_pos]])[0]
    english = list(numbers.values())
    other = english[(english.index(numbers[case.word]) + 1) % len(english)]
    prefixes = [case.tgt_ids[:at] for _ in range(5)]
    prefixes[1] = [*case.tgt_ids[: case.out_pos], _one_piece(tm, "a", piece)]
    prefixes[2] = [*case.tgt_ids[: case.out_pos], _one_piece(tm, other, piece)]
    src = torch.tensor([case.src_ids]).expand(5, -1)
    tgt_in = torch.tensor([decoder_input(p, cfg.start_id, prefix=True) for p in prefixes])
    noun_src = [p for p in (case.position + 1,) if p < len(case.src_ids) - 1]

    def zero(x: torch.Tensor, hook) -> torch.Tensor:
        x = x.clone()
        x[3] = 0
        x[4, [case.position, *noun_src]] = 0
        return x

    with model.hooks([("hook_memory", zero)]):
        logits = model(src, tgt_in)[:, -1].float()
    c = (logits[:, noun] - logits[:, singular]).tolist()
    pieces = tm.tgt_tokenizer.pieces([noun, singular])
    return PluralContrast(pieces[0].lstrip("\u2581"), pieces[1].lstrip("\u2581"), *c)


FLIP_SHARE = 2 / 3
"""The share of plural nouns an edit must turn singular for "the edit decides the plural"."""
KEEP_SHARE = 0.9
"""The share of plural nouns an edit must leave plural for "the edit does not decide it" (its control)."""


@dataclass(frozen=True)
class PluralVerdict:
    """`plural_contrasts` over many nouns, counted on the nouns the clean model makes plural (contrast > 0), with
    the two conclusions decided by `FLIP_SHARE` and `KEEP_SHARE`."""

    nouns: int  # every noun measured
    plural: int  # of them, plural in the clean run: the counts below are of these
    to_a_singular: int  # the decoder's number word replaced by a: turned singular
    to_other_plural: int  # replaced by another number word (the same-size edit): still plural
    zeroed_plural: int  # hook_memory zeroed at every source position: still plural
    zeroed_at_words_plural: int  # zeroed at the German number word and the piece after it: still plural
    turned_by_zeroing: list[str]  # the nouns zeroing hook_memory turned singular

    @property
    def decoder_decides(self) -> bool:
        """Replacing the decoder's number word by *a* turns most plurals singular, and the same-size edit (another
        number word) keeps them plural."""
        return self.to_a_singular >= FLIP_SHARE * self.plural and self.to_other_plural >= KEEP_SHARE * self.plural

    @property
    def survives_zeroing(self) -> bool:
        """The refutable claim: with the whole encoder output zeroed, the noun stays plural."""
        return self.zeroed_plural >= KEEP_SHARE * self.plural


def plural_verdict(rows: Sequence[PluralContrast]) -> PluralVerdict:
    """Count `rows` (from `plural_contrasts`) for the two plural conclusions; see `PluralVerdict`."""
    plural = [r for r in rows if r.clean > 0]
    return PluralVerdict(len(rows), len(plural), sum(r.number_to_a < 0 for r in plural),
                         sum(r.number_to_other > 0 for r in plural), sum(r.memory_zeroed > 0 for r in plural),
                         sum(r.memory_zeroed_at_words > 0 for r in plural),
                         [r.noun for r in plural if r.memory_zeroed <= 0])


def top_and_matched(attribution, k: int = 3) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The k (position, feature) rows of a `FeatureAttribution` with the largest attribution, and as control k
    other active rows of the same sizes: for each top row in turn, the unused row whose activation is closest
    (decoder rows of unit norm: the same norms). Fewer when fewer rows are active."""
    n = attribution.attributions.numel()
    top = list(range(min(k, n)))  # rows are sorted largest attribution first
    free = set(range(len(top), n))
    matched = []
    for i in top:
        if not free:
            break
        a = float(attribution.activations[i])
        j = min(free, key=lambda r: (abs(float(attribution.activations[r]) - a), r))
        free.discard(j)
        matched.append(j)

    def rows(ix: list[int]) -> list[tuple[int, int]]:
        return [(int(attribution.positions[i]), int(attribution.features[i])) for i in ix]
    return rows(top), rows(matched)


@dataclass(frozen=True)
class RaisedWords:
    """What removing one feature at its top contexts does to the output (from `FeatureData.output_effects`)."""

    words: list[str]  # the distinct words whose probability falls most, largest fall first
    share: float  # the share of them in the vocabulary asked about
    largest: float  # the largest fall in probability of any token
    largest_clean: float  # the largest clean probability among the raised words' tokens
    own: str  # the output piece most often aligned to the feature's top contexts
    own_change: float  # its mean fall in probability, p_clean - p_without (negative: it rises without the feature)
    own_clean: float


def raised_words(fd, feature: int, vocabulary: Iterable[str], *, contexts: int = 8, n: int = 10,
                 top: int = 1000) -> RaisedWords:
    """The `n` distinct words (*two* and *Two* are one) whose probability falls most when `feature` is removed at
    its top contexts, the share of them in `vocabulary`, and the same measurement for its own aligned word (0 when
    it is not among the `top` tokens that fall or rise most: a smaller change than theirs)."""
    vocabulary = {w.lower() for w in vocabulary}
    effects = fd.output_effects(feature, contexts=contexts, top=top, heads=False, controls=0)  # the ranking only
    ranked = effects["tokens"]
    found = distinct(t["token"] for t in ranked)[:n]
    kept = [t for t in ranked if words([t["token"]])[0] in found]
    aligned = [c.aligned for c in fd.contexts(feature, contexts)]
    own = max(set(aligned), key=lambda a: (aligned.count(a), a)) if aligned else ""
    entry = next((t for t in [*ranked, *effects["lowers"]] if t["token"] == own), None)
    return RaisedWords(found, sum(w in vocabulary for w in found) / max(len(found), 1),
                       ranked[0]["dp"] if ranked else 0.0, max((t["p_clean"] for t in kept), default=0.0), own,
                       0.0 if entry is None else entry["dp"],
                       0.0 if entry is None else entry["p_clean"])


def raised_words_in_place(fd, feature: int, others: Iterable[int], vocabulary: Iterable[str], *, contexts: int = 8,
                          n: int = 10, top: int = 1000) -> list[RaisedWords]:
    """`raised_words` of `feature`'s contexts with each of `others`' decoder directions (scaled to `feature`'s
    decoder norm) removed in place of its own: the same contexts, activations and norm, another direction. The
    control for "the words it raises": removing any direction at a number word may move other number words."""
    own = fd.d.W_dec.detach()[feature]
    out = []
    for g in others:
        d = copy.deepcopy(fd.d)
        with torch.no_grad():
            row = d.W_dec[int(g)]
            d.W_dec[feature] = row * (own.norm() / row.norm().clamp(min=1e-12))
        out.append(raised_words(type(fd)(fd.tm, d, fd.stats, fd.name), feature, vocabulary, contexts=contexts, n=n,
                                top=top))
    return out

"""Word alignments from a model's cross-attention, per layer and head, over whitespace words.

    src, tgt = encode_words(tokenizer, "Das Haus ist klein ."), encode_words(tokenizer, "The house is small .")
    maps = alignment_maps(model, [src], [tgt], method="weights", shift="awi")[0]   # WordMaps
    maps.heads.shape                       # (L, H, 5 target words, 5 source words + EOS)
    links = maps.links(layer=0, head=0)    # {(source word, target word), ...}, 0-based, Pharaoh order
    maps = maps_from_trace(trace, src, tgt, shift="awo")     # the same from a teacher-forced trace
    papers_protocol(model, sources, targets, gold)            # each paper's protocol, 95 % interval, published AER

Words are the whitespace tokens of the given lines. Each word is encoded on its own and the pieces are
concatenated (sentencepiece splits at spaces, so this is the piece sequence of the line), so every piece
knows its word. A source word's score is the SUM over its pieces, a target word's the MEAN over its pieces
(Kobayashi et al. 2020, Ferrando et al. 2022, Zenkel et al.). The source EOS stays as a last column.

Teacher forcing on [start, y_1 .. y_n]: decoder position t reads y_t (t >= 1) and predicts y_{t+1}.
AWO ("alignment with output", Garg et al. 2019) scores y_t by the row that predicts it, position t - 1;
AWI ("alignment with input", Chen et al. 2020's shift) by the row that reads it, position t.

Methods: "weights" (attention probabilities; a layer = the mean of its heads), "norms" (Kobayashi et al.
2020: α·‖f(x)‖ per head, ‖Σ_h α f_h(x)‖ per layer; `norms.value_norms`), "alti" (ALTI+ cross-attention
contributions, `alti.cross_contributions`; per head each head's own terms).
A link for target word t is the argmax over source words; with eos="null" the argmax runs over EOS too and
a word whose best column is EOS gets no link (as the ALTI+ scripts do); eos="drop" ignores that column.
`symmetrize` also takes each source word's best target word (the column argmax) and combines the two
directions as GIZA++'s are (intersect, grow-diag, grow-diag-final, union; `symmetrize_links`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ...core.batching import corpus_batches
from ...core.model import evaluating
from ..attention.head_stats import has_punctuation, is_punctuation
from ..attention.norms import value_norms
from ..attribution.alti import alti_hooks, block_terms, cross_contributions
from .alignment import AERScore, Link, bootstrap_aer, score_alignments
from .alignment_layer import hooks_for_layer, layer_maps, load_alignment_layer

ATTENTION_METHODS = ("weights", "norms", "alti")  # maps read off the model's own attention
METHODS = (*ATTENTION_METHODS, "layer")  # "layer": a trained alignment layer (alignment_layer.py) on the frozen model
PRESETS = ("shift-att",)  # named aligners: Chen et al. 2020's Shift-Att (see `shift_att_spec`)
SHIFTS = ("awo", "awi")
EOS_RULES = ("drop", "null")
SYMMETRIZE = ("none", "intersect", "grow-diag", "grow-diag-final", "union")
PUNCTUATION_RULES = ("any", "apart")  # "apart": no link between a punctuation mark and a word (`punctuation_apart`)
PUNCTUATION_WORD = re.compile(r"\w+(?:[-'’.]\w+)*|[^\w\s]")


def split_punctuation(line: str) -> str:
    """Punctuation split from words ("period." -> "period ."), hyphenated words and abbreviations kept whole: how
    the alignment layers' training text is split, as the gold sets' text is."""
    return " ".join(PUNCTUATION_WORD.findall(line))


@dataclass(frozen=True)
class Words:
    """A line as whitespace words, encoded word by word: `word_of[k]` is piece k's word."""

    words: list[str]
    ids: list[int]
    word_of: list[int]


def encode_words(tokenizer, line: str) -> Words:
    """Split `line` at whitespace and encode each word alone; a word the tokenizer drops has no pieces."""
    words = line.split()
    ids: list[int] = []
    word_of: list[int] = []
    for w, word in enumerate(words):
        pieces = tokenizer.encode(word)
        ids += pieces
        word_of += [w] * len(pieces)
    return Words(words, ids, word_of)


def punctuation_apart(links: set[Link], src_words: Sequence[str], tgt_words: Sequence[str]) -> set[Link]:
    """`links` less those that join a punctuation mark (`is_punctuation`) to a word with no punctuation in it: marks
    link to marks, and to words that carry one ("angenommen." in untokenized output keeps its link to "."). Gold
    alignments link a mark to a word almost never (RWTH de-en lines 1-150: 39 of 3,092 gold links; a German comma
    before a clause has no English counterpart), while an argmax gives every row and column a partner. Chosen as
    the shipped aligner's rule on RWTH lines 1-150 only (docs/analysis.md §10)."""
    mark_s, mark_t = [is_punctuation(w) for w in src_words], [is_punctuation(w) for w in tgt_words]
    some_s, some_t = [has_punctuation(w) for w in src_words], [has_punctuation(w) for w in tgt_words]
    return {(s, t) for s, t in links if not (mark_s[s] and not some_t[t]) and not (mark_t[t] and not some_s[s])}


def _sum_matrix(word_of: Sequence[int], n_words: int) -> np.ndarray:
    m = np.zeros((len(word_of), n_words))
    m[np.arange(len(word_of)), word_of] = 1.0
    return m


def to_words(matrix: np.ndarray, src: Words, tgt: Words, *, target: str = "mean") -> np.ndarray:
    """(..., n_tgt pieces, n_src pieces + 1) -> (..., n_tgt words, n_src words + 1): source pieces summed into
    their words (the last column, EOS, kept), target pieces averaged (`target="max"`: their largest score per
    source piece). A target word without pieces scores 0."""
    if target not in ("mean", "max"):
        raise ValueError(f"target pieces are combined by 'mean' or 'max', got {target!r}")
    m = np.asarray(matrix, dtype=np.float64)
    n_src, n_tgt = len(src.words), len(tgt.words)
    if m.shape[-1] != len(src.ids) + 1 or m.shape[-2] != len(tgt.ids):
        raise ValueError(f"matrix {m.shape[-2:]} does not match {len(tgt.ids)} target pieces x "
                         f"{len(src.ids)} source pieces + EOS")
    cols = np.zeros((len(src.ids) + 1, n_src + 1))
    cols[: len(src.ids)] = _sum_matrix(src.word_of, n_src + 1)
    cols[-1, -1] = 1.0
    if target == "max":
        word_of = np.asarray(tgt.word_of)
        out = np.zeros((*m.shape[:-2], n_tgt, m.shape[-1]))
        for w in set(tgt.word_of):
            out[..., w, :] = m[..., word_of == w, :].max(-2)
        return out @ cols
    rows = _sum_matrix(tgt.word_of, n_tgt).T  # (Tw, T)
    rows /= np.maximum(rows.sum(1, keepdims=True), 1.0)
    return rows @ m @ cols


@dataclass
class WordMaps:
    """Word-level scores of one sentence pair: `heads` (L, H, Tw, Sw + 1), `layers` (L, Tw, Sw + 1); the
    last column is the source EOS. Rows: target words; columns: source words."""

    heads: np.ndarray | None
    layers: np.ndarray
    method: str
    shift: str
    normalize: bool = True  # `combined` scales each unit's rows to sum to 1 first (an alignment layer may say not)
    src_words: tuple[str, ...] | None = None  # the pair's words, for the punctuation rule "apart"
    tgt_words: tuple[str, ...] | None = None

    def matrix(self, layer: int, head: int | None = None) -> np.ndarray:
        """One unit's (Tw, Sw + 1) map: a head, or the whole layer (head None)."""
        if head is None:
            return self.layers[layer]
        if self.heads is None:
            raise ValueError("these maps hold layers only (made with heads=False)")
        return self.heads[layer, head]

    def combined(self, units: Sequence[tuple[int, int | None]]) -> np.ndarray:
        """The mean of several units' maps, each row first scaled to sum to 1 (units on one footing; not with
        `normalize` false)."""
        if not units:
            raise ValueError("no units to combine")
        total = 0.0
        for layer, head in units:
            m = self.matrix(layer, head)
            total = total + (m / np.maximum(m.sum(-1, keepdims=True), 1e-30) if self.normalize else m)
        return total / len(units)

    def links(self, layer: int | None = None, head: int | None = None, *,
              units: Sequence[tuple[int, int | None]] | None = None, eos: str = "drop",
              symmetrize: str = "none", punctuation: str = "any") -> set[Link]:
        """Argmax links (source word, target word) of one unit or the combination of `units`; `punctuation`
        "apart" then drops links between a punctuation mark and a word without one (`punctuation_apart`)."""
        if punctuation not in PUNCTUATION_RULES:
            raise ValueError(f"punctuation must be one of {PUNCTUATION_RULES}, got {punctuation!r}")
        if units is None:
            if layer is None:
                raise ValueError("give a layer (and head) or units")
            units = [(layer, head)]
        links = argmax_links(self.combined(units), eos=eos, symmetrize=symmetrize)
        if punctuation == "any":
            return links
        if self.src_words is None or self.tgt_words is None:
            raise ValueError('punctuation "apart" needs maps that know their words (made by alignment_maps or '
                             'maps_from_trace)')
        return punctuation_apart(links, self.src_words, self.tgt_words)


def argmax_links(matrix: np.ndarray, *, eos: str = "drop", symmetrize: str = "none") -> set[Link]:
    """Links from a (target words, source words + EOS) map; see `symmetrize_links` for `symmetrize`.

    "none": each target word (row) to its best source word (one link per target word; with eos="null" none
    where EOS wins). Otherwise the other direction too, each source word (column) to its best target word,
    and the two link sets are combined as GIZA++'s two directions are."""
    if eos not in EOS_RULES:
        raise ValueError(f"eos must be one of {EOS_RULES}, got {eos!r}")
    if symmetrize not in SYMMETRIZE:
        raise ValueError(f"symmetrize must be one of {SYMMETRIZE}, got {symmetrize!r}")
    m = np.asarray(matrix)
    n_src = m.shape[-1] - 1
    if n_src < 1 or m.shape[0] < 1:
        return set()
    best = m[:, :n_src].argmax(-1) if eos == "drop" else m.argmax(-1)
    has = m.sum(-1) > 0  # a target word with no pieces has an all-zero row
    rows = {(int(s), t) for t, s in enumerate(best) if has[t] and s < n_src}
    if symmetrize == "none":
        return rows
    col_has = m[:, :n_src].sum(0) > 0
    cols = {(s, int(t)) for s, t in enumerate(m[:, :n_src].argmax(0)) if col_has[s]}
    return symmetrize_links(rows, cols, symmetrize)


def combine_directions(forward: np.ndarray, backward: np.ndarray, *, alpha: float = 0.5,
                       normalize: bool = True) -> np.ndarray:
    """One (target words, source words + EOS) map of a pair from two translation directions' word maps of it:
    `forward` (Tw, Sw + 1) from the model that translates source -> target, `backward` (Sw, Tw + 1) from the one
    that translates target -> source. Their weighted geometric mean over words, forward^alpha * backward^T^(1 -
    alpha), each first scaled over its own source side (its rows without EOS) unless `normalize` is false; the
    EOS column is zero, so read it with eos="drop" (`argmax_links`). A map-level symmetrization of two models, the
    alternative to combining their links (`symmetrize_links`); docs/analysis.md §10 measures both."""
    f, b = np.asarray(forward, dtype=np.float64), np.asarray(backward, dtype=np.float64)
    if f.ndim != 2 or b.ndim != 2 or f.shape[0] != b.shape[1] - 1 or b.shape[0] != f.shape[1] - 1:
        raise ValueError(f"maps of one pair need shapes (Tw, Sw + 1) and (Sw, Tw + 1); got {f.shape} and {b.shape}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    a, c = f[:, :-1], b[:, :-1]
    if normalize:
        a = a / np.maximum(a.sum(1, keepdims=True), 1e-30)
        c = c / np.maximum(c.sum(1, keepdims=True), 1e-30)
    tiny = 1e-12  # a zero score stays (nearly) zero, and log never sees 0
    out = np.exp(alpha * np.log(a + tiny) + (1.0 - alpha) * np.log(c.T + tiny))
    return np.concatenate([out, np.zeros((out.shape[0], 1))], axis=1)


def symmetrize_links(a: set[Link], b: set[Link], how: str) -> set[Link]:
    """Combine two one-directional alignments (Och & Ney 2003; Koehn et al. 2003's grow-diag(-final)):
    "intersect", "union", "grow-diag" (start from the intersection, repeatedly add union links next to a link
    already there, diagonals included, that align a word not yet aligned), "grow-diag-final" (then add the
    remaining union links whose source or target word is still unaligned)."""
    inter, union = a & b, a | b
    if how == "intersect":
        return inter
    if how == "union":
        return union
    if how not in ("grow-diag", "grow-diag-final"):
        raise ValueError(f"symmetrize must be one of {SYMMETRIZE}, got {how!r}")
    links = set(inter)
    src_done = {i for i, _ in links}
    tgt_done = {j for _, j in links}
    neighbours = [(-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]
    grown = True
    while grown:
        grown = False
        for i, j in sorted(links):
            for di, dj in neighbours:
                n = (i + di, j + dj)
                if n in union and n not in links and (n[0] not in src_done or n[1] not in tgt_done):
                    links.add(n)
                    src_done.add(n[0])
                    tgt_done.add(n[1])
                    grown = True
    if how == "grow-diag-final":
        for i, j in sorted(union - links):
            if i not in src_done or j not in tgt_done:
                links.add((i, j))
                src_done.add(i)
                tgt_done.add(j)
    return links


def _check(method: str, shift: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if shift not in SHIFTS:
        raise ValueError(f"shift must be one of {SHIFTS} (AWO: the row that predicts the word, AWI: the row "
                         f"that reads it), got {shift!r}")


def hooks_for(model, method: str, layer=None) -> list[str]:
    """The hooks a trace needs for `maps_from_trace` with `method` (`layer`: the alignment layer, for "layer")."""
    if method == "layer":
        return hooks_for_layer(model, _need_layer(layer))
    if method == "weights":
        return [layer.cross_attn.hook_probs.name for layer in model.dec]
    if method == "norms":
        return [*(layer.cross_attn.hook_probs.name for layer in model.dec),
                *(layer.cross_attn.hook_v.name for layer in model.dec)]
    return alti_hooks(model, kinds=("cross",))


def _need_layer(layer):
    if layer is None:
        raise ValueError('method "layer" needs a trained alignment layer (alignment_layer.load_alignment_layer)')
    return layer


@torch.no_grad()
def piece_maps(model, trace, method: str, *, heads: bool = True, layer=None
               ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Piece-level scores from a teacher-forced trace: heads (L, B, H, T, S) (None unless `heads`), layers
    (L, B, T, S). Method "layer": the alignment layer's probabilities as one layer, no heads."""
    if method == "layer":
        return None, layer_maps(model, _need_layer(layer), trace)
    per_head, layers = [], []
    for i, layer in enumerate(model.dec):
        if method == "weights":
            p = trace[layer.cross_attn.hook_probs.name].float()
            per_head.append(p)
            layers.append(p.mean(1))
        elif method == "norms":
            n = value_norms(model, trace, "cross", i)
            per_head.append(n.per_head.float())
            layers.append(n.combined.float())
        else:
            t = block_terms(model, trace, "cross", i)
            if heads:  # the (B, H, T, S, D) terms: ALTI's costly part, skipped for layer-level maps
                per_head.append(cross_contributions(t, heads=True))
            layers.append(cross_contributions(t)[..., :-1])
    return (torch.stack(per_head) if heads else None), torch.stack(layers)


def maps_from_trace(model, trace, src: Words, tgt: Words, *, method: str = "weights", shift: str = "awi",
                    index: int = 0, heads: bool = True, layer=None) -> WordMaps:
    """Word maps of batch entry `index` of a trace taken on src.ids + [EOS] and [start] + tgt.ids (+ anything
    after: longer targets and padding are cut). The trace needs `hooks_for(model, method)`."""
    _check(method, shift)
    per_head, layers = piece_maps(model, trace, method, heads=heads and method != "layer", layer=layer)
    return _word_maps(None if per_head is None else per_head[:, index], layers[:, index], src, tgt, method, shift,
                      layer)


def _word_maps(heads, layers, src: Words, tgt: Words, method: str, shift: str, layer=None) -> WordMaps:
    """Pieces -> words; an alignment layer's extraction says how its target pieces combine and whether `combined`
    normalises its rows (`alignment_layer` docstring)."""
    extraction = layer.extraction if method == "layer" and layer is not None else {}
    target = extraction.get("target_pieces", "mean")
    n, m = len(tgt.ids), len(src.ids)
    rows = slice(0, n) if shift == "awo" else slice(1, n + 1)
    if layers.size(-2) < rows.stop or layers.size(-1) < m + 1:
        raise ValueError(f"the trace has {layers.size(-2)} decoder positions and {layers.size(-1)} source "
                         f"positions; {shift} needs {rows.stop} and {m + 1}")
    lay = to_words(layers[..., rows, : m + 1].cpu().numpy(), src, tgt, target=target)
    h = None if heads is None else to_words(heads[..., rows, : m + 1].cpu().numpy(), src, tgt)
    return WordMaps(h, lay, method, shift, bool(extraction.get("normalize_rows", True)),
                    tuple(src.words), tuple(tgt.words))


def alignment_maps(model, sources: Sequence[Words], targets: Sequence[Words], *, method: str = "weights",
                   shift: str = "awi", batch_size: int = 32, heads: bool = True, layer=None) -> list[WordMaps]:
    """Word maps for each pair, teacher-forced in length-sorted batches (`heads=False`: layer maps only, which
    for ALTI+ is several times faster). A pair with a side longer than the model's positions is an error
    naming it (alignments need whole sentences)."""
    _check(method, shift)
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    cfg = model.cfg
    for k, (s, t) in enumerate(zip(sources, targets)):
        if not s.ids or not t.ids:
            raise ValueError(f"pair {k + 1}: {'source' if not s.ids else 'target'} is empty")
        if len(s.ids) + 1 > cfg.max_positions or len(t.ids) + 1 > cfg.max_positions:
            raise ValueError(f"pair {k + 1} has {len(s.ids)} source and {len(t.ids)} target pieces; the model "
                             f"takes {cfg.max_positions - 1} at most")
    names = hooks_for(model, method, layer)
    heads = heads and method != "layer"
    out: list[WordMaps | None] = [None] * len(sources)
    batches = corpus_batches([s.ids for s in sources], [t.ids for t in targets], pad_id=cfg.pad_id,
                             start_id=cfg.start_id, batch_size=batch_size, source_end=cfg.eos_id, prefix=True,
                             device=model.device)
    with evaluating(model), torch.no_grad():
        for batch, b in batches:
            _, trace = model.run_with_cache(b.src, b.tgt_in, names=names)
            per_head, layers = piece_maps(model, trace, method, heads=heads, layer=layer)
            for i, k in enumerate(batch):
                out[k] = _word_maps(None if per_head is None else per_head[:, i], layers[:, i], sources[k],
                                    targets[k], method, shift, layer)
    return out  # type: ignore[return-value]


# ------------------------------------------------------------------------------ a checkpoint's own aligner

Unit = tuple[int, "int | None"]  # (decoder layer, head); head None = the whole layer


@dataclass(frozen=True)
class AlignmentSpec:
    """How a checkpoint aligns by default (its `alignment.json`): a method, a shift, an EOS rule and the units
    (heads or whole layers) whose row-normalised maps are averaged, a symmetrization and a punctuation rule
    ("any", or "apart": `punctuation_apart`; an alignment.json without the key means "any"). `provenance` says how
    it was chosen."""

    method: str = "weights"
    shift: str = "awo"
    eos: str = "drop"
    units: tuple[Unit, ...] = ()
    provenance: dict = field(default_factory=dict)
    symmetrize: str = "none"
    layer: object = field(default=None, compare=False, repr=False)  # the trained AlignmentLayer, method "layer"
    punctuation: str = "any"

    def __post_init__(self) -> None:
        _check(self.method, self.shift)
        if self.method == "layer" and (self.shift != "awi" or tuple(self.units) != ((0, None),)):
            raise ValueError('method "layer" reads the alignment layer\'s rows as AWI (row t + 1 is y_t\'s, as it '
                             'was trained) and has one unit, (0, None)')
        if self.eos not in EOS_RULES:
            raise ValueError(f"eos must be one of {EOS_RULES}, got {self.eos!r}")
        if self.symmetrize not in SYMMETRIZE:
            raise ValueError(f"symmetrize must be one of {SYMMETRIZE}, got {self.symmetrize!r}")
        if self.punctuation not in PUNCTUATION_RULES:
            raise ValueError(f"punctuation must be one of {PUNCTUATION_RULES}, got {self.punctuation!r}")
        if not self.units:
            raise ValueError("an alignment needs at least one unit (layer, head)")

    @property
    def needs_heads(self) -> bool:
        return any(h is not None for _, h in self.units)

    def check(self, model) -> AlignmentSpec:
        if self.method == "layer":
            _need_layer(self.layer)
            return self
        layers, heads = len(model.dec), model.dec[0].cross_attn.n_heads
        for layer, head in self.units:
            if not 0 <= layer < layers or (head is not None and not 0 <= head < heads):
                raise ValueError(f"alignment unit {layer}:{head} does not exist: the model has {layers} decoder "
                                 f"layers of {heads} cross-attention heads")
        return self

    def links_of(self, maps: WordMaps) -> set[Link]:
        """This aligner's links from one pair's maps: its units combined, its EOS rule, its symmetrization, its
        punctuation rule. The one place a spec becomes links: `workbench align`, the Evidence tab and notebook 07
        all come through here."""
        return maps.links(units=self.units, eos=self.eos, symmetrize=self.symmetrize, punctuation=self.punctuation)

    def reads(self) -> str:
        """What the maps are read from: "weights AWO units 3,0:2", or the trained alignment layer(s) by name."""
        if self.method == "layer":
            joined = len(getattr(self.layer, "partners", ()) or ())
            return "the trained alignment layer" if not joined else f"{joined + 1} trained alignment layers read as one"
        units = ",".join(f"{lay}" if h is None else f"{lay}:{h}" for lay, h in self.units)
        return f"{self.method} {self.shift.upper()} units {units}"

    def label(self) -> str:
        rule = ", punctuation apart" if self.punctuation == "apart" else ""
        return f"{self.reads()} (eos {self.eos}, symmetrize {self.symmetrize}{rule})"

    def to_dict(self) -> dict:
        return {"method": self.method, "shift": self.shift, "eos": self.eos, "symmetrize": self.symmetrize,
                "punctuation": self.punctuation, "units": [[lay, h] for lay, h in self.units],
                "provenance": dict(self.provenance)}

    @classmethod
    def from_dict(cls, d: dict) -> AlignmentSpec:
        try:
            units = tuple((int(u[0]), None if u[1] is None else int(u[1])) for u in d["units"])
            return cls(str(d["method"]), str(d["shift"]), str(d.get("eos", "drop")), units,
                       dict(d.get("provenance") or {}), str(d.get("symmetrize", "none")),
                       punctuation=str(d.get("punctuation", "any")))
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"alignment spec needs method, shift and units [[layer, head or null], ...]: {exc!r}")\
                from None


def parse_units(text: str) -> tuple[Unit, ...]:
    """"0:0,0:2,3" -> ((0, 0), (0, 2), (3, None)): layer:head, or a layer alone for its whole layer."""
    units = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if not 1 <= len(parts) <= 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"bad unit {item!r}: expected LAYER:HEAD or LAYER, e.g. 0:0,0:2,3")
        units.append((int(parts[0]), int(parts[1]) if len(parts) == 2 else None))
    return tuple(units)


def fallback_spec(model) -> AlignmentSpec:
    """For a checkpoint without its own alignment: fairseq's `--print-alignment` default, the last decoder
    layer's cross-attention averaged over heads, row that predicts the word (AWO)."""
    return AlignmentSpec("weights", "awo", "drop", ((len(model.dec) - 1, None),),
                         {"chosen": "fallback: fairseq's default (last layer, heads averaged, AWO)"})


def shift_att_spec(model, stored: dict | None = None) -> AlignmentSpec:
    """Chen et al. 2020's Shift-Att: attention weights averaged over one layer's heads, the row that reads the
    word (AWI), argmax in both directions combined by grow-diag (the paper symmetrizes its two translation
    directions so; one model gives the two argmax directions of one map). The layer: alignment.json's
    "shift-att" entry (chosen on gold lines by scripts/alignment_methods.py) when there is one, else the middle
    layer (Chen et al. found the 3rd of 6 best), EOS dropped."""
    chosen = (stored or {}).get("shift-att") if isinstance(stored, dict) else None
    if chosen:
        return AlignmentSpec("weights", "awi", "drop", ((int(chosen["layer"]), None),),
                             {"chosen": chosen.get("chosen", "alignment.json's shift-att entry")},
                             str(chosen.get("symmetrize", "grow-diag")))
    return AlignmentSpec("weights", "awi", "drop", ((max(len(model.dec) // 2 - 1, 0), None),),
                         {"chosen": "Shift-Att default: the middle decoder layer (no choice stored)"}, "grow-diag")


def layer_spec(stored: dict | None = None, layer=None) -> AlignmentSpec:
    """The trained alignment layer as an aligner: alignment.json's spec when it is a "layer" aligner (its EOS rule
    and symmetrization were chosen with it), else EOS dropped and grow-diag."""
    if isinstance(stored, dict) and stored.get("method") == "layer":
        base = AlignmentSpec.from_dict(stored)
        return AlignmentSpec("layer", "awi", base.eos, ((0, None),), base.provenance, base.symmetrize, layer,
                             base.punctuation)
    return AlignmentSpec("layer", "awi", "drop", ((0, None),), {}, "grow-diag", layer)


def aligner(model, stored: AlignmentSpec | dict | None, method: str | None = None, *,
            directory=None) -> tuple[AlignmentSpec, str]:
    """The aligner a checkpoint uses, and where it comes from: its stored spec (alignment.json) whole, else the
    fallback. A `method` other than the stored one starts from the fallback (last layer, AWO, EOS dropped, no
    symmetrization) with that method, because the stored units, shift, EOS rule and symmetrization were chosen
    together with the stored method; "shift-att" is `shift_att_spec`, "layer" `layer_spec`. An aligner of method
    "layer" gets the alignment layer stored in `directory` (the checkpoint's; `alignment_layer.load_alignment_layer`).
    `workbench align`, `workbench translate --alignments` and the Evidence tab all ask here."""
    valid = (*METHODS, *PRESETS)
    if method is not None and method not in valid:
        raise ValueError(f"method must be one of {valid}, got {method!r}")
    fallback = fallback_spec(model)
    raw = stored.to_dict() if isinstance(stored, AlignmentSpec) else stored
    if stored is None:
        base, origin = fallback, "the fallback aligner (no alignment.json)"
    else:
        base = stored if isinstance(stored, AlignmentSpec) else AlignmentSpec.from_dict(stored)
        origin = "the checkpoint's alignment.json"
    if method == "shift-att":
        base, origin = shift_att_spec(model, raw), "Shift-Att (Chen et al. 2020)"
    elif method == "layer" and base.method != "layer":
        base, origin = layer_spec(raw), "the trained alignment layer"
    elif method is not None and method != base.method:
        _check(method, "awo")
        origin = (f"the fallback aligner (alignment.json is a {base.method} aligner)" if stored is not None
                  else "the fallback aligner (no alignment.json)")
        base = AlignmentSpec(method, fallback.shift, fallback.eos, fallback.units, fallback.provenance,
                             fallback.symmetrize)
    if base.method == "layer" and base.layer is None:
        if directory is None:
            raise ValueError('a "layer" aligner needs the checkpoint directory its alignment layer is stored in')
        base = replace(base, layer=load_alignment_layer(directory, device=model.device).check_fits(model))
    return base, origin


def too_long(model, src: Words, tgt: Words) -> bool:
    """Whether a pair has a side over the model's positions (source pieces + EOS, start + target pieces)."""
    room = model.cfg.max_positions - 1
    return len(src.ids) > room or len(tgt.ids) > room


def align_pairs(model, src_tokenizer, tgt_tokenizer, sources: Sequence[str], targets: Sequence[str],
                spec: AlignmentSpec, *, batch_size: int = 32, skip_long: bool = False) -> list[set[Link]]:
    """Links (source word, target word) for each line pair, with `spec`. An empty line gets no links; a pair
    too long for the model is an error, or with `skip_long` gets no links and one warning naming its line.

    Skipped, not cut into windows: teacher forcing needs the whole pair in one forward pass, and which source
    window a target window translates is the alignment being asked for; an empty line keeps the line count."""
    spec.check(model)
    src = [encode_words(src_tokenizer, s) for s in sources]
    tgt = [encode_words(tgt_tokenizer, t) for t in targets]
    todo = [k for k in range(len(src)) if src[k].ids and tgt[k].ids]
    if skip_long:
        room = model.cfg.max_positions - 1
        long = {k for k in todo if too_long(model, src[k], tgt[k])}
        for k in sorted(long):
            warnings.warn(f"line {k + 1} has {len(src[k].ids)} source and {len(tgt[k].ids)} target pieces, more "
                          f"than the model's {room}: no alignment (an empty line)", stacklevel=2)
        todo = [k for k in todo if k not in long]
    maps = alignment_maps(model, [src[k] for k in todo], [tgt[k] for k in todo], method=spec.method,
                          shift=spec.shift, batch_size=batch_size, heads=spec.needs_heads, layer=spec.layer)
    out: list[set[Link]] = [set() for _ in sources]
    for k, m in zip(todo, maps):
        out[k] = spec.links_of(m)
    return out


def unit_scores(maps: Sequence[WordMaps], gold, *, eos: str = "drop", symmetrize: str = "none"
                ) -> dict[Unit, float]:
    """Corpus AER of every head and every whole layer."""
    layers = maps[0].layers.shape[0]
    heads = 0 if maps[0].heads is None else maps[0].heads.shape[1]
    units = [(lay, h) for lay in range(layers) for h in [*range(heads), None]]
    return {u: score_alignments([m.links(*u, eos=eos, symmetrize=symmetrize) for m in maps], gold).aer
            for u in units}


def choose_units(maps: Sequence[WordMaps], gold, *, eos: str = "drop", symmetrize: str = "none",
                 max_units: int = 8) -> tuple[tuple[Unit, ...], float, dict[Unit, float]]:
    """The units to average, chosen on `gold`: every single unit scored, then the best k heads (layers, for maps
    without heads) averaged for k = 2..max_units (best first by their own AER); returns (units, their AER, the
    single-unit AERs)."""
    single = unit_scores(maps, gold, eos=eos, symmetrize=symmetrize)
    ranked = sorted(single, key=lambda u: single[u])
    best_units, best = (ranked[0],), single[ranked[0]]
    pool = [u for u in ranked if u[1] is not None] or ranked  # heads; whole layers when maps hold no heads
    for k in range(2, min(max_units, len(pool)) + 1):
        units = tuple(pool[:k])
        e = score_alignments([m.links(units=units, eos=eos, symmetrize=symmetrize) for m in maps], gold).aer
        if e < best:
            best_units, best = units, e
    return best_units, best, single


# ------------------------------------------------------------------------------ the papers' own protocol

# AER % on all 508 RWTH de-en lines, each method's best layer, one argmax link per target word, no
# symmetrization, as the papers report them: weights and norms Kobayashi et al. 2020, ALTI+ Ferrando et al. 2022
# (whose own attention-weight figures are 49.9 AWO / 28.2 AWI).
PUBLISHED_AER = {"weights": {"awo": 47.7, "awi": 29.8}, "norms": {"awo": 41.4, "awi": 25.0},
                 "alti": {"awo": 38.9, "awi": 26.0}}
# The EOS column: Kobayashi et al. extract with fairseq, whose hard alignment leaves EOS out of the argmax;
# the ALTI+ scripts keep it, and a word whose best column is EOS gets no link.
PAPER_EOS = {"weights": "drop", "norms": "drop", "alti": "null"}


@dataclass(frozen=True)
class ProtocolResult:
    """One method and shift scored as its paper scores it; `published` is the paper's AER % (the baseline)."""

    method: str
    shift: str
    eos: str
    layer: int  # the best decoder layer on all the given lines, 0-based
    score: AERScore
    interval: tuple[float, float]  # bootstrap interval of score.aer over sentences
    per_layer: tuple[float, ...]  # every layer's AER
    published: float | None


def papers_protocol(model, sources: Sequence[Words], targets: Sequence[Words], gold, *,
                    methods: Sequence[str] = ATTENTION_METHODS, shifts: Sequence[str] = SHIFTS, draws: int = 1000,
                    level: float = 0.95, seed: int = 0, batch_size: int = 32,
                    eos: str | None = None) -> list[ProtocolResult]:
    """Each method under its paper's protocol: whole-layer maps (weights: heads averaged; norms ‖Σ_h α f_h(x)‖;
    ALTI+ the layer's source contributions), one argmax link per target word with the paper's EOS rule, no
    symmetrization, the layer with the lowest AER on all the given lines; its AER with a bootstrap interval
    over sentences (`bootstrap_aer`). The interval resamples sentences for the chosen layer; the choice of
    layer is not resampled (the papers report the best layer without one). `eos`: another EOS rule for every
    method (a sensitivity check), None for each paper's own."""
    if eos is not None and eos not in EOS_RULES:
        raise ValueError(f"eos must be one of {EOS_RULES} or None, got {eos!r}")
    out = []
    for method in methods:
        rule = eos or PAPER_EOS.get(method, "drop")
        for shift in shifts:
            maps = alignment_maps(model, sources, targets, method=method, shift=shift, batch_size=batch_size,
                                  heads=False)
            links = [[m.links(layer, None, eos=rule) for m in maps] for layer in range(len(model.dec))]
            scores = [score_alignments(x, gold) for x in links]
            best = min(range(len(scores)), key=lambda lay: scores[lay].aer)
            out.append(ProtocolResult(method, shift, rule, best, scores[best],
                                      bootstrap_aer(links[best], gold, draws=draws, level=level, seed=seed),
                                      tuple(x.aer for x in scores), PUBLISHED_AER.get(method, {}).get(shift)))
    return out

"""Cross-attention heads as word aligners: alignment error rate (Och & Ney 2003) per head and per layer.

    refs = read_alignments("test.talp", base=1)                     # "1-1 2-3 3p2" (p or ? = possible link)
    score_alignments(hyps, refs)                                      # AERScore: aer, precision, recall
    bootstrap_aer(hyps, refs)                                         # 95 % interval over sentences
    table = alignment_head_scores(cross, refs)                         # AER per head, layer mean, all mean
    table = alignment_head_scores(cross)                               # no references: agreement instead

`cross` is per sentence an (L, H, T, S) array of cross-attention over WORDS or pieces, whichever the
references index (merge pieces first with `workbench.charts.merge_attention` / `to_words`).
Rows are the output tokens y_1..y_T. With teacher forcing, decoder position t reads y_{t-1} and predicts
y_t, so "predict" alignment takes row t for y_t (Garg et al. 2019), "input" takes the row where y_t is the
decoder input, one later (Chen et al. 2020's shift-att, often better); the caller picks which rows to pass.

Without references, each head is scored against the model's own aligner: the argmax of cross-attention
averaged over every head of every layer ("model-average aligner"), reported as 1 - AER = agreement.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...core.batching import corpus_batches
from ...core.heads import Head, hook_name
from ..attention.head_stats import capture_attention, fit_to_positions

Link = tuple[int, int]  # (source index, target index), Pharaoh order


def parse_pharaoh(line: str, *, base: int = 0, swap: bool = False) -> tuple[set[Link], set[Link]]:
    """"i-j" sure links and "i?j" or "ipj" possible links -> (sure, possible ⊇ sure), 0-based, source first.

    `base`: the index of the first word in the file (1 for the talp gold files, 0 for Pharaoh output);
    `swap`: the file writes target first."""
    sure, possible = set(), set()
    for item in line.split():
        sep = "-" if "-" in item else "?" if "?" in item else "p" if "p" in item else None
        parts = item.split(sep) if sep else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"bad alignment link {item!r} in {line.strip()!r}: expected 'i-j', 'i?j' or 'ipj'")
        i, j = int(parts[0]) - base, int(parts[1]) - base
        if i < 0 or j < 0:
            raise ValueError(f"link {item!r} is below index {base}: is the file {1 - base}-based?")
        link = (j, i) if swap else (i, j)
        possible.add(link)
        if sep == "-":
            sure.add(link)
    return sure, possible


def read_alignments(path, *, base: int = 0, swap: bool = False) -> list[tuple[set[Link], set[Link]]]:
    """One (sure, possible) pair per line of an alignment file (see `parse_pharaoh`); errors name the line."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            try:
                out.append(parse_pharaoh(line, base=base, swap=swap))
            except ValueError as exc:
                raise ValueError(f"{path} line {n}: {exc}") from None
    return out


def format_pharaoh(links: Iterable[Link]) -> str:
    """Links as one Pharaoh line, "i-j" 0-based, source first, sorted by target then source word."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links, key=lambda link: (link[1], link[0])))


def aer(predicted: Iterable[Link], sure: Iterable[Link], possible: Iterable[Link] | None = None) -> float:
    """1 - (|A∩S| + |A∩P|) / (|A| + |S|), with P ⊇ S (P = S when not given)."""
    a, s = set(predicted), set(sure)
    p = set(possible) | s if possible is not None else s
    if not a and not s:
        return 0.0
    return 1.0 - (len(a & s) + len(a & p)) / (len(a) + len(s))


@dataclass(frozen=True)
class AERScore:
    """Corpus alignment error rate (Och & Ney 2003) with its parts; counts summed over sentences first."""

    aer: float
    precision: float  # |A∩P| / |A|
    recall: float  # |A∩S| / |S|
    links: int  # |A|
    sure: int  # |S|
    hit_sure: int  # |A∩S|
    hit_possible: int  # |A∩P|
    sentences: int

    def __str__(self) -> str:
        return (f"AER {100 * self.aer:.1f} %  precision {100 * self.precision:.1f} %  recall {100 * self.recall:.1f} %"
                f"  ({self.links} links, {self.sure} sure gold links, {self.sentences} sentences)")


def score_alignments(predicted: Sequence[Iterable[Link]],
                     gold: Sequence[set[Link] | tuple[set[Link], set[Link]]]) -> AERScore:
    """Corpus AER, precision and recall of `predicted` (link sets) against `gold` ((sure, possible) pairs as
    `read_alignments` gives, or sure-only sets). Same sums as lilt/alignment-scripts' `aer.py`."""
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} predicted alignments but {len(gold)} gold ones: the files must have "
                         "one line per sentence pair")
    hit_s = hit_p = n_a = n_s = 0
    for a, g in zip(predicted, gold):
        s, p = g if isinstance(g, tuple) else (g, g)
        a, s = set(a), set(s)
        p = s | set(p)
        hit_s += len(a & s)
        hit_p += len(a & p)
        n_a += len(a)
        n_s += len(s)
    total = n_a + n_s
    return AERScore(aer=1.0 - (hit_s + hit_p) / total if total else 0.0, precision=hit_p / n_a if n_a else 0.0,
                    recall=hit_s / n_s if n_s else 0.0, links=n_a, sure=n_s, hit_sure=hit_s, hit_possible=hit_p,
                    sentences=len(predicted))


def bootstrap_aer(predicted: Sequence[Iterable[Link]],
                  gold: Sequence[set[Link] | tuple[set[Link], set[Link]]], *, draws: int = 1000,
                  level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of the corpus AER over sentences: `draws` resamples of the sentences with
    replacement, each scored from its summed counts as `score_alignments` does (Koehn 2004's resampling, applied
    to AER). Seeded, so a table can be regenerated exactly."""
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} predicted alignments but {len(gold)} gold ones")
    if not predicted:
        raise ValueError("no sentences to resample")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    counts = np.zeros((len(predicted), 4))  # per sentence |A∩S|, |A∩P|, |A|, |S|
    for k, (a, g) in enumerate(zip(predicted, gold)):
        s, p = g if isinstance(g, tuple) else (g, g)
        a, s = set(a), set(s)
        p = s | set(p)
        counts[k] = len(a & s), len(a & p), len(a), len(s)
    rng = np.random.default_rng(seed)
    sums = counts[rng.integers(0, len(predicted), size=(draws, len(predicted)))].sum(1)  # (draws, 4)
    total = sums[:, 2] + sums[:, 3]
    aers = np.where(total > 0, 1.0 - (sums[:, 0] + sums[:, 1]) / np.maximum(total, 1), 0.0)
    tail = (1.0 - level) / 2
    low, high = np.quantile(aers, [tail, 1.0 - tail])
    return float(low), float(high)


def corpus_aer(predicted: Sequence[Iterable[Link]], sure: Sequence[Iterable[Link]],
               possible: Sequence[Iterable[Link]] | None = None) -> float:
    """AER over a corpus: counts summed over sentences before the ratio (as the standard scripts do)."""
    if len(predicted) != len(sure):
        raise ValueError(f"{len(predicted)} predicted alignments but {len(sure)} references")
    gold = [(set(s), set(possible[k]) if possible is not None else set(s)) for k, s in enumerate(sure)]
    return score_alignments(predicted, gold).aer


def attention_links(matrix: np.ndarray, *, method: str = "argmax", threshold: float = 0.5) -> set[Link]:
    """Links from a (T, S) attention matrix: each target token to its argmax source token, or every
    cell above `threshold`."""
    m = np.asarray(matrix)
    if m.ndim != 2:
        raise ValueError(f"need a (T, S) matrix, got shape {m.shape}")
    if method == "argmax":
        return {(int(s), t) for t, s in enumerate(m.argmax(1))}
    if method == "threshold":
        return {(int(s), int(t)) for t, s in zip(*np.nonzero(m > threshold))}
    raise ValueError(f"method must be 'argmax' or 'threshold', got {method!r}")


def _reference_links(cross, arrays: list[np.ndarray], references) -> tuple[str, list[set[Link]],
                                                                           list[set[Link]] | None]:
    """`alignment_head_scores`' references as (label, sure, possible): the model-average aligner's argmax links
    when there are none; else the references (picked by `cross.ids` when `cross` skipped sentences), each link
    checked against its sentence's attention shape."""
    if references is None:
        label = "model-average aligner (argmax of all heads, all layers)"
        sure = [attention_links(a.mean((0, 1)), method="argmax") for a in arrays]
        possible = None
    else:
        ids = getattr(cross, "ids", None)
        if ids is not None and len(references) == len(ids) + len(cross.skipped) != len(arrays):
            references = [references[i] for i in ids]  # the corpus's references; cross skipped some sentences
        if len(references) != len(arrays):
            raise ValueError(f"{len(references)} references for {len(arrays)} sentences")
        label = "reference alignments"
        sure, possible = [], []
        for ref in references:
            s, p = ref if isinstance(ref, tuple) else (ref, ref)
            sure.append(set(s))
            possible.append(set(p) | set(s))
        for n, (a, s) in enumerate(zip(arrays, possible)):
            t, src = a.shape[2:]
            bad = [(i, j) for i, j in s if not (0 <= i < src and 0 <= j < t)]
            if bad:
                raise ValueError(f"sentence {n}: links {sorted(bad)[:5]} fall outside its {t} x {src} attention "
                                 "(target x source); do the references index words while the attention has pieces?")
    return label, sure, possible


def alignment_head_scores(
    cross: Sequence[np.ndarray],
    references: Sequence[set[Link] | tuple[set[Link], set[Link]]] | None = None,
    *,
    method: str = "argmax",
    threshold: float = 0.5,
):
    """Corpus AER of every cross-attention head, every layer's head mean and the all-layer mean.

    `cross[n]` is sentence n's (L, H, T, S) attention; `references[n]` its links as a set (sure only) or
    (sure, possible) as `parse_pharaoh` returns. Returns a DataFrame sorted best first with columns
    head_id ("cross:1:2"; None for averages), kind, layer, head_index ("mean" for averages), aer, agreement
    (1 - aer), reference.
    """
    import pandas as pd

    if not cross:
        raise ValueError("no sentences")
    arrays = [np.asarray(c, dtype=np.float64) for c in cross]
    shapes = {a.shape[:2] for a in arrays}
    if len(shapes) != 1 or arrays[0].ndim != 4:
        raise ValueError(f"every sentence needs an (L, H, T, S) array with the same L and H, got {sorted(shapes)}")
    n_layers, n_heads = arrays[0].shape[:2]
    label, sure, possible = _reference_links(cross, arrays, references)
    rows = []

    def score(pick, layer, head):
        pred = [attention_links(pick(a), method=method, threshold=threshold) for a in arrays]
        e = corpus_aer(pred, sure, possible)
        head_id = str(Head("cross", layer, head)) if isinstance(head, int) and isinstance(layer, int) else None
        rows.append({"head_id": head_id, "kind": "cross", "layer": layer, "head_index": head, "aer": e,
                     "agreement": 1.0 - e, "reference": label})

    for layer in range(n_layers):
        for head in range(n_heads):
            score(lambda a, lay=layer, h=head: a[lay, h], layer, head)
        score(lambda a, lay=layer: a[lay].mean(0), layer, "mean")
    score(lambda a: a.mean((0, 1)), "all", "mean")
    df = pd.DataFrame(rows)
    return df.sort_values("aer", kind="stable").reset_index(drop=True)


class CorpusAttention(list):
    """A list of per-sentence arrays that also says which corpus sentences they are (`ids`) and which were
    left out (`skipped`: longer than the model's positions)."""

    def __init__(self, arrays, ids: Sequence[int], skipped: Sequence[int]):
        super().__init__(arrays)
        self.ids, self.skipped = list(ids), list(skipped)


def corpus_cross_attention(model, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *,
                           shift: str = "predict", batch_size: int = 64) -> CorpusAttention:
    """Per sentence the (L, H, T, S) cross-attention to score as alignments, teacher-forced on `targets`.

    Sources and targets end with EOS; both EOS are dropped (references do not link them), so row t is
    target token t and column s source token s. `shift`: "predict" (the row that predicts y_t) or "input"
    (the row that reads y_t). A pair with a side longer than the model's max_positions is skipped (alignments
    need whole sentences) with a warning; `.ids`/`.skipped` on the result say which, and
    `alignment_head_scores` picks the matching references by those ids.
    """
    if shift not in ("predict", "input"):
        raise ValueError(f"shift must be 'predict' or 'input', got {shift!r}")
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    cfg = model.cfg
    fitted = fit_to_positions(cfg.max_positions, sources, targets, cut_targets=False)
    if fitted.report():
        warnings.warn(fitted.report("corpus_cross_attention"), stacklevel=2)
    sources, targets = fitted.sources, fitted.targets
    names = model.hook_names(hook_name("cross", "*"))
    for k, t in enumerate(targets):
        if len(t) < 2:
            raise ValueError(f"target {k} has {len(t)} tokens: need at least one word and EOS")
    out: list[np.ndarray] = []
    batches = corpus_batches(sources, targets, pad_id=cfg.pad_id, start_id=cfg.start_id, batch_size=batch_size,
                             order=range(len(sources)), device=model.device)
    with torch.no_grad():
        for idx, b in batches:
            trace = capture_attention(model, b.src, b.tgt_in, names)
            cross = trace.stack(hook_name("cross", "*")).float().cpu().numpy()  # (L, B, H, T, S)
            for i, k in enumerate(idx):
                n_words = len(targets[k]) - 1
                rows = slice(0, n_words) if shift == "predict" else slice(1, n_words + 1)
                out.append(cross[:, i, :, rows, : len(sources[k]) - 1])
    return CorpusAttention(out, fitted.ids, fitted.skipped)

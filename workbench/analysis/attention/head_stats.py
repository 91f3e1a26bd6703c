"""Per-head attention statistics, per sentence and over a corpus (Voita et al. 2019; Clark et al. 2019).

    table = head_stats(trace, pad_id=0, eos_id=2)            # one batch: per-sentence values
    table = corpus_head_stats(model, sources, targets)        # thousands of sentences, batched
    table.summary()                                           # DataFrame: one row per (kind, layer, head)
    table.rank("prev")                                        # heads sorted by a statistic
    table.sentences("enc_self", 1, 3, "eos", top=10)          # where does this head do it most?

Every statistic is a mean over a sentence's real query positions of a per-row quantity; the corpus value
is the token-weighted mean (sum of row values / number of rows), computed in float64 from per-sentence
sums, so it does not depend on how sentences were batched (tested).

Sentences longer than the model's `max_positions` (`fit_to_positions`): a too-long *target* is cut to fit,
which is exact for the rows kept (the decoder is causal and cross-attention reads only the source, so the
first positions attend the same way whatever follows them); a too-long *source* is skipped, since cutting it
would change every encoder row. The counts are in `HeadStats.truncated` / `.skipped` and a warning.
"""

from __future__ import annotations

import dataclasses
import unicodedata
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...core.batching import corpus_batches, decoder_input
from ...core.heads import KINDS, AttentionKind, Head, kind_of
from ...core.masks import real_positions
from ...core.protocols import Progress
from ...core.trace import Trace

STATS: dict[str, str] = {
    "entropy": "entropy of the row (nats)",
    "entropy_norm": "entropy / log(number of visible keys): 0 = one key, 1 = uniform",
    "max": "largest weight of the row (Voita et al.'s confidence)",
    "distance": "mean |key - diagonal| in tokens (diagonal scaled by length for cross-attention)",
    "diag_distance": "distance / (keys - 1): 0 = on the diagonal, 1 = at the far end",
    "self": "weight on the query's own position (self-attention)",
    "prev": "weight on the previous token (self-attention)",
    "next": "weight on the next token (encoder self-attention; the causal decoder cannot see it)",
    "prev_top": "share of rows whose largest weight is on the previous token, over rows that have one (Voita et "
                "al. 2019's positional test)",
    "next_top": "share of rows whose largest weight is on the next token, over rows that have one (encoder)",
    "first": "weight on the first key (a common sink)",
    "eos": "weight on EOS keys (the source's </s>; sink)",
    "punct": "weight on punctuation keys (when their ids are given)",
    "rare": "share of rows whose largest weight is on the sentence's rarest key (when token counts are given; "
            "Voita et al. 2019's rare-words heads)",
    "monotonic": "cross-attention: share of consecutive target steps whose argmax source position does not go back",
}
_NAN_UNLESS = {"self": ("enc_self", "dec_self"), "prev": ("enc_self", "dec_self"), "next": ("enc_self",),
               "prev_top": ("enc_self", "dec_self"), "next_top": ("enc_self",), "monotonic": ("cross",)}


def _masks(trace: Trace, kind: AttentionKind, pad_id: int | None, lq: int, lk: int, batch: int):
    """(B, Lq) real queries and (B, Lk) real keys, from the ids when the trace has them (decoder inputs by their
    lengths: the start token is real even when it is the padding id, as Marian's is)."""
    def real(ids: torch.Tensor | None, length: int, decoder: bool) -> torch.Tensor:
        if ids is None or pad_id is None:
            return torch.ones(batch, length, dtype=torch.bool)
        ids = ids.cpu()
        if ids.shape != (batch, length):
            raise ValueError(f"{kind} attention is ({batch}, {length}) on this side but the ids are {tuple(ids.shape)}")
        return real_positions(ids, pad_id, decoder=decoder)

    q_dec, k_dec = kind != "enc_self", kind == "dec_self"
    q_ids = trace.tgt if q_dec else trace.src
    k_ids = trace.tgt if k_dec else trace.src
    return real(q_ids, lq, q_dec), real(k_ids, lk, k_dec), k_ids


def block_stats(
    probs: torch.Tensor,
    kind: AttentionKind,
    q_real: torch.Tensor,
    k_real: torch.Tensor,
    *,
    key_ids: torch.Tensor | None = None,
    eos_id: int | None = None,
    punct_ids: Sequence[int] | None = None,
    key_counts: torch.Tensor | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Per-sentence sums and row counts of every statistic for one block: ({stat: (B, H)}, {stat: (B,)}).

    `probs` (B, H, Lq, Lk); padded query rows are left out, padded keys carry no weight already.
    `key_counts` (vocabulary,): corpus frequency of each key id, for "rare" (the rarest real key of each sentence,
    EOS excluded; ties: the first).
    """
    if probs.dim() != 4:
        raise ValueError(f"attention must be (B, H, Lq, Lk), got shape {tuple(probs.shape)}")
    # per-row quantities in float32 (a few passes over the big tensor), sums over rows in float64
    p = probs.detach()
    p = p.float() if p.dtype != torch.float64 else p
    dev, dt = p.device, p.dtype
    qm = q_real.to(dev)
    km = k_real.to(dev)
    q_len = qm.sum(1).to(dt).clamp(min=1)
    k_len = km.sum(1).to(dt).clamp(min=1)  # (B,)
    per_row, arg = _position_stats(p, kind, km, q_len, k_len)
    per_row |= _key_stats(p, arg, km, key_ids=key_ids, eos_id=eos_id, punct_ids=punct_ids, key_counts=key_counts)
    per_row = {k: per_row[k] for k in STATS if k in per_row}
    sums, counts = _row_sums(per_row, arg, kind, qm, km)
    return {k: v.cpu() for k, v in sums.items()}, {k: v.cpu() for k, v in counts.items()}


def _position_stats(p: torch.Tensor, kind: AttentionKind, km: torch.Tensor, q_len: torch.Tensor, k_len: torch.Tensor
                    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """`block_stats`'s statistics of where a row attends ({stat: (B, H, Lq)}) and each row's top key (B, H, Lq)."""
    b, h, lq, lk = p.shape
    dev, dt = p.device, p.dtype
    qi = torch.arange(lq, device=dev, dtype=dt)
    kj = torch.arange(lk, device=dev, dtype=dt)
    if kind == "cross":  # the diagonal of a (T, S) matrix: target step t sits at source t·(S-1)/(T-1)
        diag = qi[None, :] * ((k_len - 1) / (q_len - 1).clamp(min=1))[:, None]  # (B, Lq)
    else:
        diag = qi[None, :].expand(b, lq)
    dist = (kj[None, None, :] - diag[:, :, None]).abs()  # (B, Lq, Lk)

    per_row: dict[str, torch.Tensor] = {}  # each (B, H, Lq)
    per_row["entropy"] = -torch.special.xlogy(p, p).sum(-1)
    n_vis = km.sum(1).to(dt)[:, None, None].expand(b, 1, lq)  # (B, 1, Lq) keys a row may see
    if kind == "dec_self":  # causal: row i sees keys 0..i
        n_vis = torch.minimum(n_vis, qi + 1)
    per_row["entropy_norm"] = torch.where(n_vis > 1, per_row["entropy"] / n_vis.clamp(min=2).log(),
                                          torch.zeros_like(per_row["entropy"]))
    per_row["max"] = p.amax(-1)
    per_row["distance"] = torch.einsum("bhqk,bqk->bhq", p, dist)
    per_row["diag_distance"] = per_row["distance"] / (k_len - 1).clamp(min=1)[:, None, None]
    # diagonals are views: no pass over the whole tensor
    for stat, off in (("self", 0), ("prev", -1), ("next", 1)):
        d = torch.diagonal(p, off, dim1=-2, dim2=-1)  # (B, H, n)
        row = torch.zeros(b, h, lq, device=dev, dtype=dt)
        first_row = max(0, -off)
        row[..., first_row : first_row + d.size(-1)] = d
        per_row[stat] = row
    per_row["first"] = p[..., 0]
    arg = p.argmax(-1)  # (B, H, Lq)
    per_row["prev_top"] = (arg == (qi - 1).long()).to(dt)
    per_row["next_top"] = (arg == (qi + 1).long()).to(dt)
    return per_row, arg


def _key_stats(p: torch.Tensor, arg: torch.Tensor, km: torch.Tensor, *, key_ids: torch.Tensor | None,
               eos_id: int | None, punct_ids: Sequence[int] | None, key_counts: torch.Tensor | None
               ) -> dict[str, torch.Tensor]:
    """`block_stats`'s statistics of what a row attends to (EOS, punctuation, the rarest key): {stat: (B, H, Lq)},
    NaN rows where the ids needed are not given."""
    b, h, lq, _ = p.shape
    dev, dt = p.device, p.dtype
    per_row: dict[str, torch.Tensor] = {}
    nan_rows = torch.full((b, h, lq), float("nan"), dtype=dt, device=dev)
    feats = {}  # key features read with one matmul: (B, Lk) each
    if key_ids is not None and eos_id is not None:
        feats["eos"] = key_ids.to(dev) == eos_id
    if key_ids is not None and punct_ids:
        feats["punct"] = torch.isin(key_ids.to(dev), torch.tensor(list(punct_ids), device=dev))
    if feats:
        f = torch.stack(list(feats.values()), -1).to(dt)  # (B, Lk, F)
        mass = torch.matmul(p, f[:, None])  # (B, H, Lq, F)
        for i, name in enumerate(feats):
            per_row[name] = mass[..., i]
    if key_ids is not None and key_counts is not None:
        ids = key_ids.to(dev)
        freq = key_counts.to(dev, torch.float64)[ids]
        skip = ~km | ((ids == eos_id) if eos_id is not None else torch.zeros_like(km))
        rarest = torch.where(skip, torch.inf, freq).argmin(-1)  # (B,)
        per_row["rare"] = (arg == rarest[:, None, None]).to(dt)
    for name in ("eos", "punct", "rare"):
        per_row.setdefault(name, nan_rows)
    return per_row


def _row_sums(per_row: dict[str, torch.Tensor], arg: torch.Tensor, kind: AttentionKind, qm: torch.Tensor,
              km: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """`block_stats`'s per-sentence sums over real query rows ({stat: (B, H)}) and the rows counted ({stat: (B,)})."""
    b, h, lq = arg.shape
    dev, dt = arg.device, per_row["max"].dtype
    qi = torch.arange(lq, device=dev, dtype=dt)
    rows = qm.to(torch.float64)  # (B, Lq)
    n_rows = rows.sum(1)  # (B,)
    sums = {k: (v.to(torch.float64) * rows[:, None, :]).sum(-1) for k, v in per_row.items()}  # (B, H)
    counts = {k: n_rows.clone() for k in per_row}
    # the argmax tests count only rows that have a previous / next key (a first row cannot point back)
    has = {"prev_top": qi[None, :] >= 1, "next_top": qi[None, :] + 1 < km.sum(1, keepdim=True).to(dt)}
    for stat, ok in has.items():
        r = rows * ok.to(torch.float64)
        sums[stat] = (per_row[stat].to(torch.float64) * r[:, None, :]).sum(-1)
        counts[stat] = r.sum(1)
    # monotonicity counts pairs of consecutive real target steps, not rows
    pair = (qm[:, 1:] & qm[:, :-1]).to(torch.float64)  # (B, Lq-1)
    forward = (arg[..., 1:] >= arg[..., :-1]).to(torch.float64)  # (B, H, Lq-1)
    sums["monotonic"] = (forward * pair[:, None]).sum(-1)
    counts["monotonic"] = pair.sum(1)
    for stat, kinds in _NAN_UNLESS.items():
        if kind not in kinds:
            sums[stat] = torch.full((b, h), float("nan"), dtype=torch.float64, device=dev)
    return sums, counts


@dataclass(frozen=True)
class HeadStats:
    """Per-sentence sums and counts of each statistic for every head of every block.

    `sums[stat]` is (N, blocks, H) float64, `counts[stat]` (N, blocks); `blocks` lists (kind, layer).
    `sentence_ids` says which corpus sentence each row is. `truncated` lists the corpus sentences whose
    target was cut to the model's positions, `skipped` those left out (source too long).
    """

    blocks: tuple[tuple[str, int], ...]
    sums: dict[str, np.ndarray]
    counts: dict[str, np.ndarray]
    sentence_ids: np.ndarray
    truncated: tuple[int, ...] = ()
    skipped: tuple[int, ...] = ()
    block_heads: tuple[int, ...] = ()
    """Heads of each block when the stacks differ (ModelConfig enc_heads/dec_heads); the arrays are padded
    with NaN to the widest block. Empty: every block has n_heads."""

    @property
    def n_heads(self) -> int:
        """H of the arrays: the heads of the widest block."""
        return next(iter(self.sums.values())).shape[2]

    def heads_of(self, block: int) -> int:
        """Heads of block number `block` (an index into `blocks`)."""
        return self.block_heads[block] if self.block_heads else self.n_heads

    def values(self, stat: str) -> np.ndarray:
        """Corpus value (blocks, H): token-weighted mean over every sentence."""
        self._check(stat)
        total = self.sums[stat].sum(0)
        count = self.counts[stat].sum(0)[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, total / np.where(count > 0, count, 1), np.nan)

    def per_sentence(self, stat: str) -> np.ndarray:
        """(N, blocks, H) sentence means (NaN where the sentence has no row for it)."""
        self._check(stat)
        c = self.counts[stat][:, :, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(c > 0, self.sums[stat] / np.where(c > 0, c, 1), np.nan)

    def summary(self):
        """pandas DataFrame: head_id (the `Head` spelling, "cross:1:0"), kind, layer, head_index and one column per
        statistic (corpus values). No column is named "head": it would shadow `DataFrame.head`."""
        import pandas as pd

        rows = []
        vals = {s: self.values(s) for s in self.sums}
        for bi, (kind, layer) in enumerate(self.blocks):
            for head in range(self.heads_of(bi)):
                rows.append({"head_id": str(Head(kind, layer, head)), "kind": kind, "layer": layer, "head_index": head,
                             **{s: float(v[bi, head]) for s, v in vals.items()}})
        return pd.DataFrame(rows)

    def rank(self, stat: str, *, kind: str | None = None, descending: bool = True):
        """Heads sorted by a statistic (NaN last), optionally of one kind only."""
        df = self.summary()
        if kind is not None:
            df = df[df["kind"] == kind]
        return df.sort_values(stat, ascending=not descending, na_position="last", kind="stable").reset_index(drop=True)

    def sentences(self, *spec, top: int = 10, largest: bool = True):
        """The sentences where a head shows a statistic the most (or least): DataFrame sentence, value.
        `sentences(head, stat)` with a `Head` or its spelling ("cross:1:0"), or `sentences(kind, layer, head, stat)`."""
        import pandas as pd

        if len(spec) == 2:
            parsed, stat = Head.parse(spec[0]), spec[1]
            kind, layer, head = parsed.kind, parsed.layer, parsed.head
        elif len(spec) == 4:
            kind, layer, head, stat = spec
        else:
            raise TypeError("sentences(head, stat) or sentences(kind, layer, head, stat)")

        bi = self.block_index(kind, layer)
        if not 0 <= head < self.heads_of(bi):
            raise IndexError(f"head {head} out of range: block ({kind!r}, {layer}) has {self.heads_of(bi)} heads")
        v = self.per_sentence(stat)[:, bi, head]
        order = np.argsort(-v if largest else v, kind="stable")
        order = [i for i in order if np.isfinite(v[i])][:top]
        return pd.DataFrame({"sentence": self.sentence_ids[order], "value": v[order]})

    def block_index(self, kind: str, layer: int) -> int:
        try:
            return self.blocks.index((kind, layer))
        except ValueError:
            raise KeyError(f"no block ({kind!r}, {layer}); blocks: {list(self.blocks)}") from None

    def _check(self, stat: str) -> None:
        if stat not in self.sums:
            raise KeyError(f"unknown statistic {stat!r}; known: {sorted(self.sums)}")

    @staticmethod
    def concat(parts: Sequence[HeadStats]) -> HeadStats:
        if not parts:
            raise ValueError("nothing to concatenate")
        blocks = parts[0].blocks
        for p in parts[1:]:
            if p.blocks != blocks:
                raise ValueError(f"blocks differ: {p.blocks} vs {blocks}")
        ids = np.concatenate([p.sentence_ids for p in parts])
        order = np.argsort(ids, kind="stable")  # sentence order, whatever the batching was
        return HeadStats(
            blocks,
            {s: np.concatenate([p.sums[s] for p in parts])[order] for s in parts[0].sums},
            {s: np.concatenate([p.counts[s] for p in parts])[order] for s in parts[0].counts},
            ids[order],
            tuple(sorted(i for p in parts for i in p.truncated)),
            tuple(sorted(i for p in parts for i in p.skipped)),
            parts[0].block_heads,
        )


def head_stats(
    trace: Trace,
    *,
    pad_id: int | None = 0,
    eos_id: int | None = 2,
    src_punct: Sequence[int] | None = None,
    tgt_punct: Sequence[int] | None = None,
    kinds: Sequence[AttentionKind] = KINDS,
    sentence_ids: Sequence[int] | None = None,
    src_counts: torch.Tensor | None = None,
    tgt_counts: torch.Tensor | None = None,
) -> HeadStats:
    """Statistics of every captured attention block of a batch trace (needs `*.hook_probs` and the ids).
    `src_counts` / `tgt_counts`: token frequencies (vocabulary,) for the "rare" statistic (NaN without them)."""
    blocks, sums, counts = [], {}, {}
    for kind in kinds:
        for layer in range(trace.layers(kind)):
            probs = trace.attention(kind, layer)
            b, _, lq, lk = probs.shape
            q_real, k_real, k_ids = _masks(trace, kind, pad_id, lq, lk, b)
            punct = tgt_punct if kind == "dec_self" else src_punct
            counts_k = tgt_counts if kind == "dec_self" else src_counts
            s, c = block_stats(probs, kind, q_real, k_real, key_ids=k_ids, eos_id=eos_id, punct_ids=punct,
                               key_counts=counts_k)
            blocks.append((kind, layer))
            for k in s:
                sums.setdefault(k, []).append(s[k].numpy())
                counts.setdefault(k, []).append(c[k].numpy())
    if not blocks:
        raise ValueError(f"the trace has no attention probabilities of kinds {list(kinds)}; capture '*.hook_probs'")
    n = sums["entropy"][0].shape[0]
    ids = np.arange(n) if sentence_ids is None else np.asarray(sentence_ids)
    if len(ids) != n:
        raise ValueError(f"{len(ids)} sentence ids for a batch of {n}")
    heads = tuple(a.shape[1] for a in sums["entropy"])
    widest = max(heads)
    if min(heads) < widest:  # stacks with their own head counts: NaN columns pad the narrower blocks
        sums = {k: [np.pad(a, ((0, 0), (0, widest - a.shape[1])), constant_values=np.nan) for a in v]
                for k, v in sums.items()}
    return HeadStats(tuple(blocks), {k: np.stack(v, 1) for k, v in sums.items()},
                     {k: np.stack(v, 1) for k, v in counts.items()}, ids,
                     block_heads=heads if min(heads) < widest else ())


def is_punctuation(text: str) -> bool:
    """Punctuation marks only: every character of Unicode category P* (".", ",", "--", "?!", and "%", which Unicode
    files as punctuation); "'s", "3.", "€" or "+" are not. The one rule for pieces (`punctuation_ids`) and words
    (`word_align.punctuation_apart`)."""
    return bool(text) and all(unicodedata.category(ch).startswith("P") for ch in text)


def has_punctuation(text: str) -> bool:
    """Whether any character of `text` is a punctuation mark (Unicode category P*): "angenommen.", "'s", "."."""
    return any(unicodedata.category(ch).startswith("P") for ch in text)


def punctuation_ids(pieces: Sequence[str]) -> list[int]:
    """Ids of vocabulary pieces that are only punctuation once the word marker (▁, Ġ, @@) is removed."""
    return [i for i, piece in enumerate(pieces)
            if is_punctuation(piece.replace("\u2581", "").replace("\u0120", "").removesuffix("@@"))]


def token_counts(rows: Sequence[Sequence[int]], vocab: int) -> torch.Tensor:
    """How often each id occurs in `rows`: (vocab,) int64, for the "rare" statistic."""
    flat = torch.tensor([i for r in rows for i in r], dtype=torch.long)
    return torch.bincount(flat, minlength=vocab)[:vocab] if len(flat) else torch.zeros(vocab, dtype=torch.long)


@dataclass(frozen=True)
class Fitted:
    """A corpus made to fit the model's positions: `ids` are the corpus indices kept (in corpus order)."""

    sources: list[list[int]]
    targets: list[list[int]]
    ids: list[int]
    truncated: list[int]
    skipped: list[int]

    def report(self, what: str = "corpus") -> str | None:
        """One line saying what was cut or left out, or None when every sentence fit."""
        if not self.truncated and not self.skipped:
            return None
        return (f"{what}: {len(self.truncated)} target(s) cut to the model's max_positions, {len(self.skipped)} "
                f"sentence(s) skipped (source longer than max_positions); corpus ids cut "
                f"{self.truncated[:10]}, skipped {self.skipped[:10]}")


def fit_to_positions(max_positions: int, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *,
                     cut_targets: bool = True) -> Fitted:
    """Teacher-forcing pairs that fit `max_positions`: a target (ending with EOS; the decoder reads start + all but
    the last) longer than max_positions is cut to max_positions tokens (or skipped when `cut_targets` is False:
    for analyses that need whole sentences); a source longer than max_positions is skipped."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    out = Fitted([], [], [], [], [])
    for i, (src, tgt) in enumerate(zip(sources, targets)):
        if len(src) > max_positions or (len(tgt) > max_positions and not cut_targets):
            out.skipped.append(i)
            continue
        if len(tgt) > max_positions:
            tgt = tgt[:max_positions]
            out.truncated.append(i)
        out.sources.append(list(src))
        out.targets.append(list(tgt))
        out.ids.append(i)
    return out


@torch.no_grad()
def corpus_head_stats(
    model,
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    *,
    batch_size: int = 64,
    kinds: Sequence[AttentionKind] = KINDS,
    src_punct: Sequence[int] | None = None,
    tgt_punct: Sequence[int] | None = None,
    src_counts: torch.Tensor | None = None,
    tgt_counts: torch.Tensor | None = None,
    progress: Progress | None = None,
) -> HeadStats:
    """Head statistics over a corpus, teacher-forced: `sources` end with EOS, `targets` are the reference
    outputs (ending with EOS; the decoder reads start + all but the last). Sentences are sorted by length
    so batches carry little padding; results come back in corpus order. Sentences longer than the model's
    positions are cut or skipped as `fit_to_positions` says, with a warning giving the counts.
    `src_counts` / `tgt_counts` (vocabulary,): token frequencies for "rare"; by default counted over this corpus."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    if not sources:
        raise ValueError("no sentences")
    if batch_size < 1:
        raise ValueError(f"batch_size ({batch_size}) must be at least 1")
    cfg = model.cfg
    dev = model.device
    fitted = fit_to_positions(cfg.max_positions, sources, targets)
    if not fitted.ids:
        raise ValueError(f"all {len(sources)} sources are longer than the model's max_positions ({cfg.max_positions})")
    if fitted.report():
        warnings.warn(fitted.report("corpus_head_stats"), stacklevel=3)
    ids, sources, targets = fitted.ids, fitted.sources, fitted.targets
    if src_counts is None:
        src_counts = token_counts(sources, cfg.src_vocab)
    dec_in = [decoder_input(t, cfg.start_id) for t in targets]  # what the decoder reads: start + all but the last
    if tgt_counts is None:  # the decoder's keys
        tgt_counts = token_counts(dec_in, cfg.tgt_vocab)
    names = [n for n in model.hook_names("*.hook_probs") if kind_of(n) in kinds]
    parts, done = [], 0
    for idx, b in corpus_batches(sources, targets, pad_id=cfg.pad_id, start_id=cfg.start_id, batch_size=batch_size,
                                 device=dev):
        trace = capture_attention(model, b.src, b.tgt_in, names)
        parts.append(head_stats(trace, pad_id=cfg.pad_id, eos_id=cfg.eos_id, src_punct=src_punct,
                                tgt_punct=tgt_punct, kinds=kinds, sentence_ids=[ids[i] for i in idx],
                                src_counts=src_counts, tgt_counts=tgt_counts))
        done += len(idx)
        if progress is not None:
            progress(done, len(sources))
    table = HeadStats.concat(parts)
    return dataclasses.replace(table, truncated=tuple(fitted.truncated), skipped=tuple(fitted.skipped))


class _Stop(Exception):
    """Raised by a hook once everything wanted is captured (TransformerLens's stop_at_layer idea)."""


def capture_attention(model, src: torch.Tensor, tgt: torch.Tensor, names: Sequence[str]) -> Trace:
    """A trace of `names`, stopping before the output projection: with an 8k vocabulary the logits
    cost more than all attention layers of a small model, and statistics never read them."""
    def stop(x: torch.Tensor, hook) -> None:
        raise _Stop

    with model.capture(names) as store:
        try:
            with model.hooks({model.hook_dec_out.name: stop}):
                model(src, tgt)
        except _Stop:
            pass
    return Trace({n: calls[-1] for n, calls in store.items()}, src=src, tgt=tgt)

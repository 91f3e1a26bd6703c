"""Corpus statistics of every feature of a dictionary (what its dashboard shows), sharded under torchrun.

    stats = corpus_feature_stats(tm, dictionary, data)        # one pass over a teacher-forced corpus
    stats.save(directory / "stats.safetensors")
    stats = FeatureStats.load(directory / "stats.safetensors")
    stats.contexts(feature)                                    # [(value, sentence, position)], largest first

Per feature: how often it fires, the sum and maximum of its activations, a histogram of its non-zero
activations on fixed log-spaced bins (2^-12 .. 2^8, so shards add up exactly), its `top` largest
activations with the sentence and position they occur at, and a uniform sample of `sample` of its firings
(each firing gets a pseudo-random priority hashed from its feature, sentence and position; the `sample` highest
are kept), from which a dashboard shows examples across the activation quantiles, not only the top. The
sentences those contexts come from are stored too (token ids), so a dashboard needs no corpus.

Under torchrun each rank reads every world-th model batch of the corpus; counts, sums and histograms are
all-reduced, maxima max-reduced, and the top contexts and samples all-gathered and merged: the result equals one
process's (tested with two gloo processes), so the same command runs on a cluster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..core.model import evaluating
from ..corpus.data import ParallelData, load_dataset
from ..decoding.translator import TranslationModel, load
from ..training.distributed import Dist, init_distributed
from .dictionary import SparseDictionary
from .sites import site_mask, site_of, site_rows

DENSE = 0.10
"""A feature firing on more than this share of tokens counts as dense (cards and dashboards)."""
BIN_EDGES = torch.logspace(-12, 8, 81, base=2.0)
"""Histogram bin edges of non-zero activations: 4 bins per octave; values outside land in the end bins."""


@dataclass
class FeatureStats:
    count: torch.Tensor  # (F,) int64: tokens on which the feature fires
    total: torch.Tensor  # (F,) float64: sum of its activations
    max: torch.Tensor  # (F,) float32
    hist: torch.Tensor  # (F, bins) int64
    top_values: torch.Tensor  # (F, top) float32, descending; 0 where fewer contexts exist
    top_sentence: torch.Tensor  # (F, top) int64: index into `sentences` (-1: none)
    top_position: torch.Tensor  # (F, top) int64: position within the sentence's side
    tokens: int  # tokens read
    sentences_src: list[list[int]]  # the referenced sentences, source ids (without EOS)
    sentences_tgt: list[list[int]]
    sentence_ids: list[int]  # their index in the corpus
    meta: dict[str, Any]
    sample_values: torch.Tensor | None = None  # (F, sample) float32: a uniform sample of the firings; 0: none
    sample_sentence: torch.Tensor | None = None  # (F, sample) int64: index into `sentences` (-1: none)
    sample_position: torch.Tensor | None = None  # (F, sample) int64

    @property
    def frequency(self) -> torch.Tensor:
        return self.count.double() / max(self.tokens, 1)

    @property
    def mean(self) -> torch.Tensor:
        """Mean activation where the feature fires."""
        return self.total / self.count.clamp_min(1)

    def contexts(self, feature: int) -> list[tuple[float, int, int]]:
        out = []
        for v, s, p in zip(self.top_values[feature].tolist(), self.top_sentence[feature].tolist(),
                           self.top_position[feature].tolist()):
            if s >= 0 and v > 0:
                out.append((v, s, p))
        return out

    def samples(self, feature: int) -> list[tuple[float, int, int]]:
        """A uniform sample of the feature's firings [(value, sentence, position)], ascending by value (empty
        for statistics written before samples were kept)."""
        if self.sample_values is None:
            return []
        out = [(v, s, p) for v, s, p in zip(self.sample_values[feature].tolist(),
                                             self.sample_sentence[feature].tolist(),
                                             self.sample_position[feature].tolist()) if s >= 0 and v > 0]
        return sorted(out)

    # -- files ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        path = Path(path)
        flat_src, off_src = _flatten(self.sentences_src)
        flat_tgt, off_tgt = _flatten(self.sentences_tgt)
        tensors = {"count": self.count, "total": self.total, "max": self.max, "hist": self.hist.int(),
                   "top_values": self.top_values, "top_sentence": self.top_sentence.int(),
                   "top_position": self.top_position.short(), "src_ids": flat_src, "src_offsets": off_src,
                   "tgt_ids": flat_tgt, "tgt_offsets": off_tgt,
                   "sentence_ids": torch.tensor(self.sentence_ids, dtype=torch.int32)}
        if self.sample_values is not None:
            tensors |= {"sample_values": self.sample_values, "sample_sentence": self.sample_sentence.int(),
                        "sample_position": self.sample_position.short()}
        tmp = path.with_name(f".{path.name}.tmp")
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp),
                  metadata={"tokens": str(self.tokens), "meta": json.dumps(self.meta)})
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> FeatureStats:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist (write it with `workbench features stats`)")
        with safe_open(str(path), framework="pt") as f:
            t = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
            md = f.metadata()
        return cls(count=t["count"], total=t["total"], max=t["max"], hist=t["hist"].long(),
                   top_values=t["top_values"], top_sentence=t["top_sentence"].long(),
                   top_position=t["top_position"].long(), tokens=int(md["tokens"]),
                   sentences_src=_unflatten(t["src_ids"], t["src_offsets"]),
                   sentences_tgt=_unflatten(t["tgt_ids"], t["tgt_offsets"]),
                   sentence_ids=t["sentence_ids"].tolist(), meta=json.loads(md["meta"]),
                   sample_values=t.get("sample_values"),
                   sample_sentence=t["sample_sentence"].long() if "sample_sentence" in t else None,
                   sample_position=t["sample_position"].long() if "sample_position" in t else None)


def _flatten(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor([len(r) for r in rows], dtype=torch.int64).cumsum(0) if rows else 0
    flat = torch.tensor([i for r in rows for i in r], dtype=torch.int32)
    return flat, offsets


def _unflatten(flat: torch.Tensor, offsets: torch.Tensor) -> list[list[int]]:
    ids, off = flat.tolist(), offsets.tolist()
    return [ids[off[i] : off[i + 1]] for i in range(len(off) - 1)]


def _merge_top(values: torch.Tensor, keys: torch.Tensor, new_values: torch.Tensor, new_keys: torch.Tensor, top: int,
               *carried: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Keep the `top` largest of two (F, ·) sets; ties go to the smaller key (a sentence-major order), so the
    result does not depend on the order shards arrive in. `carried` (old, new) pairs ride along."""
    v = torch.cat([values, new_values], 1)
    k = torch.cat([keys, new_keys], 1)
    extra = [torch.cat(pair, 1) for pair in carried]
    # sort by key first, then stably by value: equal values keep ascending keys
    order = k.argsort(dim=1, stable=True)
    v, k, extra = v.gather(1, order), k.gather(1, order), [e.gather(1, order) for e in extra]
    order = v.argsort(dim=1, descending=True, stable=True)[:, :top]
    return (v.gather(1, order), k.gather(1, order), *(e.gather(1, order) for e in extra))


def _priority(keys: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    """A pseudo-random number in [0, 1) per (key, feature): a multiplicative hash, so every shard and every run
    gives a firing the same priority (int64 products stay below 2^63: keys < 2^32, masks to 31 bits)."""
    mask = (1 << 31) - 1
    h = (keys * 0x9E3779B1 + feats * 0x85EBCA77) & mask
    h = ((h ^ (h >> 15)) * 0x2C1B3C6D) & mask
    h = ((h ^ (h >> 12)) * 0x297A2D39) & mask
    return (h ^ (h >> 15)).double() / (1 << 31)


@torch.no_grad()
def corpus_feature_stats(tm: TranslationModel, dictionary: SparseDictionary, data: ParallelData, *, top: int = 16,
                         max_tokens: int = 4096, dist_info: Dist | None = None, meta: dict[str, Any] | None = None,
                         chunk: int = 4096, sample: int = 32) -> FeatureStats:
    """Every feature's statistics over `data` (this rank's share of its batches; torchrun ranks are merged): one pass
    accumulating (`_Accumulator`), the merge across ranks, then the kept contexts resolved to sentences."""
    model, d = tm.model, dictionary
    with evaluating(model), evaluating(d):
        site = site_of(d)
        di = dist_info or Dist()
        acc = _Accumulator.empty(d.cfg.d_sae, top, sample)
        for idx in data.batches(max_tokens, shuffle=False)[di.rank :: di.world]:
            batch = data.collate(idx, model.cfg)
            x, _ = site_rows(model, batch, site)
            mask = site_mask(batch, site, model.cfg.pad_id)
            sent = torch.tensor(idx)[:, None].expand_as(mask)[mask]
            pos = torch.arange(mask.size(1))[None].expand_as(mask)[mask]
            keys = sent * 4096 + pos
            acc.tokens += x.size(0)
            for i in range(0, x.size(0), chunk):
                acc.add(d.encode(x[i : i + chunk]).cpu(), keys[i : i + chunk])
        if di.world > 1:
            acc.merge_ranks(di.world)
        return acc.finish(data, {"site": site.name, "side": site.side, "top": top, "sample": sample, "world": di.world,
                                 **(meta or {})})


@dataclass
class _Accumulator:
    """`corpus_feature_stats`'s running figures per feature: firing count, sum, max, histogram of values, the top
    activations and a uniform sample of firings (each by key = sentence * 4096 + position)."""

    top: int
    sample: int
    count: torch.Tensor
    total: torch.Tensor
    fmax: torch.Tensor
    hist: torch.Tensor
    top_v: torch.Tensor
    top_k: torch.Tensor
    smp_p: torch.Tensor  # the sample: priorities, keys, values
    smp_k: torch.Tensor
    smp_v: torch.Tensor
    tokens: int = 0

    @classmethod
    def empty(cls, n_feat: int, top: int, sample: int) -> _Accumulator:
        nb = BIN_EDGES.numel() - 1
        return cls(top, sample, torch.zeros(n_feat, dtype=torch.int64), torch.zeros(n_feat, dtype=torch.float64),
                   torch.zeros(n_feat), torch.zeros(n_feat * nb, dtype=torch.int64), torch.zeros(n_feat, 0),
                   torch.zeros(n_feat, 0, dtype=torch.int64), torch.zeros(n_feat, 0, dtype=torch.float64),
                   torch.zeros(n_feat, 0, dtype=torch.int64), torch.zeros(n_feat, 0))

    def add(self, f: torch.Tensor, chunk_keys: torch.Tensor) -> None:
        """One chunk of feature activations (rows, features) and the rows' keys."""
        nb = BIN_EDGES.numel() - 1
        nz = f > 0
        self.count += nz.sum(0)
        self.total += f.sum(0, dtype=torch.float64)
        self.fmax = torch.maximum(self.fmax, f.max(0).values)
        rows, feats = nz.nonzero(as_tuple=True)
        vals = f[rows, feats]
        b = torch.bucketize(vals, BIN_EDGES[1:-1])
        self.hist.index_add_(0, feats * nb + b, torch.ones_like(b))
        k = min(self.top, f.size(0))
        bv, bi = f.T.topk(k, dim=1)
        self.top_v, self.top_k = _merge_top(self.top_v, self.top_k, bv, chunk_keys[bi], self.top)
        if self.sample:
            prio = torch.full((f.size(1), f.size(0)), -1.0, dtype=torch.float64)
            prio[feats, rows] = _priority(chunk_keys[rows], feats)
            pv, pi = prio.topk(min(self.sample, f.size(0)), dim=1)
            self.smp_p, self.smp_k, self.smp_v = _merge_top(
                self.smp_p, self.smp_k, pv, torch.where(pv >= 0, chunk_keys[pi], -1), self.sample,
                (self.smp_v, f.T.gather(1, pi)))

    def merge_ranks(self, world: int) -> None:
        """Sum the counts and merge the top activations and samples of every torchrun rank (all ranks call it)."""
        import torch.distributed as dist

        n_feat = self.count.numel()
        for t in (self.count, self.total, self.hist):
            dist.all_reduce(t)
        dist.all_reduce(self.fmax, op=dist.ReduceOp.MAX)
        tokens_t = torch.tensor([self.tokens])
        dist.all_reduce(tokens_t)
        self.tokens = int(tokens_t)
        # pad to `top` columns so every rank sends the same shape
        pad = self.top - self.top_v.size(1)
        top_v = torch.cat([self.top_v, torch.full((n_feat, pad), -1.0)], 1)
        top_k = torch.cat([self.top_k, torch.full((n_feat, pad), -1, dtype=torch.int64)], 1)
        vs = [torch.empty_like(top_v) for _ in range(world)]
        ks = [torch.empty_like(top_k) for _ in range(world)]
        dist.all_gather(vs, top_v)
        dist.all_gather(ks, top_k)
        top_v, top_k = vs[0], ks[0]
        for v, k in zip(vs[1:], ks[1:]):
            top_v, top_k = _merge_top(top_v, top_k, v, k, self.top)
        self.top_v, self.top_k = top_v, top_k
        if self.sample:
            pad = self.sample - self.smp_p.size(1)
            smp_p = torch.cat([self.smp_p, torch.full((n_feat, pad), -1.0, dtype=torch.float64)], 1)
            smp_k = torch.cat([self.smp_k, torch.full((n_feat, pad), -1, dtype=torch.int64)], 1)
            smp_v = torch.cat([self.smp_v, torch.zeros(n_feat, pad)], 1)
            got = [[torch.empty_like(t) for _ in range(world)] for t in (smp_p, smp_k, smp_v)]
            for t, g in zip((smp_p, smp_k, smp_v), got):
                dist.all_gather(g, t)
            smp_p, smp_k, smp_v = got[0][0], got[1][0], got[2][0]
            for p, k, v in zip(got[0][1:], got[1][1:], got[2][1:]):
                smp_p, smp_k, smp_v = _merge_top(smp_p, smp_k, p, k, self.sample, (smp_v, v))
            self.smp_p, self.smp_k, self.smp_v = smp_p, smp_k, smp_v

    def finish(self, data: ParallelData, info: dict[str, Any]) -> FeatureStats:
        """The `FeatureStats`: tables padded to `top` / `sample` columns, empty slots -1, keys resolved to the
        sentences kept (those some top activation or sample refers to)."""
        n_feat, top, sample = self.count.numel(), self.top, self.sample
        top_v, top_k, smp_p, smp_k, smp_v = self.top_v, self.top_k, self.smp_p, self.smp_k, self.smp_v
        pad = top - top_v.size(1)
        if pad > 0:
            top_v = torch.cat([top_v, torch.zeros(n_feat, pad)], 1)
            top_k = torch.cat([top_k, torch.full((n_feat, pad), -1, dtype=torch.int64)], 1)
        valid = (top_v > 0) & (top_k >= 0)
        top_k = top_k.where(valid, torch.full_like(top_k, -1))
        top_v = top_v.where(valid, torch.zeros_like(top_v))
        referenced = top_k[valid].tolist()
        if sample:
            pad = sample - smp_p.size(1)
            if pad > 0:
                smp_p = torch.cat([smp_p, torch.full((n_feat, pad), -1.0, dtype=torch.float64)], 1)
                smp_k = torch.cat([smp_k, torch.full((n_feat, pad), -1, dtype=torch.int64)], 1)
                smp_v = torch.cat([smp_v, torch.zeros(n_feat, pad)], 1)
            s_valid = (smp_p >= 0) & (smp_k >= 0) & (smp_v > 0)
            smp_k = smp_k.where(s_valid, torch.full_like(smp_k, -1))
            smp_v = smp_v.where(s_valid, torch.zeros_like(smp_v))
            referenced += smp_k[s_valid].tolist()
        corpus_ids = sorted({int(k) // 4096 for k in referenced})
        where = {s: i for i, s in enumerate(corpus_ids)}

        def sentences(keys: torch.Tensor) -> torch.Tensor:
            return torch.tensor([[where[int(k) // 4096] if k >= 0 else -1 for k in row] for row in keys.tolist()],
                                dtype=torch.int64).view(keys.shape)

        top_position = torch.where(top_k >= 0, top_k % 4096, torch.zeros_like(top_k))
        return FeatureStats(self.count, self.total, self.fmax, self.hist.view(n_feat, -1), top_v, sentences(top_k),
                            top_position, self.tokens, [data.src[s] for s in corpus_ids],
                            [data.tgt[s] for s in corpus_ids], corpus_ids, info,
                            sample_values=smp_v if sample else None,
                            sample_sentence=sentences(smp_k) if sample else None,
                            sample_position=torch.where(smp_k >= 0, smp_k % 4096, torch.zeros_like(smp_k))
                            if sample else None)


def corpus_feature_stats_cli(args) -> int:
    """`workbench features stats` (also under torchrun): rank 0 writes the file."""
    di = init_distributed()
    tm = load(args.checkpoint)
    d = SparseDictionary.load(args.dictionary)
    src, tgt = load_dataset(args.dataset, args.split, tm.meta.get("src_lang", "de"), tm.meta.get("tgt_lang", "en"),
                            limit=args.limit)
    data = ParallelData.encode(src, tgt, tm.src_tokenizer, tm.tgt_tokenizer, max_len=tm.model.cfg.max_positions - 1)
    stats = corpus_feature_stats(tm, d, data, top=args.top, dist_info=di, sample=getattr(args, "sample", 32),
                                 meta={"corpus": f"{args.dataset}:{args.split}", "limit": args.limit})
    if di.main:
        out = Path(args.out) if args.out else Path(args.dictionary) / "stats.safetensors"
        stats.save(out)
        alive = int((stats.count > 0).sum())
        print(f"wrote {out}: {stats.tokens:,} tokens, {alive}/{stats.count.numel()} features fire, "
              f"{len(stats.sentence_ids):,} context sentences")
    if di.world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0

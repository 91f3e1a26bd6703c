"""What a feature dashboard shows, as plain data (charts in `workbench.charts.features`, views in the app).

    fd = FeatureData.load(tm, "checkpoints/multi30k-de-en/features/hook_memory")   # dictionary + stats
    fd.contexts(17)          # top-activating contexts: pieces, the firing position, the aligned output word
    fd.histogram(17)         # (bin left edges, counts) of its non-zero activations on the corpus
    fd.output_effects(17)    # the output tokens it raises, in total and through each cross-attention head
    fd.sentence("Ein Hund läuft.")   # the features active on each token of a sentence
    fd.search("Hund")        # features whose top contexts fire on that token

Encoder-side features (an SAE on `hook_memory` or an encoder hook) fire on source tokens; a context shows the
source sentence and the output word aligned to the firing token: with teacher forcing on the reference, the
target position whose cross-attention (averaged over every head of every layer) is largest on it.
Decoder-side features fire on decoder positions; a context shows the target prefix, and the aligned word is the
one predicted there.

Output effects are measured, not read off weights: the feature's part of the activation (a_f · W_dec[f]) is
removed and the logits compared with the clean run at the aligned position, over the top contexts. For
`hook_memory` it is removed from the values of one cross-attention head at a time (keys and attention patterns
stay clean: the path through that head's value/output), and from all values at once; for decoder sites from the
site itself. The mean logit drop per vocabulary item ranks the tokens a feature raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.batching import TeacherForced, decoder_input, teacher_forced
from ..decoding.translator import TranslationModel
from .dictionary import SparseDictionary
from .sites import capture_site, site_of
from .stats import BIN_EDGES, FeatureStats


@dataclass
class Context:
    value: float
    sentence: int  # corpus index
    position: int  # firing position on the feature's side
    pieces: list[str]  # the side's pieces (source, or the decoder input: start token + target prefix)
    aligned: str  # the aligned output word (source side) or the predicted token (decoder side)
    aligned_position: int  # its target position (tgt_out index)
    source: str  # detokenized source sentence
    target: str  # detokenized reference


class FeatureData:
    def __init__(self, tm: TranslationModel, dictionary: SparseDictionary, stats: FeatureStats | None = None,
                 name: str = "") -> None:
        self.tm, self.d, self.stats = tm, dictionary.eval(), stats
        self.site = site_of(dictionary)
        self.name = name or self.site.name

    @classmethod
    def load(cls, tm: TranslationModel, directory: str | Path) -> FeatureData:
        directory = Path(directory)
        stats_file = directory / "stats.safetensors"
        stats = FeatureStats.load(stats_file) if stats_file.is_file() else None
        return cls(tm, SparseDictionary.load(directory), stats, directory.name)

    @property
    def n_features(self) -> int:
        return self.d.cfg.d_sae

    def _need_stats(self) -> FeatureStats:
        if self.stats is None:
            raise ValueError(f"{self.name} has no stats.safetensors: run `workbench features stats` first")
        return self.stats

    def check(self, feature: int) -> int:
        if not 0 <= int(feature) < self.n_features:
            raise ValueError(f"feature {feature} does not exist: {self.name} has features 0..{self.n_features - 1}")
        return int(feature)

    # -- summary -------------------------------------------------------------------------------
    def summary(self, feature: int) -> dict[str, Any]:
        f = self.check(feature)
        s = self._need_stats()
        return {"feature": f, "site": self.name, "side": self.site.side, "frequency": float(s.frequency[f]),
                "count": int(s.count[f]), "mean": float(s.mean[f]), "max": float(s.max[f]), "tokens": s.tokens,
                "corpus": s.meta.get("corpus", "")}

    def histogram(self, feature: int) -> tuple[list[float], list[float], list[int]]:
        """(left edges, right edges, counts) of the non-zero activations, trimmed to the occupied bins."""
        f = self.check(feature)
        counts = self._need_stats().hist[f]
        nz = counts.nonzero().flatten()
        if nz.numel() == 0:
            return [], [], []
        lo, hi = int(nz[0]), int(nz[-1]) + 1
        return BIN_EDGES[lo:hi].tolist(), BIN_EDGES[lo + 1 : hi + 1].tolist(), counts[lo:hi].tolist()

    # -- contexts ------------------------------------------------------------------------------
    def _batch(self, pairs: list[tuple[list[int], list[int]]]) -> TeacherForced:
        """Sentences (source, target, both without EOS) as a teacher-forced batch."""
        cfg = self.tm.model.cfg
        return teacher_forced([[*s, cfg.eos_id] for s, _ in pairs], [[*t, cfg.eos_id] for _, t in pairs],
                              pad_id=cfg.pad_id, start_id=cfg.start_id)

    @torch.no_grad()
    def _aligned(self, batch: TeacherForced, positions: list[int]) -> list[int]:
        """Per row, the target position whose mean cross-attention on source `positions[row]` is largest."""
        names = [layer.cross_attn.hook_probs.name for layer in self.tm.model.dec]
        _, trace = self.tm.model.run_with_cache(batch.src, batch.tgt_in, names)
        att = torch.stack([trace[n] for n in names]).mean((0, 2))  # (B, T, S)
        real = batch.tgt_mask()  # lengths, not ids: the start token may be the padding id
        out = []
        for row, pos in enumerate(positions):
            col = att[row, :, pos].masked_fill(~real[row], -1.0)
            out.append(int(col.argmax()))
        return out

    def contexts(self, feature: int, limit: int | None = None) -> list[Context]:
        f = self.check(feature)
        s = self._need_stats()
        found = s.contexts(f)[:limit]
        if not found:
            return []
        pairs = [(s.sentences_src[j], s.sentences_tgt[j]) for _, j, _ in found]
        positions = [p for _, _, p in found]
        aligned = self._aligned(self._batch(pairs), positions) if self.site.side == "src" else positions
        stok, ttok = self.tm.src_tokenizer, self.tm.tgt_tokenizer
        out = []
        for (v, j, p), (si, ti), a in zip(found, pairs, aligned):
            pieces = stok.pieces(si + [self.tm.model.cfg.eos_id]) if self.site.side == "src" else \
                ["<s>", *ttok.pieces(ti)]
            word_ids = [*ti, self.tm.model.cfg.eos_id]
            out.append(Context(v, s.sentence_ids[j], p, pieces, ttok.pieces([word_ids[a]])[0], a,
                               stok.decode(si), ttok.decode(ti)))
        return out

    # -- output effects ------------------------------------------------------------------------
    @torch.no_grad()
    def output_effects(self, feature: int, *, contexts: int = 8, top: int = 10) -> dict[str, Any]:
        """Tokens whose logits drop most when the feature is removed, at the aligned positions of its top
        contexts; for hook_memory also per cross-attention head (value path)."""
        f = self.check(feature)
        ctx = self.contexts(f, contexts)
        if not ctx:
            return {"feature": f, "contexts": 0, "tokens": [], "heads": []}
        model, s = self.tm.model, self._need_stats()
        found = s.contexts(f)[:contexts]
        pairs = [(s.sentences_src[j], s.sentences_tgt[j]) for _, j, _ in found]
        batch = self._batch(pairs)
        src, tgt_in = batch.src, batch.tgt_in
        n = len(ctx)
        direction = self.d.W_dec[f]  # (d_out,)
        amounts = torch.tensor([c.value for c in ctx])
        rows = torch.arange(n)
        pos = torch.tensor([c.position for c in ctx])
        at = torch.tensor([c.aligned_position for c in ctx])
        heads: list[tuple[int, int]] = []
        if self.site.hook_in == model.hook_memory.name and not self.site.transcoder:
            heads = [(layer, h) for layer in range(len(model.dec)) for h in range(model.dec[layer].cross_attn.n_heads)]
        variants = 2 + len(heads)  # clean, whole site, each head
        src_v, tgt_v = src.repeat(variants, 1), tgt_in.repeat(variants, 1)
        delta = amounts[:, None] * direction[None]  # (n, d)
        hooks = []
        if heads:
            def value_hook(layer: int):
                attn = model.dec[layer].cross_attn
                dv = (delta @ attn.v_proj.weight.T).view(n, attn.n_heads, -1)  # (n, H, Dh)

                def fn(v: torch.Tensor, hook) -> torch.Tensor:
                    v = v.clone()
                    for h in range(attn.n_heads):
                        k = 2 + heads.index((layer, h))
                        v[k * n + rows, h, pos] -= dv[:, h]
                    return v
                return fn
            hooks = [(model.dec[layer].cross_attn.hook_v.name, value_hook(layer)) for layer in range(len(model.dec))]

        def site_hook(x: torch.Tensor, hook) -> torch.Tensor:
            x = x.clone()
            x[n + rows, pos] -= delta.to(x.dtype)
            return x
        hooks.append((self.site.hook_out or self.site.hook_in, site_hook))
        with model.hooks(hooks):
            out = model(src_v, tgt_v, project=False)  # (variants * n, T, D): project the aligned rows only
        picked = model.output_proj(out.view(variants, n, *out.shape[1:])[:, rows, at]).float().log_softmax(-1)
        drop = (picked[:1] - picked[1:]).mean(1)  # (variants-1, V): mean log-prob drop without the feature
        total = drop[0]
        best = total.topk(top)
        tok = self.tm.tgt_tokenizer
        tokens = [{"token": tok.pieces([int(i)])[0], "id": int(i), "drop": float(v)}
                  for v, i in zip(best.values, best.indices)]
        head_rows = []
        for k, (layer, h) in enumerate(heads):
            d_h = drop[1 + k]
            b = d_h.topk(3)
            head_rows.append({"layer": layer, "head": h, "on_top_tokens": float(d_h[best.indices].mean()),
                              "tokens": [tok.pieces([int(i)])[0] for i in b.indices]})
        head_rows.sort(key=lambda r: -r["on_top_tokens"])
        return {"feature": f, "contexts": n, "tokens": tokens, "heads": head_rows,
                "note": "mean drop in log-probability at the aligned position when the feature is removed"}

    # -- one sentence --------------------------------------------------------------------------
    @torch.no_grad()
    def sentence(self, source: str, target: str | None = None, *, top: int = 5) -> dict[str, Any]:
        """The features active on each token of a sentence (source tokens, or decoder positions with the
        translation as teacher-forced target: the reference when given, else the model's own output)."""
        tm = self.tm
        src_ids, _ = tm.encode_source(source)
        if not src_ids:
            raise ValueError("the sentence is empty")
        if target is None:
            target = tm.translate([source])[0]
        tgt_ids = tm.tgt_tokenizer.encode(target)
        cfg = tm.model.cfg
        src = torch.tensor([src_ids])
        tgt_in = torch.tensor([decoder_input([*tgt_ids, cfg.eos_id], cfg.start_id)])
        acts = capture_site(tm.model, src, tgt_in, self.site)
        feats = self.d.encode(acts[self.site.hook_in][0].float())  # (L, F)
        pieces = tm.src_tokenizer.pieces(src_ids) if self.site.side == "src" else ["<s>", *tm.tgt_tokenizer.pieces(
            tgt_ids)]
        rows = []
        for i, piece in enumerate(pieces):
            v, idx = feats[i].topk(min(top, feats.size(1)))
            rows.append({"position": i, "piece": piece, "features": [(int(j), float(a)) for a, j in zip(v, idx)
                                                                      if a > 0]})
        return {"source": source, "target": target, "side": self.site.side, "tokens": rows,
                "activations": feats}

    # -- search --------------------------------------------------------------------------------
    def search(self, token: str, *, limit: int = 20) -> list[dict[str, Any]]:
        """Features whose top contexts fire on a piece matching `token` (case-insensitive, the word-start
        marker ignored), ranked by how many of their contexts do, then by their mean activation there."""
        s = self._need_stats()
        want = token.strip().lower()
        if not want:
            return []
        tok = self.tm.src_tokenizer if self.site.side == "src" else self.tm.tgt_tokenizer
        cache: dict[int, list[str]] = {}

        def piece(j: int, p: int) -> str:
            if j not in cache:
                cache[j] = tok.pieces(s.sentences_src[j] + [self.tm.model.cfg.eos_id]) if self.site.side == "src" \
                    else ["<s>", *tok.pieces(s.sentences_tgt[j])]
            row = cache[j]
            return row[p].replace("\u2581", "").lower() if p < len(row) else ""

        hits = []
        for f in range(self.n_features):
            ctx = s.contexts(f)
            match = [v for v, j, p in ctx if piece(j, p) == want]
            if match:
                hits.append({"feature": f, "matches": len(match), "of": len(ctx),
                             "mean": sum(match) / len(match), "frequency": float(s.frequency[f])})
        hits.sort(key=lambda h: (-h["matches"] / h["of"], -h["mean"]))
        return hits[:limit]

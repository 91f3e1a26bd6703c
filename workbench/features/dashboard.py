"""What a feature dashboard shows, as plain data (charts in `workbench.charts.features`, views in the app).

    fd = FeatureData.load(tm, "checkpoints/multi30k-de-en/features/hook_memory")   # dictionary + stats
    fd.summary(17)           # frequency, mean, max, and a dead / dense warning
    fd.contexts(17)          # top-activating contexts: pieces, the firing position, the aligned output word
    fd.quantile_contexts(17) # contexts sampled across its activation quantiles, weakest band first
    fd.histogram(17)         # (bin left edges, counts) of its non-zero activations on the corpus
    fd.output_effects(17)    # the output tokens it raises and lowers (change in probability), per head
    fd.direct_effects(17)    # its decoder direction's direct logit effect (hook_memory: via cross-attention OV)
    fd.nearest(17)           # the features with the most similar decoder directions (cosine)
    fd.sentence("Ein Hund läuft.")   # the features active on each token of a sentence
    fd.search("Hund")        # features whose top contexts fire on that token

Encoder-side features (an SAE on `hook_memory` or an encoder hook) fire on source tokens; a context shows the
source sentence and the output word aligned to the firing token: with teacher forcing on the reference, the
target position whose cross-attention (averaged over every head of every layer) is largest on it.
Decoder-side features fire on decoder positions; a context shows the target prefix, and the aligned word is the
one predicted there.

Output effects are measured, not read off weights: the feature's part of the activation (a_f · W_dec[f]) is
removed at the firing token and the next-token distribution compared with the clean run at the aligned position,
over the top contexts. Tokens are ranked by the mean change in probability, p_clean − p_without (a token it
raises loses probability without it), shown with the clean probability, so a tail token whose log-probability
moves a lot but whose probability stays near zero does not rank. Which activations are edited is stated in the
result (`edited`): for `hook_memory` by default the values of every decoder layer's cross-attention at the
firing source token (`edit="values"`: keys, so attention patterns, stay clean; the path the per-head rows
decompose), or `edit="memory"`, hook_memory itself, so the keys and values of every cross-attention layer (what
removing the feature from the encoder output does in full); per head, the values of that head alone. For other
sites the site itself at the firing position. An effect is called measurable (`measurable`, `effect`) only when the
top change in probability is at least `EFFECT_FLOOR` and larger than that of `EFFECT_CONTROLS` random directions of
the feature's norm removed the same way; otherwise its ranking is noise, and the dashboards say so instead.
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
from .stats import BIN_EDGES, DENSE, FeatureStats

EFFECT_FLOOR = 0.005
"""The smallest change in probability `output_effects` calls an output effect: half a percentage point, mean over
the feature's top contexts, for its top raised token."""

EFFECT_CONTROLS = 19
"""Random directions of the feature's size that `output_effects` removes the same way, as a control: an effect
no larger than theirs is what removing any vector of that size does, not what the feature does. 19, a rank test at
5 %: were the feature's direction one more random one, it would beat all 19 with probability 1/20 (with 3, as until
stop 55, 1/4, and borderline features passed: docs/features.md)."""


_EFFECTS_NOTE = (
    "mean change in probability at the aligned position when the feature's part is removed (dp = p_clean - "
    "p_without; drop: the mean log-probability drop; total_variation: the mean total variation distance between the "
    "two distributions); heads: the values of that head alone (on_top_tokens: mean log-prob drop on the top tokens, "
    "dp_on_top_tokens: their summed probability change); measurable: top_dp at least floor and above control_top_dp, "
    "the largest top dp of `controls` random directions of the feature's norm removed the same way")


def _where(p_clean: torch.Tensor, p_without: torch.Tensor, floor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token, from (n contexts, V) clean and edited probabilities: its clean probability where the edit moves it
    (the mean over contexts weighted by how far it moves there, up or down) and in how many contexts it moves by at
    least `floor`. A feature that fires on different words predicts a different token in each context: its top
    raised token may have p 0.29 in the one context it is raised in and 0.04 as the mean over eight."""
    moved = (p_clean - p_without).abs()
    weight = moved.sum(0)
    return (p_clean * moved).sum(0) / weight.clamp_min(1e-30), (moved >= floor).sum(0)


def _effect_verdict(dp: torch.Tensor, n_heads: int, controls: int, floor: float) -> dict[str, Any]:
    """Whether a feature's removal has a measurable output effect: the top change in probability of the whole
    removal (`dp` row 0) is at least `floor` and above the largest of the control rows (after the `n_heads` head
    rows)."""
    top_dp = float(dp[0].max())
    control_dp = float(dp[1 + n_heads:].max()) if controls else 0.0
    measurable = top_dp >= floor and top_dp > control_dp
    effect = ("measurable" if measurable else
              f"no measurable output effect: removing it raises no token's probability by {floor:g} or more "
              f"(largest {top_dp:.4f})" if top_dp < floor else
              f"no measurable output effect: its top change in probability ({top_dp:.4f}) is no larger than "
              f"that of the largest of {controls} random directions of its size removed the same way "
              f"({control_dp:.4f})")
    return {"top_dp": top_dp, "control_top_dp": control_dp, "controls": controls, "floor": floor,
            "measurable": measurable, "effect": effect}


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
    band: str = ""  # quantile contexts: the activation quantile band it was drawn from ("20-40 %")


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
        freq = float(s.frequency[f])
        density = "dead" if int(s.count[f]) == 0 else "dense" if freq > DENSE else "ok"
        warning = {"dead": f"never fires on the {s.tokens:,} tokens of {s.meta.get('corpus', 'the corpus')}",
                   "dense": f"fires on {freq:.1%} of tokens, more than {DENSE:.0%}: likely not one concept",
                   "ok": ""}[density]
        return {"feature": f, "site": self.name, "side": self.site.side, "frequency": freq,
                "count": int(s.count[f]), "mean": float(s.mean[f]), "max": float(s.max[f]), "tokens": s.tokens,
                "corpus": s.meta.get("corpus", ""), "density": density, "warning": warning}

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

    def contexts(self, feature: int, limit: int | None = None, *, aligned: bool = True) -> list[Context]:
        """Its top contexts. `aligned=False` skips finding a source-side context's aligned output word (a forward
        pass of the whole model): `aligned` is then "" and `aligned_position` -1."""
        f = self.check(feature)
        return self._contexts(self._need_stats().contexts(f)[:limit], aligned)

    def quantile_contexts(self, feature: int, *, bands: int = 5, per_band: int = 2,
                          aligned: bool = True) -> list[Context]:
        """Contexts drawn from a uniform sample of the feature's firings (`stats.samples`), `per_band` from each
        of `bands` equal-count activation bands, weakest first: what it does when it fires weakly, not only at
        its top. Empty for statistics written without samples. `aligned`: as `contexts`'."""
        f = self.check(feature)
        found = self._need_stats().samples(f)  # ascending by value
        if not found:
            return []
        picked, labels = [], []
        n = len(found)
        for b in range(bands):
            lo, hi = n * b // bands, n * (b + 1) // bands
            if hi <= lo:
                continue
            step = (hi - lo) / per_band
            for i in sorted({lo + int(step * (j + 0.5)) for j in range(per_band)}):
                picked.append(found[min(i, hi - 1)])
                labels.append(f"{100 * b // bands}-{100 * (b + 1) // bands} %")
        out = self._contexts(picked, aligned)
        for c, label in zip(out, labels):
            c.band = label
        return out

    def _contexts(self, found: list[tuple[float, int, int]], aligned: bool = True) -> list[Context]:
        if not found:
            return []
        s = self._need_stats()
        pairs = [(s.sentences_src[j], s.sentences_tgt[j]) for _, j, _ in found]
        positions = [p for _, _, p in found]
        if self.site.side == "src":
            at = self._aligned(self._batch(pairs), positions) if aligned else [-1] * len(found)
        else:
            at = positions
        stok, ttok = self.tm.src_tokenizer, self.tm.tgt_tokenizer
        out = []
        for (v, j, p), (si, ti), a in zip(found, pairs, at):
            pieces = stok.pieces(si + [self.tm.model.cfg.eos_id]) if self.site.side == "src" else \
                ["<s>", *ttok.pieces(ti)]
            word_ids = [*ti, self.tm.model.cfg.eos_id]
            word = ttok.pieces([word_ids[a]])[0] if a >= 0 else ""
            out.append(Context(v, s.sentence_ids[j], p, pieces, word, a, stok.decode(si), ttok.decode(ti)))
        return out

    # -- output effects ------------------------------------------------------------------------
    def _edited(self, edit: str) -> str:
        hook = self.site.hook_out or self.site.hook_in
        if self._memory_site:
            if edit == "values":
                return ("the values (hook_v) of every decoder layer's cross-attention at the firing source token; "
                        "keys, so attention patterns, clean")
            return ("hook_memory at the firing source token: the keys and values of every decoder layer's "
                    "cross-attention (attention patterns move too)")
        where = "source token" if self.site.side == "src" else "decoder position"
        what = " (the FFN's output)" if self.site.transcoder else ""
        return f"{hook}{what} at the firing {where}"

    @property
    def _memory_site(self) -> bool:
        return self.site.hook_in == self.tm.model.hook_memory.name and not self.site.transcoder

    @torch.no_grad()
    def output_effects(self, feature: int, *, contexts: int = 8, top: int = 10, edit: str = "values",
                       heads: bool = True, floor: float = EFFECT_FLOOR, controls: int = EFFECT_CONTROLS
                       ) -> dict[str, Any]:
        """The tokens whose probability at the aligned positions of the feature's top contexts falls most
        (`tokens`: what it raises) and rises most (`lowers`) when its part a_f·W_dec[f] is removed at the firing
        token; each with the mean clean probability, the mean change in probability and the mean log-prob drop, and
        where it moves: its clean probability in the contexts the removal moves it in (`p_clean_where`, weighted by
        how far) and their number (`contexts_where`, moved by at least EFFECT_FLOOR; `_where`).
        For hook_memory also per cross-attention head (that head's values alone), unless `heads=False`.

        `measurable` says whether the feature has an output effect at all: its top change in probability (`top_dp`)
        is at least `floor` and larger than the top change of each of `controls` random directions of the same
        norm removed the same way (`control_top_dp`, the largest; seeded by the feature id). When it is False the
        ranking is noise (`effect` says so); the lists are kept for who wants them."""
        if edit not in ("values", "memory"):
            raise ValueError(f"edit must be 'values' or 'memory', got {edit!r}")
        f = self.check(feature)
        ctx = self.contexts(f, contexts)
        edited = self._edited(edit)
        if not ctx:
            return {"feature": f, "contexts": 0, "tokens": [], "lowers": [], "heads": [], "edited": edited,
                    "measurable": False, "effect": "no contexts: it never fired on the statistics corpus"}
        model = self.tm.model
        head_list: list[tuple[int, int]] = []
        if self._memory_site and heads:
            head_list = [(layer, h) for layer in range(len(model.dec))
                         for h in range(model.dec[layer].cross_attn.n_heads)]
        logp = self._removal_logprobs(f, ctx, contexts, head_list, edit, controls)
        prob = logp.exp()  # (variants, n, V)
        dp = (prob[:1] - prob[1:]).mean(1)  # (variants-1, V): mean probability it adds
        drop = (logp[:1] - logp[1:]).mean(1)  # mean log-prob drop without it
        p_clean, p_without = prob[0].mean(0), prob[1].mean(0)
        tv = float(0.5 * (prob[0] - prob[1]).abs().sum(-1).mean())  # mean total variation: how much it moves at all
        where = _where(prob[0], prob[1], EFFECT_FLOOR)
        tokens, lowers, head_rows = self._effect_rows(dp, drop, p_clean, p_without, head_list, top, where)
        return {"feature": f, "contexts": len(ctx), "tokens": tokens, "lowers": lowers, "heads": head_rows,
                "edited": edited, "edit": edit if self._memory_site else "site", "total_variation": tv,
                **_effect_verdict(dp, len(head_list), controls, floor), "note": _EFFECTS_NOTE}

    def _removal_logprobs(self, f: int, ctx: list, contexts: int, head_list: list[tuple[int, int]], edit: str,
                          controls: int) -> torch.Tensor:
        """Log-probabilities (variants, n, V) at the aligned positions of the feature's `ctx` (its top contexts)
        for the variants clean, the whole removal, each head of `head_list`, each of `controls` random directions
        of the feature's norm (seeded by the feature id), all in one batched forward."""
        model, s = self.tm.model, self._need_stats()
        found = s.contexts(f)[:contexts]
        batch = self._batch([(s.sentences_src[j], s.sentences_tgt[j]) for _, j, _ in found])
        n = len(ctx)
        direction = self.d.W_dec[f]  # (d_out,)
        amounts = torch.tensor([c.value for c in ctx])
        pos = torch.tensor([c.position for c in ctx])
        at = torch.tensor([c.aligned_position for c in ctx])
        variants = 2 + len(head_list) + controls  # clean, the whole edit, each head, each control
        g = torch.Generator().manual_seed(f)
        randoms = torch.randn(controls, direction.numel(), generator=g).to(direction)
        randoms = randoms / randoms.norm(dim=1, keepdim=True) * direction.norm()
        hooks = self._removal_hooks(amounts[:, None] * direction[None], pos, head_list, edit,
                                    [amounts[:, None] * r[None] for r in randoms])
        with model.hooks(hooks):  # (variants * n, T, D): project the aligned rows only
            out = model(batch.src.repeat(variants, 1), batch.tgt_in.repeat(variants, 1), project=False)
        return model.output_proj(out.view(variants, n, *out.shape[1:])[:, torch.arange(n), at]).float().log_softmax(-1)

    def _removal_hooks(self, delta: torch.Tensor, pos: torch.Tensor, head_list: list[tuple[int, int]], edit: str,
                       controls: list[torch.Tensor] | tuple = ()) -> list:
        """`output_effects`'s edits, on a batch of variants of the n contexts (clean, the whole edit, each head,
        each control): `delta` (n, d) removed at `pos`, from every cross-attention's values (hook_memory) or at
        the site; each of `controls` (n, d) removed the same way as the whole edit, in the variants after the
        heads."""
        model, n = self.tm.model, delta.size(0)
        rows = torch.arange(n)
        whole = [(1, delta)] + [(2 + len(head_list) + c, d) for c, d in enumerate(controls)]  # (variant, removed)
        hooks = []
        if self._memory_site:
            def value_hook(layer: int):
                attn = model.dec[layer].cross_attn

                def dv_of(d: torch.Tensor) -> torch.Tensor:  # (n, H, Dh): v is linear in memory
                    return (d @ attn.v_proj.weight.T).view(n, attn.n_heads, -1)
                dv = dv_of(delta)
                dvs = [(k, dv_of(d)) for k, d in whole]

                def fn(v: torch.Tensor, hook) -> torch.Tensor:  # v: (B, H, S, Dh)
                    v = v.clone()
                    if edit == "values":
                        for k, dk in dvs:
                            for h in range(attn.n_heads):
                                v[k * n + rows, h, pos] -= dk[:, h].to(v.dtype)
                    for h in range(attn.n_heads):
                        if (layer, h) in head_list:
                            k = 2 + head_list.index((layer, h))
                            v[k * n + rows, h, pos] -= dv[:, h].to(v.dtype)
                    return v
                return fn
            hooks = [(model.dec[layer].cross_attn.hook_v.name, value_hook(layer)) for layer in range(len(model.dec))]
        if not self._memory_site or edit == "memory":
            def site_hook(x: torch.Tensor, hook) -> torch.Tensor:
                x = x.clone()
                for k, d in whole:
                    x[k * n + rows, pos] -= d.to(x.dtype)
                return x
            hooks.append((self.site.hook_out or self.site.hook_in, site_hook))
        return hooks

    def _effect_rows(self, dp: torch.Tensor, drop: torch.Tensor, p_clean: torch.Tensor, p_without: torch.Tensor,
                     head_list: list[tuple[int, int]], top: int, where: tuple[torch.Tensor, torch.Tensor]
                     ) -> tuple[list, list, list]:
        """`output_effects`'s tables: the tokens the feature raises and lowers most, and each head's share."""
        tok = self.tm.tgt_tokenizer
        p_where, n_where = where

        def entry(i: int) -> dict[str, Any]:
            return {"token": tok.pieces([i])[0], "id": i, "dp": float(dp[0, i]), "p_clean": float(p_clean[i]),
                    "p_without": float(p_without[i]), "drop": float(drop[0, i]),
                    "p_clean_where": float(p_where[i]), "contexts_where": int(n_where[i])}
        best = dp[0].topk(top)
        worst = (-dp[0]).topk(top)
        tokens = [entry(int(i)) for v, i in zip(best.values, best.indices) if v > 0]
        lowers = [entry(int(i)) for v, i in zip(worst.values, worst.indices) if v > 0]
        head_rows = []
        for k, (layer, h) in enumerate(head_list):
            d_h = dp[1 + k]
            b = d_h.topk(3)
            head_rows.append({"layer": layer, "head": h, "on_top_tokens": float(drop[1 + k][best.indices].mean()),
                              "dp_on_top_tokens": float(d_h[best.indices].sum()),
                              "tokens": [tok.pieces([int(i)])[0] for i in b.indices]})
        head_rows.sort(key=lambda r: -r["dp_on_top_tokens"])
        return tokens, lowers, head_rows

    # -- direct logit effect of the decoder direction --------------------------------------------
    def _direct_path(self, layer: int, sublayer: str) -> list:
        """The norms a vector written by decoder sub-layer (layer, sublayer) passes on its way to the logits
        when no later block reads it: post-norm, that sub-layer's norm and every later one's, then the final
        norm; pre-norm, the final norm only."""
        stream = self.tm.model.stream("dec")
        norms = []
        if not self.tm.model.cfg.norm_first:
            subs = stream.sublayers()
            start = next(i for i, (j, sub) in enumerate(subs) if j == layer and sub.name == sublayer)
            norms = [sub.norm for _, sub in subs[start:]]
        if stream.final_norm is not None:
            norms.append(stream.final_norm)
        return norms

    def _to_logits(self, v: torch.Tensor, norms: list) -> torch.Tensor:
        """Logits (…, V) of residual-stream vectors v (…, D) through `norms`, each linearised with its 1/σ left
        out (a positive per-token factor: it scales a token's row, never reorders it): centre, times the weight."""
        for norm in norms:
            v = (v - v.mean(-1, keepdim=True)) * norm.weight
        return v @ self.tm.model.output_proj.weight.T

    def _writer(self) -> tuple[int, str] | None:
        """(layer, sub-layer) of the decoder block whose output the site is, or None."""
        name = self.site.hook_out or self.site.hook_in
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "dec" and parts[3] == "hook_out" and parts[2] in (
                "self_attn", "cross_attn", "ffn"):
            return int(parts[1]), parts[2]
        return None

    @torch.no_grad()
    def direct_effects(self, feature: int, *, top: int = 10) -> dict[str, Any]:
        """The logits the decoder direction W_dec[f] adds on its direct path to the output, per unit activation:
        for a decoder block's output (an SAE on dec.N.*.hook_out, a transcoder), through the later norms to the
        unembedding; for hook_memory, through each cross-attention head's OV circuit (W_V then W_O of that
        head, as if the head attended to the token alone) and then the same direct path. Norms are linearised
        without their per-token 1/σ, so values are comparable within a feature, not across positions. `logits`: the
        whole (V,) effect, centred, that `raises` and `lowers` are the ends of (None without a direct path)."""
        f = self.check(feature)
        model, tok = self.tm.model, self.tm.tgt_tokenizer
        direction = self.d.W_dec[f]

        def ranked(logits: torch.Tensor) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            c = logits - logits.mean()  # a shift of every logit changes no probability
            hi, lo = c.topk(top), (-c).topk(top)
            up = [{"token": tok.pieces([int(i)])[0], "id": int(i), "logit": float(v)} for v, i in zip(*hi)]
            down = [{"token": tok.pieces([int(i)])[0], "id": int(i), "logit": -float(v)} for v, i in zip(*lo)]
            return up, down

        if self._memory_site:
            rows, total = [], torch.zeros(model.cfg.tgt_vocab)
            for layer, block in enumerate(model.dec):
                attn = block.cross_attn
                v = (direction @ attn.v_proj.weight.T).view(attn.n_heads, attn.d_head)  # (H, Dh)
                w_o = attn.head_weights()  # (H, Dh, D)
                norms = self._direct_path(layer, "cross_attn")
                for h in range(attn.n_heads):
                    logits = self._to_logits(v[h] @ w_o[h], norms)
                    total += logits
                    up, _ = ranked(logits)
                    rows.append({"layer": layer, "head": h, "spread": float((logits - logits.mean()).std()),
                                 "tokens": [t["token"] for t in up[:3]]})
            up, down = ranked(total)
            rows.sort(key=lambda r: -r["spread"])
            return {"feature": f, "path": "cross-attention OV circuits (every head, as if attending to the token "
                    "alone), then each layer's direct path to the logits", "raises": up, "lowers": down,
                    "heads": rows, "logits": total - total.mean()}
        writer = self._writer()
        if writer is None:
            return {"feature": f, "path": None, "raises": [], "lowers": [], "heads": [], "logits": None,
                    "note": f"{self.site.name} writes into no decoder block's output: it has no direct path to the "
                            "logits (an encoder site reaches them only through cross-attention of later layers)"}
        logits = self._to_logits(direction, self._direct_path(*writer))
        up, down = ranked(logits)
        return {"feature": f, "path": f"dec.{writer[0]}.{writer[1]} output, then the later norms and the unembedding",
                "raises": up, "lowers": down, "heads": [], "logits": logits - logits.mean()}

    # -- neighbours ----------------------------------------------------------------------------
    @torch.no_grad()
    def nearest(self, feature: int, *, top: int = 5) -> list[dict[str, Any]]:
        """The features whose decoder directions are closest to this one's (cosine), with their frequency."""
        f = self.check(feature)
        w = self.d.W_dec / self.d.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12)
        cos = w @ w[f]
        cos[f] = -2.0
        best = cos.topk(min(top, self.n_features - 1))
        freq = self.stats.frequency if self.stats is not None else None
        return [{"feature": int(i), "cosine": float(c), **({"frequency": float(freq[i])} if freq is not None else {})}
                for c, i in zip(best.values, best.indices)]

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

"""How much each output token draws on the source (ALTI+), by position, and tokens that draw unusually little.

    shares = output_source_shares(model, sources, outputs)     # per sentence: (n_out,) source share per token
    by_position(shares)                                        # mean and count per output position
    thr = LowShareThresholds.fit(shares, pieces, quantile=0.05)  # on clean, in-domain translations
    flags = thr.flag(shares[k], pieces[k])                     # True: a hallucination candidate
    thr.flag_sentence(shares[k])                               # True: the whole output draws little on its source

Output token y_t (0-based, EOS last) is predicted by decoder position t, which reads y_{t-1} (or the start
token); its source share is the ALTI+ rollout's source part of that position (`alti.Alti.source_share`),
the rest coming from the target prefix. Low source reliance is the signal Dale et al. (2023, "Detecting
and mitigating hallucinations in machine translation") use with ALTI+: an output the model writes from its
own prefix rather than the source. Thresholds are quantiles of clean in-domain tokens, kept apart for
tokens that start a word and for word continuations (a continuation leans on its prefix by nature);
sentencepiece's "▁" marks a word start. Dale et al. score whole sentences (the output's total source
contribution); `sentence_share` and `flag_sentence` do that, with the same quantile of clean sentences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...core.batching import corpus_batches
from .alti import alti

WORD_START = "▁"


@torch.no_grad()
def output_source_shares(model, sources: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], *,
                         batch_size: int = 16) -> list[np.ndarray]:
    """The ALTI+ source share of every output token (outputs end with EOS; sources as the encoder reads them)."""
    if len(sources) != len(outputs):
        raise ValueError(f"{len(sources)} sources but {len(outputs)} outputs")
    empty = [k for k in range(len(sources)) if not sources[k] or not outputs[k]]
    if empty:
        raise ValueError(f"sentence {empty[0]}: empty source or output")
    cfg = model.cfg
    out: list[np.ndarray | None] = [None] * len(sources)
    for batch, b in corpus_batches(sources, outputs, pad_id=cfg.pad_id, start_id=cfg.start_id, batch_size=batch_size,
                                   device=model.device):
        share = alti(model, b.src, b.tgt_in).source_share.cpu().numpy()  # (B, T)
        for row, k in enumerate(batch):
            out[k] = share[row, : len(outputs[k])].astype(np.float64)
    return out  # type: ignore[return-value]


def by_position(shares: Sequence[np.ndarray], *, skip_last: bool = True) -> dict[int, tuple[float, int]]:
    """{position: (mean source share, tokens)} over sentences (EOS, the last token, left out by default)."""
    sums: dict[int, list[float]] = {}
    for s in shares:
        values = s[:-1] if skip_last else s
        for t, v in enumerate(values):
            sums.setdefault(t, []).append(float(v))
    return {t: (float(np.mean(v)), len(v)) for t, v in sorted(sums.items())}


def position_trend(positions: dict[int, tuple[float, int]], *, start: int = 1, min_tokens: int = 5) -> float:
    """The Spearman rank correlation of output position and mean source share (`by_position`'s result) over the
    positions from `start` on that at least `min_tokens` outputs reach: negative when reliance on the source falls
    along the sentence. Position 0 is left out by default: it has no target prefix to lean on but the start token,
    so its share is high by construction. NaN with fewer than three positions."""
    kept = [(t, v) for t, (v, n) in positions.items() if t >= start and n >= min_tokens]
    if len(kept) < 3:
        return float("nan")
    ranks = [np.argsort(np.argsort(np.array(x), kind="stable")).astype(float) for x in zip(*kept)]
    return float(np.corrcoef(ranks[0], ranks[1])[0, 1])


def sentence_share(shares: np.ndarray) -> float:
    """The mean source share of an output's tokens, EOS left out (EOS alone when it is the whole output)."""
    values = shares[:-1] if len(shares) > 1 else shares
    return float(np.mean(values))


def _kinds(pieces: Sequence[str]) -> list[str]:
    return ["start" if p.startswith(WORD_START) else "continuation" for p in pieces]


@dataclass(frozen=True)
class LowShareThresholds:
    """Per token kind (word start / continuation), the source share below which a token is flagged."""

    start: float
    continuation: float
    quantile: float
    tokens: int
    sentence: float | None = None  # the same quantile of clean sentences' `sentence_share`

    @classmethod
    def fit(cls, shares: Sequence[np.ndarray], pieces: Sequence[Sequence[str]], *, quantile: float = 0.05
            ) -> LowShareThresholds:
        """The `quantile` of clean tokens' source shares, per kind (EOS excluded)."""
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must lie in (0, 1), got {quantile}")
        values: dict[str, list[float]] = {"start": [], "continuation": []}
        for s, p in zip(shares, pieces, strict=True):
            for v, kind in zip(s[:-1], _kinds(p[:-1])):
                values[kind].append(float(v))
        if not values["start"]:
            raise ValueError("no tokens to fit thresholds on")
        cont = values["continuation"] or values["start"]
        sentences = [sentence_share(s) for s in shares]
        return cls(float(np.quantile(values["start"], quantile)), float(np.quantile(cont, quantile)), quantile,
                   len(values["start"]) + len(values["continuation"]), float(np.quantile(sentences, quantile)))

    def flag(self, shares: np.ndarray, pieces: Sequence[str]) -> list[bool]:
        """True for each token (EOS never) whose source share lies below its kind's threshold."""
        kinds = _kinds(pieces)
        flags = [float(v) < (self.start if k == "start" else self.continuation) for v, k in zip(shares, kinds)]
        if flags:
            flags[-1] = False  # EOS
        return flags

    def flag_sentence(self, shares: np.ndarray) -> bool:
        """True when the output's mean source share (`sentence_share`) lies below the clean sentences' quantile."""
        if self.sentence is None:
            raise ValueError("these thresholds have no sentence level (fit them with LowShareThresholds.fit)")
        return sentence_share(shares) < self.sentence

    def __str__(self) -> str:
        text = (f"source share below {self.start:.3f} (word start) / {self.continuation:.3f} (continuation): the "
                f"{100 * self.quantile:g} % quantile of {self.tokens} clean tokens")
        return text if self.sentence is None else text + f"; sentences: mean below {self.sentence:.3f}"

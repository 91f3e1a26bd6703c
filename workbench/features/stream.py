"""Activations streamed from a teacher-forced corpus through a shuffle buffer: never the whole matrix in memory.

    stream = ActivationStream(model, data, site, buffer=65536, batch=4096, seed=0)
    x, y = stream.next_batch()        # (4096, d_in), and (4096, d_out) for a transcoder (else None)
    state = stream.state_dict()       # exact resume: the buffer, the corpus position, the RNG
    stream.load_state_dict(state)

The corpus is read in token-bucketed model batches (`ParallelData.batches`, the trainer's plan: a pure
function of seed and epoch), the model runs only as far as the site (`capture_site`), and the real positions'
rows enter a buffer of `buffer` rows. Each cycle the buffer is permuted, its first half goes out as training
batches, and that half is refilled from the corpus (SAELens's mixing buffer): every activation is used exactly
once, and rows from different sentences and epochs mix. Under torchrun, rank r reads every world-th model
batch of the plan and keeps its own buffer.
"""

from __future__ import annotations

import torch

from ..core.model import Transformer
from ..corpus.data import ParallelData
from .sites import Site, site_rows


class ActivationStream:
    def __init__(self, model: Transformer, data: ParallelData, site: Site, *, buffer: int = 65536,
                 batch: int = 4096, max_tokens: int = 4096, seed: int = 0, rank: int = 0, world: int = 1) -> None:
        if batch < 1 or buffer < 2 * batch or buffer % (2 * batch):
            raise ValueError(f"buffer ({buffer}) must be a positive multiple of 2 x batch ({batch})")
        self.model, self.data, self.site = model, data, site
        self.buffer_rows, self.batch, self.max_tokens = buffer, batch, max_tokens
        self.seed, self.rank, self.world = seed, rank, world
        self.gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
        self.epoch = 0
        self.pos = 0  # index of the next model batch in this rank's share of the epoch's plan
        self.cursor = buffer // 2  # next row to hand out; at half: refill first
        self.buf: torch.Tensor | None = None
        self.pending: torch.Tensor | None = None  # rows read from the corpus but not yet in the buffer
        self.rows_read = 0  # activations read from the corpus so far (this rank)
        self.model_batches = 0
        self._plan: list[list[int]] | None = None
        self._plan_epoch = -1
        self.d_in = model.cfg.d_model  # a transcoder's rows are [FFN input | FFN output]

    # -- corpus side ---------------------------------------------------------------------------
    def _share(self) -> list[list[int]]:
        if self._plan_epoch != self.epoch:
            plan = self.data.batches(self.max_tokens, seed=self.seed, epoch=self.epoch)
            self._plan, self._plan_epoch = plan[self.rank :: self.world], self.epoch
            if not self._plan:
                raise ValueError(f"the corpus has {len(plan)} model batches, fewer than the {self.world} ranks")
        return self._plan

    def _read(self) -> torch.Tensor:
        """The next model batch's rows (x and y side by side for a transcoder)."""
        share = self._share()
        batch = self.data.collate(share[self.pos], self.model.cfg)
        self.pos += 1
        if self.pos == len(share):
            self.epoch, self.pos = self.epoch + 1, 0
        x, y = site_rows(self.model, batch, self.site)
        rows = x if y is None else torch.cat([x, y], dim=1)
        self.rows_read += rows.size(0)
        self.model_batches += 1
        return rows.cpu()

    def _take(self, n: int) -> torch.Tensor:
        parts, have = [], 0
        if self.pending is not None and self.pending.size(0):
            parts.append(self.pending[:n])
            have = parts[0].size(0)
            self.pending = self.pending[n:]
        while have < n:
            rows = self._read()
            need = n - have
            parts.append(rows[:need])
            have += min(need, rows.size(0))
            self.pending = rows[need:]
        return torch.cat(parts) if len(parts) > 1 else parts[0].clone()

    # -- training side -------------------------------------------------------------------------
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        half = self.buffer_rows // 2
        if self.buf is None:
            self.buf = self._take(self.buffer_rows)
            self.buf = self.buf[torch.randperm(self.buffer_rows, generator=self.gen)]
            self.cursor = 0
        elif self.cursor >= half:
            self.buf[:half] = self._take(half)
            self.buf = self.buf[torch.randperm(self.buffer_rows, generator=self.gen)]
            self.cursor = 0
        rows = self.buf[self.cursor : self.cursor + self.batch].clone()  # the buffer is refilled in place
        self.cursor += self.batch
        if self.site.transcoder:
            return rows[:, : self.d_in], rows[:, self.d_in :]
        return rows, None

    @property
    def epochs(self) -> float:
        """Epochs of this rank's share read so far (fractional)."""
        share = len(self._share()) if self._plan is not None else 1
        return self.epoch + self.pos / share

    def state_dict(self) -> dict:
        empty = torch.zeros(0)
        return {"buf": empty if self.buf is None else self.buf.clone(),
                "pending": empty if self.pending is None else self.pending.clone(),
                "gen": self.gen.get_state(), "epoch": self.epoch, "pos": self.pos, "cursor": self.cursor,
                "rows_read": self.rows_read, "model_batches": self.model_batches, "rank": self.rank,
                "world": self.world, "seed": self.seed, "buffer": self.buffer_rows, "batch": self.batch}

    def load_state_dict(self, state: dict) -> None:
        for key in ("rank", "world", "seed", "buffer", "batch"):
            if state[key] != getattr(self, "buffer_rows" if key == "buffer" else key):
                raise ValueError(f"saved stream has {key}={state[key]}, this run {key}="
                                 f"{getattr(self, 'buffer_rows' if key == 'buffer' else key)}")
        self.buf = state["buf"] if state["buf"].numel() else None
        self.pending = state["pending"] if state["pending"].numel() else None
        self.gen.set_state(state["gen"])
        self.epoch, self.pos, self.cursor = state["epoch"], state["pos"], state["cursor"]
        self.rows_read, self.model_batches = state["rows_read"], state["model_batches"]

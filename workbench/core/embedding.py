"""Token embeddings and positional encodings (every layout published checkpoints use)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import ModelConfig


def sinusoidal_positions(length: int, d_model: int, kind: str = "sinusoidal", offset: int = 0) -> torch.Tensor:
    """(length, d_model) table for positions offset .. offset + length - 1.

    sinusoidal (the paper, OpenNMT-py): PE(pos, 2i) = sin(pos / 10000^(2i/d)),
        PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), interleaved.
    sinusoidal_halves (Hugging Face Marian): the same frequencies, laid out [sin ... | cos ...].
    sinusoidal_t2t (tensor2tensor, fairseq, FSMT): [sin | cos] with frequencies
        exp(-i * log(10000) / (d/2 - 1)), i = 0 .. d/2 - 1.
    """
    if d_model % 2:
        raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
    half = d_model // 2
    pos = torch.arange(offset, offset + length, dtype=torch.float64)[:, None]
    i = torch.arange(half, dtype=torch.float64)
    if kind in ("sinusoidal", "sinusoidal_halves"):
        freq = torch.exp(-(2 * i / d_model) * math.log(10000.0))
    elif kind == "sinusoidal_t2t":
        freq = torch.exp(-i * math.log(10000.0) / max(half - 1, 1))
    else:
        raise ValueError(f"unknown sinusoidal kind {kind!r}")
    angles = pos * freq  # (L, d/2)
    table = torch.empty(length, d_model, dtype=torch.float64)
    if kind == "sinusoidal":
        table[:, 0::2] = torch.sin(angles)
        table[:, 1::2] = torch.cos(angles)
    else:
        table[:, :half] = torch.sin(angles)
        table[:, half:] = torch.cos(angles)
    return table.float()


class Positions(nn.Module):
    """Position vectors for positions start .. start + length - 1 (plus the config's offset)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.kind = cfg.positions
        self.offset = cfg.position_offset
        self.max_positions = cfg.max_positions
        n = cfg.max_positions + cfg.position_offset
        if cfg.positions == "learned":
            self.weight = nn.Parameter(torch.empty(n, cfg.d_model))
            nn.init.normal_(self.weight, std=cfg.d_model**-0.5)
        elif cfg.positions == "none":
            self.register_buffer("table", torch.zeros(n, cfg.d_model), persistent=False)
        else:
            table = sinusoidal_positions(n, cfg.d_model, cfg.positions)
            self.register_buffer("table", table, persistent=False)

    def forward(self, length: int, start: int = 0) -> torch.Tensor:
        """(1, length, d_model)."""
        if start + length > self.max_positions:
            raise ValueError(
                f"sequence of {start + length} positions is longer than max_positions ({self.max_positions}); "
                f"truncate the input or use a config with larger max_positions"
            )
        table = self.weight if self.kind == "learned" else self.table
        first = self.offset + start
        return table[first : first + length].unsqueeze(0)


def init_embedding(embedding: nn.Embedding, d_model: int, pad_id: int) -> None:
    """N(0, d^-1/2) with a zero padding row (fairseq's init; keeps x·sqrt(d) at unit scale)."""
    nn.init.normal_(embedding.weight, mean=0.0, std=d_model**-0.5)
    with torch.no_grad():
        embedding.weight[pad_id].zero_()

"""Id lists to model input: padding into one tensor, cutting a length-sorted order into token-budget batches, and
the one loop over a corpus in padded batches (`corpus_batches`). Training, the translator, validation and the
analyses all batch here (model side: no corpus reading)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch


def pad_sequences(rows: Sequence[Sequence[int]], pad_id: int, *, device: torch.device | str | None = None
                  ) -> torch.Tensor:
    """(N, longest) long tensor of id lists, right-padded with `pad_id`: the one padding helper."""
    if len(rows) == 0:
        raise ValueError("no sequences to pad")
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
    return out if device is None else out.to(device)


def token_batches(lengths: Sequence[int], max_tokens: int, order: Sequence[int] | None = None) -> list[list[int]]:
    """Cut `order` (default: 0..N-1, usually sorted by length) into consecutive batches whose padded
    size, items x longest length, stays within `max_tokens` (fairseq's --max-tokens); one item longer
    than the budget still forms its own batch. Training, the translator and validation all batch here."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens ({max_tokens}) must be positive")
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in range(len(lengths)) if order is None else order:
        n = max(longest, int(lengths[i]))
        if cur and (len(cur) + 1) * n > max_tokens:
            out.append(cur)
            cur, n = [], int(lengths[i])
        cur.append(i)
        longest = n
    if cur:
        out.append(cur)
    return out


def decoder_input(tokens: Sequence[int], start_id: int, *, prefix: bool = False) -> list[int]:
    """What the decoder reads, teacher-forced: the start token, then `tokens` without the last (an output that
    ends with EOS: the decoder reads start + all but the EOS to predict every output token). `prefix=True`:
    `tokens` is a prefix still being extended (beam search's live beams), read whole. The one place the shift
    is written."""
    tokens = [int(t) for t in tokens]
    return [start_id, *(tokens if prefix else tokens[:-1])]


@dataclass
class TeacherForced:
    """A padded batch ready for `model(src, tgt_in)` / `run_with_cache`, with what padding hides spelled out.

    Lengths, not `ids != pad_id`, say which positions are real: a decoder input may start with the padding id
    (Marian's decoder start token is its pad)."""

    src: torch.Tensor  # (B, S) source ids, right-padded
    tgt_in: torch.Tensor | None  # (B, T) decoder inputs: start + output[:-1] (None: sources only)
    tgt_out: torch.Tensor | None  # (B, T) the outputs predicted at each position (EOS last), pad after
    src_lengths: torch.Tensor  # (B,)
    tgt_lengths: torch.Tensor | None  # (B,) real decoder positions = output lengths

    def src_mask(self) -> torch.Tensor:
        """(B, S) True on real source positions."""
        return torch.arange(self.src.size(1), device=self.src.device)[None] < self.src_lengths[:, None]

    def tgt_mask(self) -> torch.Tensor:
        """(B, T) True on real decoder positions (the start token included, whatever its id)."""
        if self.tgt_in is None or self.tgt_lengths is None:
            raise ValueError("this batch has no outputs, so no decoder positions")
        return torch.arange(self.tgt_in.size(1), device=self.tgt_in.device)[None] < self.tgt_lengths[:, None]


def teacher_forced(sources: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], *, pad_id: int,
                   start_id: int, device: torch.device | str | None = None) -> TeacherForced:
    """Pad sources and outputs (each output ending with EOS) into a `TeacherForced` batch."""
    if len(sources) != len(outputs):
        raise ValueError(f"{len(sources)} sources but {len(outputs)} outputs")
    empty = [i for i, o in enumerate(outputs) if len(o) == 0]
    if empty:
        raise ValueError(f"outputs {empty[:5]} are empty: every output needs at least its EOS")
    src = pad_sequences(sources, pad_id, device=device)
    tgt_in = pad_sequences([decoder_input(o, start_id) for o in outputs], pad_id, device=device)
    tgt_out = pad_sequences(outputs, pad_id, device=device)
    as_lengths = lambda rows: torch.tensor([len(r) for r in rows], dtype=torch.long, device=src.device)  # noqa: E731
    return TeacherForced(src, tgt_in, tgt_out, as_lengths(sources), as_lengths(outputs))


def length_order(sources: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]] | None = None) -> list[int]:
    """Indices sorted by source length, then output length (stable: equal lengths keep their order), so a batch
    pads little."""
    if outputs is None:
        return sorted(range(len(sources)), key=lambda i: len(sources[i]))
    return sorted(range(len(sources)), key=lambda i: (len(sources[i]), len(outputs[i])))


def corpus_batches(sources: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]] | None = None, *,
                   pad_id: int, start_id: int = 0, batch_size: int, order: Sequence[int] | None = None,
                   source_end: int | None = None, prefix: bool = False,
                   device: torch.device | str | None = None) -> Iterator[tuple[list[int], TeacherForced]]:
    """The one loop over a corpus: `(indices, batch)` for consecutive slices of `batch_size` sentences of `order`
    (default `length_order(sources, outputs)`; `range(len(sources))` keeps the given order). `batch` is a
    `TeacherForced`: padded sources, and with `outputs` (each as predicted, EOS last) the decoder inputs
    (start + output[:-1]) and outputs. Results come in `order`; putting them back is the caller's one line,
    `out[i] = ...` for `i` in `indices`.

    For word lists without their EOS (the alignment analyses): `source_end` is appended to every source, and
    `prefix=True` reads each output whole (start + output, `decoder_input(prefix=True)`), so the batch has no
    `tgt_out` and `tgt_lengths` counts the start token."""
    if batch_size < 1:
        raise ValueError(f"batch_size ({batch_size}) must be at least 1")
    if outputs is not None and len(outputs) != len(sources):
        raise ValueError(f"{len(sources)} sources but {len(outputs)} outputs")
    order = length_order(sources, outputs) if order is None else list(order)
    end = [] if source_end is None else [source_end]
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        src_rows = [[*sources[i], *end] for i in idx]
        src = pad_sequences(src_rows, pad_id, device=device)
        src_lengths = torch.tensor([len(r) for r in src_rows], dtype=torch.long, device=src.device)
        if outputs is None:
            yield idx, TeacherForced(src, None, None, src_lengths, None)
            continue
        rows = [list(outputs[i]) for i in idx]
        tgt_rows = [decoder_input(o, start_id, prefix=prefix) for o in rows]
        tgt_in = pad_sequences(tgt_rows, pad_id, device=device)
        tgt_out = None if prefix else pad_sequences(rows, pad_id, device=device)
        tgt_lengths = torch.tensor([len(r) for r in tgt_rows], dtype=torch.long, device=src.device)
        yield idx, TeacherForced(src, tgt_in, tgt_out, src_lengths, tgt_lengths)

"""Text in, text out: a model with its tokenizers and decoding defaults.

    tm = workbench.load("runs/multi30k")              # a checkpoint directory
    tm.translate(["Ein Hund läuft.", ""])             # -> ["A dog is running.", ""]
    r = tm.translate(["Ein Hund läuft."], beam=5, n_best=3, return_traces=True)[0]
    r.text, r.score, r.pieces, r.n_best, r.trace["dec.2.cross_attn.hook_probs"]
    with workbench.features.splice(tm.model, sae):    # a dictionary at its site (see core.splice)
        tm.translate(["Ein Hund läuft."], steer={"hook_memory": {12: 5.0}})   # clamp feature 12 to 5
        tm.translate(["Ein Hund läuft."], steer={"hook_memory": {12: "+5"}})  # add 5 to it

Input policy (chosen to match Marian and CTranslate2, which keep one output line per input line):
- empty and whitespace-only inputs give "" without running the model, in place;
- a source longer than the model's max_positions is cut to fit (EOS kept) with a warning naming
  the sentence, never an error and never an unbounded allocation;
- anything the tokenizer accepts is translated (control characters, emoji, RTL, CJK); outputs
  never contain a line break, so line-oriented tools keep their line count.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..checkpoint.format import load_checkpoint
from ..checkpoint.tokenizer import Tokenizer
from ..core.batching import TeacherForced, decoder_input, pad_sequences, teacher_forced, token_batches
from ..core.config import DecodeConfig, config_keys
from ..core.model import Transformer
from ..core.splice import Steer, steering_hooks
from ..core.trace import Trace
from .search import Generation, generate

# The notes of the `trace` call running in this thread (or task). A ContextVar, not warnings.catch_warnings:
# that swaps the process-wide filter list, so in a server it recorded other threads' warnings (Panel's
# deprecations reached a page's message) and could garble their filters.
_NOTES: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("translation_notes", default=None)


def _warn(message: str, *, stacklevel: int) -> None:
    """Warn the caller, and note `message` for the `trace` call listening in this thread, if any."""
    notes = _NOTES.get()
    if notes is not None:
        notes.append(message)
    warnings.warn(message, stacklevel=stacklevel + 1)

_LINE_BREAKS = str.maketrans({"\n": " ", "\r": " ", "\v": " ", "\f": " ", "\x1c": " ", "\x1d": " ", "\x1e": " ",
                              "\x85": " ", "\u2028": " ", "\u2029": " "})


@dataclass
class Translation:
    """One sentence's result when tokens, scores or traces are requested."""

    source: str
    text: str
    tokens: list[int] = field(default_factory=list)
    """Output ids, ending with EOS (empty for an empty source)."""
    pieces: list[str] = field(default_factory=list)
    """One display string per output id."""
    source_tokens: list[int] = field(default_factory=list)
    """Source ids fed to the encoder (after truncation, with EOS when the model expects it)."""
    score: float | None = None
    """Length-normalised log-probability (what beam search ranks by); None for an empty source."""
    log_prob: float | None = None
    n_best: list[tuple[str, float]] = field(default_factory=list)
    """(text, score) of the n best hypotheses, best first."""
    trace: Trace | None = None
    """Attention over the whole generation (enc self, dec self, cross; every layer and head)."""
    truncated: bool = False
    forced: bool = False
    """The output was given (teacher forcing, `trace(..., target=...)`), not decoded."""
    notes: list[str] = field(default_factory=list)
    """What was adjusted on the way, in words (a source or target cut to max_positions)."""


class TranslationModel:
    """A `Transformer` plus source/target tokenizers and decoding defaults (`DecodeConfig`)."""

    def __init__(
        self,
        model: Transformer,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer | None = None,
        *,
        decode: DecodeConfig | None = None,
        append_eos: bool = True,
        meta: dict[str, Any] | None = None,
        alignment: dict[str, Any] | None = None,
    ) -> None:
        self.model = model.eval()
        self.src_tokenizer = src_tokenizer
        self.tgt_tokenizer = tgt_tokenizer or src_tokenizer
        self.decode_config = decode or DecodeConfig()
        self.append_eos = append_eos
        self.meta = dict(meta or {})
        # the checkpoint's alignment.json (workbench.analysis.alignment.word_align.AlignmentSpec)
        self.alignment = alignment

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, *, device: torch.device | str = "cpu", decode: DecodeConfig | None = None
    ) -> TranslationModel:
        """Load a checkpoint; its meta["generation"] (set by importers) supplies the decoding defaults."""

        ckpt = load_checkpoint(path, device=device)
        if ckpt.src_tokenizer is None:
            raise ValueError(f"checkpoint {ckpt.path} has no tokenizer, so it cannot translate text")
        generation = dict(ckpt.meta.get("generation") or {})
        append_eos = bool(generation.pop("append_eos", True))
        if decode is None:
            decode = decode_config_from_meta(generation)
        return cls(ckpt.model, ckpt.src_tokenizer, ckpt.tgt_tokenizer, decode=decode, append_eos=append_eos,
                   meta={"path": str(ckpt.path), **ckpt.meta}, alignment=ckpt.alignment)

    @property
    def device(self) -> torch.device:
        return self.model.device

    # -- configuration --------------------------------------------------------------------------
    def config_with(self, **overrides: Any) -> DecodeConfig:
        """The default DecodeConfig with some fields changed (None values are ignored)."""
        changes = {k: v for k, v in overrides.items() if v is not None}
        unknown = sorted(set(changes) - config_keys(DecodeConfig))
        if unknown:
            valid = sorted(f.name for f in dataclasses.fields(DecodeConfig))
            raise ValueError(f"unknown decoding options {unknown}; valid: {valid}")
        return dataclasses.replace(self.decode_config, **changes)

    # -- text -> ids ----------------------------------------------------------------------------
    def encode_source(self, text: str, *, where: str = "a sentence") -> tuple[list[int], bool]:
        """Source ids for one sentence (EOS appended when the model expects it) and whether it was cut."""
        if not text.strip():
            return [], False
        ids = self.src_tokenizer.encode(text)
        if not ids:
            return [], False
        room = self.model.cfg.max_positions - (1 if self.append_eos else 0)
        truncated = len(ids) > room
        if truncated:
            _warn(f"{where} has {len(ids)} source tokens; truncated to {room} to fit the model's "
                  f"max_positions ({self.model.cfg.max_positions})", stacklevel=3)
            ids = ids[:room]
        return ids + ([self.model.cfg.eos_id] if self.append_eos else []), truncated

    # -- translation ----------------------------------------------------------------------------
    def translate(
        self,
        texts: str | Sequence[str],
        *,
        return_tokens: bool = False,
        return_scores: bool = False,
        return_traces: bool = False,
        steer: Steer | None = None,
        **options: Any,
    ) -> list[str] | list[Translation]:
        """Translate sentences; `options` override DecodeConfig fields (beam=, n_best=, alpha=, ...).

        Returns one string per input, or `Translation` objects when any return_* flag is set.
        A single string is accepted and treated as a list of one.

        `steer` {site: {feature: edit}} edits dictionary features at every position while decoding (greedy or
        beam, with the KV cache): a number clamps the feature to it, a signed string adds ("+5", "-2"; "=-2"
        clamps to -2). Each site needs a dictionary spliced in (`workbench.features.splice`); the edit is the
        hook `core.splice.steering_hooks` puts on `<site>.sae.hook_acts`, so writing it as your own hook there gives
        the same output (bit for bit when the hook declares its features with `core.splice.edits_features`, within
        float rounding otherwise), and an edit of 0 ("+0") gives the unsteered output bit for bit.
        """
        if isinstance(texts, str):
            texts = [texts]
        cfg = self.config_with(**options)
        rich = return_tokens or return_scores or return_traces
        with self._steering(steer):
            results = self._translate(list(texts), cfg, traces=return_traces)
        return results if rich else [r.text for r in results]

    def _steering(self, steer: Steer | None) -> contextlib.AbstractContextManager[None]:
        """The steering hooks active for a block (nothing when `steer` is empty); bad sites or features raise here,
        before any sentence is decoded."""
        if not steer:
            return contextlib.nullcontext()
        return self.model.hooks(steering_hooks(self.model, steer))

    def encode_batch(self, sources: Sequence[str], outputs: Sequence[str | Sequence[int]] | None = None
                     ) -> TeacherForced:
        """Sentences as one padded batch on the model's device, ready for `model(b.src, b.tgt_in)` and
        `run_with_cache`: sources encoded as `translate` encodes them (EOS appended, cut to fit), outputs (texts, or
        id lists ending with EOS) shifted into decoder inputs; lengths say which positions are real. Without
        outputs, `tgt_in`/`tgt_out`/`tgt_lengths` are None (decode the sources first for the model's own outputs)."""
        if isinstance(sources, str):
            raise TypeError("encode_batch takes a list of sentences; wrap a single one in a list")
        if outputs is not None and len(outputs) != len(sources):
            raise ValueError(f"{len(sources)} sources but {len(outputs)} outputs")
        src_ids = [self.encode_source(t, where=f"sentence {i}")[0] for i, t in enumerate(sources)]
        empty = [i for i, ids in enumerate(src_ids) if not ids]
        if empty:
            raise ValueError(f"sentences {empty[:5]} are empty: nothing to encode")
        cfg = self.model.cfg
        if outputs is None:
            src = pad_sequences(src_ids, cfg.pad_id, device=self.device)
            lengths = torch.tensor([len(r) for r in src_ids], device=self.device)
            return TeacherForced(src, None, None, lengths, None)
        out_ids = [[*self.tgt_tokenizer.encode(o)[: cfg.max_positions - 1], cfg.eos_id] if isinstance(o, str)
                   else [int(i) for i in o] for o in outputs]
        return teacher_forced(src_ids, out_ids, pad_id=cfg.pad_id, start_id=cfg.start_id, device=self.device)

    def trace(self, text: str, *, target: str | Sequence[int] | None = None, **options: Any) -> Translation:
        """A sentence in; its translation, whole-generation attention trace and notes out.

        The one home of "inspect one sentence" (the app, notebooks): decodes with `options` (beam=, alpha=,
        ... as `translate`), or with `target` (text, or output ids ending with EOS) teacher-forces that output
        instead (`score`). Token strings are in trace.meta["src_pieces" / "tgt_pieces" / "out_pieces"];
        what was cut to fit max_positions is in `notes` (as well as warned). An empty source gives an empty
        Translation with no trace."""
        cfg = self.config_with(**options)
        notes: list[str] = []
        listening = _NOTES.set(notes)  # this call's notes only: other threads' warnings never land here
        try:
            src_ids, cut = self.encode_source(text, where="the sentence")
            if not src_ids:
                r = Translation(source=text, text="")
            elif target is not None and len(target) > 0 and (not isinstance(target, str) or target.strip()):
                r = self.score(src_ids, target, trace=True)
                r.source, r.forced, r.truncated = text, True, r.truncated or cut
            else:
                r = Translation(source=text, text="", source_tokens=src_ids, truncated=cut)
                src = torch.tensor([src_ids], dtype=torch.long, device=self.device)
                with torch.no_grad():
                    self._fill([r], [0], generate(self.model, src, cfg, trace=True))
        finally:
            _NOTES.reset(listening)
        r.notes = notes
        return r

    def score(self, source: str | Sequence[int], output: str | Sequence[int], *, trace: bool = False) -> Translation:
        """Teacher forcing: the log-probability the model gives `output` for `source`, with no search.

        Text is encoded as `translate` encodes it (the output gets EOS; either side longer than
        max_positions is cut with a warning); id lists are used as given (output ids end with EOS).
        Runs under whatever hooks are active; `trace=True` returns the attention read on the way.
        """
        cfg = self.model.cfg
        if isinstance(source, str):
            src_ids, cut = self.encode_source(source, where="the source")
        else:
            src_ids, cut = [int(i) for i in source], False
        if isinstance(output, str):
            out_ids = self.tgt_tokenizer.encode(output)
            room = cfg.max_positions - 1
            if len(out_ids) > room:
                _warn(f"the output has {len(out_ids)} tokens; truncated to {room} to fit the model's "
                      f"max_positions ({cfg.max_positions})", stacklevel=2)
                out_ids, cut = out_ids[:room], True
            out_ids = [*out_ids, cfg.eos_id]
        else:
            out_ids = [int(i) for i in output]
        if not src_ids or not out_ids:
            raise ValueError(f"score needs a non-empty source and output, got {len(src_ids)} and {len(out_ids)} ids")
        src = torch.tensor([src_ids], dtype=torch.long, device=self.device)
        tgt_in = torch.tensor([decoder_input(out_ids, cfg.start_id)], dtype=torch.long, device=self.device)
        with torch.no_grad():
            if trace:
                logits, captured = self.model.run_with_cache(src, tgt_in, "*.hook_probs", device="cpu")
            else:
                logits, captured = self.model(src, tgt_in), None
        lp = torch.log_softmax(logits[0].float(), dim=-1)
        log_prob = float(lp.gather(-1, torch.tensor(out_ids, device=lp.device)[:, None]).sum())
        pieces = self.tgt_tokenizer.pieces(out_ids)
        text = self.detokenize(out_ids)
        if captured is not None:
            captured.meta.update(src_pieces=self.src_tokenizer.pieces(src_ids),
                                 tgt_pieces=self.tgt_tokenizer.pieces(tgt_in[0].tolist()), out_pieces=pieces,
                                 translation=text, log_prob=log_prob)
        return Translation(source=source if isinstance(source, str) else "", text=text, tokens=out_ids,
                           pieces=pieces, source_tokens=src_ids, log_prob=log_prob, trace=captured, truncated=cut)

    def translate_lines(self, lines: Iterable[str], *, chunk: int = 512, steer: Steer | None = None,
                        **options: Any) -> Iterator[str]:
        """Stream: one output line per input line, in order, holding at most `chunk` lines at a time.

        Warnings name input lines counting from 1 (as editors and `sed -n` do). `steer`: as `translate`'s.
        """
        if chunk < 1:
            raise ValueError(f"chunk ({chunk}) must be at least 1")
        cfg = self.config_with(**options)
        self._steering(steer)  # bad sites or features raise before the first line is translated
        buffer: list[str] = []
        offset = 1
        for line in lines:
            buffer.append(line)
            if len(buffer) >= chunk:
                yield from self._texts(buffer, cfg, offset, steer)
                offset += len(buffer)
                buffer = []
        if buffer:
            yield from self._texts(buffer, cfg, offset, steer)

    def _texts(self, lines: list[str], cfg: DecodeConfig, first_line: int, steer: Steer | None) -> Iterator[str]:
        # the hooks are entered and left around the chunk, not across a yield: a context variable set inside a
        # generator would leak into the caller's code between lines
        with self._steering(steer):
            results = self._translate(lines, cfg, traces=False, first_index=first_line, label="line")
        yield from (r.text for r in results)

    def _translate(
        self, texts: list[str], cfg: DecodeConfig, *, traces: bool, first_index: int = 0, label: str = "sentence"
    ) -> list[Translation]:
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"{label} {first_index + i} is {type(t).__name__}, not str")
        encoded = [self.encode_source(t, where=f"{label} {first_index + i}") for i, t in enumerate(texts)]
        results = [Translation(source=t, text="", source_tokens=ids, truncated=cut)
                   for t, (ids, cut) in zip(texts, encoded)]
        todo = sorted((i for i, (ids, _) in enumerate(encoded) if ids), key=lambda i: len(encoded[i][0]))
        for batch in token_batches([len(ids) for ids, _ in encoded], cfg.max_tokens, todo):
            src = pad_sequences([encoded[i][0] for i in batch], self.model.cfg.pad_id, device=self.device)
            gen = generate(self.model, src, cfg, trace=traces)
            self._fill(results, batch, gen)
        return results

    def _fill(self, results: list[Translation], batch: list[int], gen: Generation) -> None:
        tok = self.tgt_tokenizer
        for j, i in enumerate(batch):
            hyps = gen.hypotheses[j]
            r = results[i]
            best = hyps[0]
            r.tokens, r.score, r.log_prob = best.tokens, best.score, best.log_prob
            r.text = self.detokenize(best.tokens)
            r.pieces = tok.pieces(best.tokens)
            r.n_best = [(self.detokenize(h.tokens), h.score) for h in hyps]
            if gen.traces is not None:
                t = gen.traces[j]
                t.meta.update(src_pieces=self.src_tokenizer.pieces(t.src[0].tolist()),
                              tgt_pieces=tok.pieces(t.tgt[0].tolist()), out_pieces=r.pieces,
                              source=r.source, translation=r.text, score=r.score)
                r.trace = t

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text for output ids; line breaks become spaces so one input line gives one output line."""
        return self.tgt_tokenizer.decode(list(ids)).translate(_LINE_BREAKS)

    def __repr__(self) -> str:
        return f"TranslationModel({self.meta.get('path', 'in memory')}, {self.decode_config})"


def decode_config_from_meta(generation: dict[str, Any]) -> DecodeConfig:
    """DecodeConfig from a checkpoint's meta["generation"] (importers' defaults); unknown keys are an error."""
    values = dict(generation)
    values.pop("append_eos", None)
    lp = values.pop("length_penalty", None)
    if isinstance(lp, dict):
        if "kind" in lp:
            values["length_penalty"] = lp["kind"]
        if "alpha" in lp:
            values["alpha"] = float(lp["alpha"])
    elif lp is not None:
        values["length_penalty"] = lp
    return DecodeConfig.from_dict(values)


def load(path: str | Path, *, device: torch.device | str = "cpu", **decode: Any) -> TranslationModel:
    """A checkpoint as a `TranslationModel`; keyword arguments override its decoding defaults."""
    tm = TranslationModel.from_checkpoint(path, device=device)
    if decode:
        tm.decode_config = tm.config_with(**decode)
    return tm

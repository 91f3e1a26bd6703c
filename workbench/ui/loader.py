"""What is per process: checkpoint discovery, and the cached models (the worker threads are requests.py's).

A model is loaded once per process and shared read-only by every session: the sessions never mutate it, and
interventions are call-scoped hooks (a ContextVar set inside the worker thread), so one user's ablation never
reaches another user's forward pass.

One cache holds what is loaded from checkpoints (`CACHE`, a `CheckpointCache`): models, their training logs and
their dictionaries (`FeatureData`), least recently used first out, at most `LIMITS` of each kind. An entry is keyed
by the checkpoint's resolved directory and the size and modification time of its files (`checkpoint_key`), so a
checkpoint replaced on disk (a run that wrote a new snapshot behind its `latest` pointer, a file copied over) is
loaded again, and two spellings of one directory share an entry. What is derived from a model (its dictionaries) is
evicted with it, so no entry keeps an evicted model alive.

Checkpoint paths come only from `discover()`: `checkpoints/` beside the repository plus the
directories given on the command line (`panel serve apps/attention.py --args --checkpoints DIR...`).
The URL carries a checkpoint's *label*, which is looked up in that list, never a path.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..analysis.training_dynamics.confidence import Familiarity, familiarity
from ..checkpoint.format import LATEST, is_checkpoint, read_log, resolve_checkpoint
from ..checkpoint.shipped import CHECKPOINTS
from ..decoding.translator import TranslationModel, decode_config_from_meta

log = logging.getLogger(__name__)

DEFAULT_DIR = CHECKPOINTS  # the shipped checkpoints (workbench.checkpoint.shipped)
MAX_DEPTH = 3  # how deep below a listed directory checkpoints are looked for

def configure_torch_threads() -> int:
    """One intra-op thread per model call (WORKBENCH_TORCH_THREADS overrides) for the served app.

    Requests already run side by side in the request path's pools (requests.py); letting each also spread
    over every core made a 30-token translation with traces take 7.9 s instead of 0.39 s on a busy 2-core
    machine (measured, docs/app.md): the small per-step ops spend their time synchronising threads.
    """
    n = int(os.environ.get("WORKBENCH_TORCH_THREADS", "1"))
    torch.set_num_threads(n)
    return n


@dataclass(frozen=True)
class Entry:
    """One checkpoint the picker offers: a short unique label and its directory."""

    label: str
    path: Path


def parse_args(argv: Sequence[str]) -> list[Path]:
    """Checkpoint directories from the app's `--args` (unknown arguments are ignored, not fatal)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--checkpoints", nargs="*", default=[])
    args, _ = parser.parse_known_args(list(argv))
    return [Path(p) for p in args.checkpoints]


def discover(dirs: Sequence[str | Path] = (), *, default: Path | None = DEFAULT_DIR) -> tuple[list[Entry], list[str]]:
    """(entries, problems): every checkpoint under `default` and `dirs`; problems name missing directories.

    A listed directory may itself be a checkpoint, a run directory (with a `latest` pointer), or hold
    either up to MAX_DEPTH levels down. Run directories are listed once (their latest checkpoint) plus
    each step_* snapshot inside them, so early and final snapshots can be compared.
    """
    roots = ([default] if default is not None else []) + [Path(d) for d in dirs]
    found: list[Path] = []
    problems: list[str] = []
    for root in roots:
        if not root.is_dir():
            if root != default or dirs:  # a missing default is normal before the first checkpoint ships
                problems.append(f"checkpoint directory {root} does not exist")
            continue
        found.extend(_walk(root.resolve(), 0))
    unique = list(dict.fromkeys(found))
    return _label(unique), problems


def _walk(path: Path, depth: int) -> list[Path]:
    out = []
    if is_checkpoint(path) or (path / "config.json").is_file():
        # A directory with config.json but broken weights is still listed: loading it gives a clear message.
        out.append(path)
        if not (path / LATEST).is_file():
            return out
    if depth >= MAX_DEPTH:
        return out
    try:
        children = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return out
    for child in children:
        out.extend(_walk(child, depth + 1))
    return out


def _label(paths: list[Path]) -> list[Entry]:
    """Shortest unique trailing path parts as labels (`multi30k`, `run1/step_0001000`)."""
    entries = []
    for p in paths:
        parts = 1
        while parts < len(p.parts) and sum(q.parts[-parts:] == p.parts[-parts:] for q in paths) > 1:
            parts += 1
        entries.append(Entry("/".join(p.parts[-parts:]), p))
    return entries


def default_entry(entries: Sequence[Entry]) -> Entry | None:
    """The shipped default: a checkpoint named in `checkpoints/DEFAULT` if present, else the first listed."""
    marker = DEFAULT_DIR / "DEFAULT"
    if marker.is_file():
        wanted = marker.read_text(encoding="utf-8").strip()
        for e in entries:
            if e.label == wanted or e.path.name == wanted:
                return e
    return entries[0] if entries else None


LIMITS = {"model": 4, "log": 8, "features": 16, "contexts": 8, "evidence": 16, "confidence": 8, "replay": 16,
          "patching": 32, "graph": 4, "familiarity": 8}
"""Entries kept per kind: 4 models (the shipped ones are 20-90 MB each in memory), 8 training logs, 16 dictionaries
(a few MB each, with their corpus statistics), the Graph tab's corpus contexts of 8 models, the Evidence tab's
measured gold AER and head roles (two per model), the Internals tab's measured confidence on validation text (a
histogram's worth), Model analysis' beam-search replays (one sentence and beam each, stepped through), the Why tab's
patching answers (one sentence and changed source each: a map per output token, under a MB), and the Graph tab's
graphs with their trust checks (a graph holds its nodes² adjacency: up to 200 MB, so few). The last three were kept
per page before; here a second page asking the same question gets the answer at once. And the wrong-language
hint's yardstick of 8 checkpoints (`familiarity_of`)."""
DERIVED = ("features", "contexts", "evidence", "confidence", "replay", "patching", "graph", "familiarity")
"""The kinds computed from a loaded model: evicted with it."""


def files_stamp(directory: str | Path) -> tuple:
    """(name, size, mtime in ns) of every file directly in `directory`, sorted: what changes when a file is
    replaced. Empty when the directory cannot be read."""
    try:
        entries = sorted((e.name, e.stat()) for e in os.scandir(directory) if e.is_file())
    except OSError:
        return ()
    return tuple((name, st.st_size, st.st_mtime_ns) for name, st in entries)


def checkpoint_key(path: str | Path) -> tuple:
    """A checkpoint's cache key: its resolved directory (a run directory's `latest` followed) and its files' stamp."""
    try:
        directory = resolve_checkpoint(path).resolve()
    except Exception:  # not (or no longer) a checkpoint: keyed by the path itself; loading says what is wrong
        directory = Path(path).resolve()
    return str(directory), files_stamp(directory)


class CheckpointCache:
    """A bounded LRU cache of what is loaded from checkpoints, keyed by `checkpoint_key` (see the module docstring).

    `get(kind, path, load, *extra)` returns the entry of (kind, checkpoint_key(path), *extra), calling `load()` once
    when it is missing (other threads asking for the same entry meanwhile wait for that load, never load twice); the
    least recently used entry of a kind goes past `limits[kind]`. Evicting a model also evicts every entry of the same
    checkpoint key (what was derived from it)."""

    def __init__(self, limits: dict[str, int]):
        self.limits = dict(limits)
        self._entries: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()
        self._loading: dict[tuple, threading.Lock] = {}
        self.loads = 0  # how many times `load` ran (tests count reloads)

    def get(self, kind: str, path: str | Path, load: Callable[[], object], *extra: Hashable):
        if kind not in self.limits:
            raise ValueError(f"no cache limit for {kind!r}: {sorted(self.limits)}")
        key = (kind, checkpoint_key(path), *extra)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            gate = self._loading.setdefault(key, threading.Lock())
        with gate:  # one load per key; the others wait for it
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                    return self._entries[key]
            try:
                value = load()
                self.loads += 1
            finally:
                with self._lock:
                    self._loading.pop(key, None)
            with self._lock:
                self._entries[key] = value
                self._evict(kind)
        return value

    def peek(self, kind: str, path: str | Path, *extra: Hashable):
        """The entry of (kind, checkpoint_key(path), *extra) if it is cached (now the most recently used), else None:
        for answers a page computes on its own request path (`put` stores them), not through `get`'s `load`."""
        key = (kind, checkpoint_key(path), *extra)
        with self._lock:
            if key not in self._entries:
                return None
            self._entries.move_to_end(key)
            return self._entries[key]

    def put(self, kind: str, path: str | Path, value: object, *extra: Hashable) -> None:
        """Store `value` as the entry of (kind, checkpoint_key(path), *extra), evicting past `limits[kind]`."""
        if kind not in self.limits:
            raise ValueError(f"no cache limit for {kind!r}: {sorted(self.limits)}")
        key = (kind, checkpoint_key(path), *extra)
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            self._evict(kind)

    def _evict(self, kind: str) -> None:
        while (keys := [k for k in self._entries if k[0] == kind]) and len(keys) > self.limits[kind]:
            old = keys[0]  # the least recently used of its kind
            del self._entries[old]
            if kind == "model":  # what was derived from the model (its dictionaries, ...) goes with it
                for k in [k for k in self._entries if k[0] in DERIVED and k[1] == old[1]]:
                    del self._entries[k]

    def keys(self) -> list[tuple]:
        """The cached entries' keys, least recently used first."""
        with self._lock:
            return list(self._entries)

    def clear(self, *kinds: str) -> None:
        """Forget every entry, or only those of `kinds`."""
        with self._lock:
            for key in [k for k in self._entries if not kinds or k[0] in kinds]:
                del self._entries[key]


CACHE = CheckpointCache(LIMITS)


def load_model(path: str | Path) -> TranslationModel:
    """A checkpoint as a TranslationModel, once per process while it is cached (`CACHE`, by `checkpoint_key`)."""

    def load() -> TranslationModel:
        tm = TranslationModel.from_checkpoint(path)
        tm.model.requires_grad_(False)
        return tm

    return CACHE.get("model", path, load)


class _Measuring:
    """A yardstick being measured: set when done, and who to tell then (`on_familiarity`)."""

    def __init__(self):
        self.done = threading.Event()
        self.then: list[Callable[[], None]] = []


_MEASURING: dict[str, _Measuring] = {}  # path -> its yardstick's measurement under way (gone when it ends)
_MEASURING_LOCK = threading.Lock()


def _measured(path: str) -> Familiarity | None:
    """The checkpoint's yardstick if it was measured (`CACHE`, kind "familiarity"; a failure is kept there too)."""
    value = CACHE.peek("familiarity", path)
    return value if isinstance(value, Familiarity) else None


def familiarity_of(path: str, tm: TranslationModel) -> Familiarity | None:
    """The checkpoint's `Familiarity` (the yardstick of the wrong-language hint) once measured, else None.

    The first call starts measuring it on a background thread (about 40 greedy translations of its validation
    text: 0.4 s for the shipped Multi30k model, 2.6 s for general-en-de on one core; and the character profiles of
    its two languages from that text, 0.3 s) and returns None, so no answer waits for it; the page adds the first
    answer's hint when it arrives (`on_familiarity`, `work.pending_hints`). The measured value (or the error of a
    checkpoint without local validation text, kept, not retried) lives in the one cache (`CACHE`) with the
    checkpoint's other derived entries."""
    with _MEASURING_LOCK:
        if CACHE.peek("familiarity", path) is not None:
            return _measured(path)
        if path in _MEASURING:
            return None
        _MEASURING[path] = measuring = _Measuring()

    def measure() -> None:
        try:
            value: Familiarity | Exception = familiarity(tm)
        except Exception as exc:  # no validation text here, or too few sentences: no hint, said in the log
            value = exc
        with _MEASURING_LOCK:
            CACHE.put("familiarity", path, value)
            _MEASURING.pop(path, None)
            then, measuring.then = measuring.then, []
        measuring.done.set()
        for fn in then:
            _tell(fn)

    threading.Thread(target=measure, name="familiarity", daemon=True).start()
    return None


def _tell(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # e.g. the page's event loop closed meanwhile: nobody left to tell
        log.warning("after measuring a yardstick: %s: %s", type(exc).__name__, exc)


def measuring_familiarity(path: str) -> bool:
    """Whether the checkpoint's yardstick is being measured now (an answer made now goes without its hint)."""
    with _MEASURING_LOCK:
        return path in _MEASURING


def on_familiarity(path: str, tm: TranslationModel, then: Callable[[], None]) -> None:
    """Call `then()` once the checkpoint's yardstick is measured (or has failed): at once if it is, else from the
    measuring thread when it is (measuring starts if it had not). Nothing waits meanwhile: no thread of a pool is
    held while many pages open on a checkpoint not measured yet."""
    familiarity_of(path, tm)
    with _MEASURING_LOCK:
        measuring = _MEASURING.get(path)
        if measuring is not None:
            measuring.then.append(then)
            return
    _tell(then)


def wait_familiarity(path: str, tm: TranslationModel, timeout: float) -> Familiarity | None:
    """`familiarity_of`, waiting up to `timeout` seconds for the measurement under way (started here if none is)."""
    if (value := familiarity_of(path, tm)) is not None:
        return value
    with _MEASURING_LOCK:
        measuring = _MEASURING.get(path)
    if measuring is not None:
        measuring.done.wait(timeout)
    return _measured(path)


def load_train_log(path: str | Path) -> list[dict]:
    """The checkpoint's training log (train_log.jsonl), without loading its weights again (`CACHE`)."""
    return CACHE.get("log", path, lambda: read_log(resolve_checkpoint(path) / "train_log.jsonl"))


def load_derived(kind: str, tm: TranslationModel, load: Callable[[], object], *extra: Hashable):
    """What `load()` computes from model `tm` (a `DERIVED` kind), cached with the model's checkpoint (`CACHE`,
    evicted with the model). A model that names no checkpoint directory (built in memory) has nothing to key it by:
    computed each time."""
    path = tm.meta.get("path")
    if not path:
        return load()
    return CACHE.get(kind, path, load, *extra)


def load_features(tm: TranslationModel, directory: str | Path, load: Callable[[], object]):
    """A dictionary of model `tm` (its `FeatureData`, built by `load()`), cached with the model's checkpoint and
    keyed by the dictionary directory's own files too (`load_derived`)."""
    return load_derived("features", tm, load, str(Path(directory).resolve()), files_stamp(directory))


def read_meta(path: str | Path) -> dict:
    """A checkpoint's meta.json without loading its weights ({} when missing or unreadable). Read when needed
    (a checkpoint switch, the Compare tab's default), never per keystroke."""
    try:
        meta = json.loads((Path(path) / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def default_alpha(path: str | Path) -> float:
    """The checkpoint's own length-penalty exponent (meta["generation"], read as loading the model reads it);
    1.0 when it names none or the entry is malformed (loading the model reports that)."""
    try:
        value = decode_config_from_meta(read_meta(path).get("generation") or {}).alpha
    except (TypeError, ValueError, AttributeError):
        return 1.0
    return 1.0 if math.isnan(value) else float(value)


def partner(entries: Sequence[Entry], label: str) -> tuple[Entry | None, str]:
    """(the checkpoint to compare `label` with, why it was chosen): same source and target languages, and
    among those another snapshot of the same training run (the earliest) when there is one; (None, why not)."""
    metas = {e.label: read_meta(e.path) for e in entries}
    if label not in metas:
        return None, f"{label!r} is not a listed checkpoint"
    others = [e for e in entries if e.label != label]
    langs = lambda m: (m.get("src_lang"), m.get("tgt_lang"))
    run = lambda m: (m.get("train_config") or {}).get("out_dir")
    mine = metas[label]
    if None in langs(mine):
        if others:
            return others[0], "its meta.json names no languages, so B is simply the next listed checkpoint"
        return None, "no other checkpoint is listed"
    pair = "→".join(langs(mine))
    fits = [e for e in others if langs(metas[e.label]) == langs(mine)]
    if not fits:
        return None, f"no other listed checkpoint translates {pair}"
    same_run = [e for e in fits if run(mine) and run(metas[e.label]) == run(mine)]
    if same_run:
        best = min(same_run, key=lambda e: _step(metas[e.label]))
        return best, f"another snapshot (step {metas[best.label].get('step', '?')}) of the same run, {pair}"
    return fits[0], f"the first other checkpoint that translates {pair}"


def _step(meta: dict) -> float:
    step = meta.get("step")
    return float(step) if isinstance(step, (int, float)) else math.inf

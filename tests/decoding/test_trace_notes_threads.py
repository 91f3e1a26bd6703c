"""`TranslationModel.trace` notes only its own call's warnings, even while other threads warn (a server)."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import pytest

from workbench.decoding.translator import load

CKPT = Path(__file__).resolve().parents[2] / "checkpoints" / "multi30k-de-en"


@pytest.fixture(scope="module")
def tm():
    return load(CKPT)


def test_trace_notes_hold_only_this_calls_warnings_while_another_thread_warns(tm):
    stop = threading.Event()

    def noisy() -> None:
        while not stop.is_set():
            warnings.warn("another thread's deprecation", DeprecationWarning, stacklevel=1)

    other = threading.Thread(target=noisy, daemon=True)
    other.start()
    try:
        long_text = " ".join(["Hund"] * (tm.model.cfg.max_positions + 5))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results = [tm.trace(long_text, max_len=4) for _ in range(5)]
            short = [tm.trace("Ein Hund.", max_len=4) for _ in range(5)]
    finally:
        stop.set()
        other.join()
    for r in results:
        assert len(r.notes) == 1 and "truncated" in r.notes[0], r.notes
    assert all(r.notes == [] for r in short)


def test_trace_still_warns_its_caller_about_a_cut_source(tm):
    long_text = " ".join(["Hund"] * (tm.model.cfg.max_positions + 5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = tm.trace(long_text, max_len=4)
    assert r.truncated and any("truncated" in str(w.message) for w in caught)

"""The app's one cache of what is loaded from checkpoints (`loader.CACHE`, issue 37 point 6): least recently used out
at the stated bound per kind, keyed by the checkpoint's resolved directory and its files' sizes and times (another
spelling of the same directory is the same entry, a replaced file is a new one), a model's dictionaries evicted with
it, one load per key under concurrent asks."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint  # noqa: E402

from workbench.checkpoint.format import write_pointer  # noqa: E402
from workbench.ui import features_view, loader  # noqa: E402
from workbench.ui.loader import CheckpointCache, checkpoint_key  # noqa: E402


def _checkpoint_dir(path: Path) -> Path:
    """A directory that reads as a checkpoint (config.json), with one weights file."""
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}", encoding="utf-8")
    (path / "model.safetensors").write_bytes(b"0" * 16)
    return path


def test_least_recently_used_goes_at_the_bound(tmp_path):
    cache = CheckpointCache({"model": 2, "features": 4})
    a, b, c = (_checkpoint_dir(tmp_path / name) for name in "abc")
    got = {p: cache.get("model", p, object) for p in (a, b)}
    assert cache.get("model", a, object) is got[a]  # a used again: b is now the least recent
    cache.get("model", c, object)
    kept = {k[1][0] for k in cache.keys() if k[0] == "model"}
    assert kept == {str(a.resolve()), str(c.resolve())}
    assert cache.get("model", b, object) is not got[b]  # loaded again
    assert cache.loads == 4
    with pytest.raises(ValueError, match="no cache limit"):
        cache.get("tokenizer", a, object)


def test_a_models_dictionaries_are_evicted_with_it(tmp_path):
    cache = CheckpointCache({"model": 1, "features": 4})
    a, b = _checkpoint_dir(tmp_path / "a"), _checkpoint_dir(tmp_path / "b")
    cache.get("model", a, object)
    cache.get("features", a, object, "hook_memory")
    cache.get("features", b, object, "hook_memory")  # another checkpoint's: stays
    cache.get("model", b, object)  # a's model goes, and its dictionary with it
    assert sorted((k[0], Path(k[1][0]).name) for k in cache.keys()) == [("features", "b"), ("model", "b")]


def test_keyed_by_the_resolved_directory_and_its_files(tmp_path):
    cache = CheckpointCache({"model": 4})
    run = tmp_path / "run"
    step = _checkpoint_dir(run / "step_0000100")
    write_pointer(run, loader.LATEST, step.name)
    (tmp_path / "alias").symlink_to(step)
    first = cache.get("model", step, object)
    # the run directory's latest pointer, a symlink and a path with '..' name the same checkpoint
    for spelling in (run, tmp_path / "alias", run / "step_0000100" / ".." / "step_0000100"):
        assert checkpoint_key(spelling) == checkpoint_key(step)
        assert cache.get("model", spelling, object) is first
    assert cache.loads == 1
    # a file replaced (new contents, new time): loaded again
    stat = (step / "model.safetensors").stat()
    (step / "model.safetensors").write_bytes(b"1" * 16)
    os.utime(step / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert cache.get("model", step, object) is not first
    # a new snapshot behind the run's latest pointer: the run directory now names another checkpoint
    newer = _checkpoint_dir(run / "step_0000200")
    write_pointer(run, loader.LATEST, newer.name)
    assert checkpoint_key(run) == checkpoint_key(newer) != checkpoint_key(step)


def test_one_load_per_key_when_asked_at_once(tmp_path):
    cache = CheckpointCache({"model": 2})
    a = _checkpoint_dir(tmp_path / "a")

    def slow():
        time.sleep(0.2)
        return object()

    out: list = []
    threads = [threading.Thread(target=lambda: out.append(cache.get("model", a, slow))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.loads == 1 and len({id(o) for o in out}) == 1


def test_load_model_and_feature_data_use_the_one_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "CACHE", CheckpointCache(loader.LIMITS))
    build_checkpoint(tmp_path / "alpha", seed=0, steps=0)
    tm = loader.load_model(str(tmp_path / "alpha"))
    assert loader.load_model(tmp_path / "alpha" / ".." / "alpha") is tm
    assert [k[0] for k in loader.CACHE.keys()] == ["model"]
    loaded = []
    monkeypatch.setattr(features_view.FeatureData, "load", classmethod(lambda cls, m, d: loaded.append(d) or d))
    directory = tmp_path / "alpha" / "features" / "hook_memory"
    directory.mkdir(parents=True)
    assert features_view.feature_data(tm, directory) == directory
    features_view.feature_data(tm, directory)
    assert loaded == [directory]  # once per (checkpoint, dictionary)
    in_memory = SimpleNamespace(meta={})  # a model built in memory names no checkpoint: nothing to key it by
    features_view.feature_data(in_memory, directory)
    assert len(loaded) == 2 and len(loader.CACHE.keys()) == 2
    # a copy of the checkpoint elsewhere is another entry
    shutil.copytree(tmp_path / "alpha", tmp_path / "beta")
    assert loader.load_model(tmp_path / "beta") is not tm


def test_what_is_derived_from_a_model_goes_with_it(tmp_path, monkeypatch):
    """The Graph tab's corpus contexts (`graph_view.model_contexts`) are cached per checkpoint with the model and
    evicted with it, never keyed by the model object (which kept evicted models alive)."""
    from workbench.ui import graph_view

    monkeypatch.setattr(loader, "CACHE", CheckpointCache({**loader.LIMITS, "model": 1}))
    build_checkpoint(tmp_path / "alpha", seed=0, steps=0)
    tm = loader.load_model(tmp_path / "alpha")
    measured = []
    monkeypatch.setattr(graph_view, "_corpus", lambda *_: (["Ein Hund."], ["A dog."], "one sentence"))
    monkeypatch.setattr(graph_view, "component_contexts", lambda m, s, r, check=None: measured.append(m) or {})
    assert graph_view.model_contexts(tm) == ({}, "one sentence")
    assert graph_view.model_contexts(tm) == ({}, "one sentence") and measured == [tm]  # once per checkpoint
    assert sorted(k[0] for k in loader.CACHE.keys()) == ["contexts", "model"]
    _checkpoint_dir(tmp_path / "beta")
    loader.CACHE.get("model", tmp_path / "beta", object)  # alpha's model goes, and its contexts with it
    assert [k[0] for k in loader.CACHE.keys()] == ["model"]


def test_the_evidence_tabs_measurements_are_cached_with_the_model(tmp_path, monkeypatch):
    """The Evidence tab's gold AER is measured once per checkpoint and leaves with the model (it was an
    `lru_cache` keyed by the model object, which kept up to 8 evicted models alive)."""
    from workbench.ui import evidence_view

    monkeypatch.setattr(loader, "CACHE", CheckpointCache({**loader.LIMITS, "model": 1}))
    build_checkpoint(tmp_path / "alpha", seed=0, steps=0)
    tm = loader.load_model(tmp_path / "alpha")
    measured = []
    monkeypatch.setattr(evidence_view, "_gold", lambda *_: ("gold",))
    monkeypatch.setattr(evidence_view, "gold_aer", lambda m, *gold, shift: measured.append(m) or "scores")
    assert evidence_view._alignment_scores(tm) == evidence_view._alignment_scores(tm) == "scores"
    assert measured == [tm]  # once per checkpoint
    _checkpoint_dir(tmp_path / "beta")
    loader.CACHE.get("model", tmp_path / "beta", object)
    assert [k[0] for k in loader.CACHE.keys()] == ["model"]

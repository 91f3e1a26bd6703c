import json
import os

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.checkpoint.format import (
    CheckpointError,
    clean_stale,
    is_checkpoint,
    load_checkpoint,
    read_pointer,
    save_checkpoint,
    write_pointer,
)
from workbench.checkpoint.tokenizer import SentencePieceTokenizer


@pytest.fixture(scope="module")
def tok():
    return SentencePieceTokenizer.train(sentences=["ein kleiner Test", "a small test"] * 10, vocab_size=60,
                                        byte_fallback=False)


@pytest.mark.parametrize("tie", ["none", "decoder", "all"])
def test_round_trip_gives_identical_logits(tmp_path, tie, tok):
    cfg = presets.tiny(vocab=60, tie_embeddings=tie)
    model = make_model(cfg, seed=3)
    path = save_checkpoint(tmp_path / "ck", model, src_tokenizer=tok, tgt_tokenizer=tok,
                           meta={"src_lang": "de", "tgt_lang": "en"}, train_log=[{"step": 1, "loss": 2.5}])
    assert is_checkpoint(path)
    ck = load_checkpoint(path)
    src, tgt = make_batch(cfg)
    assert torch.equal(ck.model(src, tgt), model(src, tgt))
    assert ck.config == cfg and not ck.model.training
    assert ck.meta["src_lang"] == "de" and ck.meta["format_version"] == 1
    assert ck.train_log == [{"step": 1, "loss": 2.5}]
    assert ck.src_tokenizer is ck.tgt_tokenizer and ck.src_tokenizer.encode("test") == tok.encode("test")
    stored = json.loads((path / "meta.json").read_text())["files"]
    n_tied = {"none": 0, "decoder": 1, "all": 2}[tie]
    assert len(set(model.state_dict())) - n_tied == _n_tensors(path / "model.safetensors")
    assert "model.safetensors" in stored
    if tie != "none":
        assert ck.model.output_proj.weight is ck.model.tgt_embed.weight


def _n_tensors(file):
    from safetensors import safe_open

    with safe_open(str(file), "pt") as f:
        return len(list(f.keys()))


def test_half_precision_storage_loads_as_float32(tmp_path):
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    save_checkpoint(tmp_path / "ck", model, dtype=torch.bfloat16)
    ck = load_checkpoint(tmp_path / "ck")
    w = ck.model.enc[0].ffn.up_proj.weight
    assert w.dtype == torch.float32
    assert torch.equal(w, model.enc[0].ffn.up_proj.weight.to(torch.bfloat16).float())


def test_train_state_round_trip(tmp_path):
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    opt = torch.optim.Adam(model.parameters())
    src, tgt = make_batch(cfg)
    model(src, tgt).sum().backward()
    opt.step()
    state = {"optimizer": opt.state_dict(), "step": 7, "rng": torch.get_rng_state(), "pos": (1, [2, 3])}
    save_checkpoint(tmp_path / "ck", model, train_state=state)
    back = load_checkpoint(tmp_path / "ck", with_train_state=True).train_state
    assert back["step"] == 7 and back["pos"] == (1, [2, 3])
    assert torch.equal(back["rng"], state["rng"])
    opt2 = torch.optim.Adam(make_model(cfg).parameters())
    opt2.load_state_dict(back["optimizer"])
    for k, v in opt.state_dict()["state"][0].items():
        assert torch.equal(opt2.state_dict()["state"][0][k], v)
    assert load_checkpoint(tmp_path / "ck").train_state is None


def test_truncated_weights_are_detected(tmp_path):
    path = save_checkpoint(tmp_path / "ck", make_model(presets.tiny(vocab=50)))
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors has .* bytes .* truncated"):
        load_checkpoint(path)
    # without the size record the safetensors reader itself must refuse it
    meta = json.loads((path / "meta.json").read_text())
    del meta["files"]
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="model.safetensors is not a readable safetensors"):
        load_checkpoint(path)


def test_pickle_and_mismatched_shapes_are_refused(tmp_path):
    model = make_model(presets.tiny(vocab=50))
    path = save_checkpoint(tmp_path / "ck", model)
    (path / "meta.json").unlink()
    torch.save(model.state_dict(), path / "model.safetensors")  # a pickle under the right name
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_checkpoint(path)
    path = save_checkpoint(tmp_path / "ck2", model)
    cfg_file = path / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["d_ff"] = 128
    cfg_file.write_text(json.dumps(cfg))
    (path / "meta.json").unlink()
    shape_msg = r"'enc.0.ffn.up_proj.weight' has shape \(64, 32\), the config needs \(128, 32\)"
    with pytest.raises(CheckpointError, match=shape_msg):
        load_checkpoint(path)
    cfg["bogus"] = 1
    cfg_file.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="config.json.*bogus"):
        load_checkpoint(path)


def test_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_checkpoint(tmp_path / "ck", make_model(presets.tiny(vocab=50)))
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["dec.1.cross_attn.k_proj.bias"]
    save_file(tensors, str(path / "model.safetensors"))
    (path / "meta.json").unlink()
    with pytest.raises(CheckpointError, match="dec.1.cross_attn.k_proj.bias"):
        load_checkpoint(path)


def test_overwrite_is_atomic_and_leaves_no_temporaries(tmp_path, monkeypatch):
    cfg = presets.tiny(vocab=50)
    first = make_model(cfg, seed=1)
    save_checkpoint(tmp_path / "ck", first)
    # a failure mid-write (here: an unstorable train_state) keeps the previous checkpoint intact
    with pytest.raises(TypeError, match="cannot store"):
        save_checkpoint(tmp_path / "ck", make_model(cfg, seed=2), train_state={"x": object()})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    src, tgt = make_batch(cfg)
    assert torch.equal(load_checkpoint(tmp_path / "ck").model(src, tgt), first(src, tgt))
    second = make_model(cfg, seed=2)
    save_checkpoint(tmp_path / "ck", second)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    assert torch.equal(load_checkpoint(tmp_path / "ck").model(src, tgt), second(src, tgt))


def test_run_directory_pointer(tmp_path):
    model = make_model(presets.tiny(vocab=50))
    save_checkpoint(tmp_path / "step_0000010", model)
    assert not is_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no config.json and no 'latest' pointer"):
        load_checkpoint(tmp_path)
    write_pointer(tmp_path, "latest", "step_0000010")
    assert read_pointer(tmp_path) == tmp_path / "step_0000010"
    assert is_checkpoint(tmp_path)
    assert load_checkpoint(tmp_path).path == tmp_path / "step_0000010"


class Killed(BaseException):
    """Stands for SIGKILL: raised from a rename, it skips the rest of the save (no except/finally of ours)."""


class KillAt:
    """Counts os.rename/os.replace calls together and raises `Killed` at call number `n` (from 0)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def wrap(self, real):
        def wrapper(*args, **kw):
            if self.calls == self.n:
                raise Killed
            self.calls += 1
            return real(*args, **kw)
        return wrapper


def test_replacing_what_latest_and_best_name_leaves_them_complete_after_a_kill_at_any_rename(tmp_path, monkeypatch):
    cfg = presets.tiny(vocab=50)
    old, new = make_model(cfg, seed=1), make_model(cfg, seed=2)
    src, tgt = make_batch(cfg)
    outputs = {"old": old(src, tgt), "new": new(src, tgt)}
    real_rename, real_replace = os.rename, os.replace
    for kill_at in range(20):
        run = tmp_path / f"run{kill_at}"
        save_checkpoint(run / "step_0000001", old)
        write_pointer(run, "latest", "step_0000001")
        write_pointer(run, "best", "step_0000001")
        kill = KillAt(kill_at)
        monkeypatch.setattr(os, "rename", kill.wrap(real_rename))
        monkeypatch.setattr(os, "replace", kill.wrap(real_replace))
        try:
            save_checkpoint(run / "step_0000001", new)
            finished = True
        except Killed:
            finished = False
        monkeypatch.undo()
        for when in ("after the kill", "after clean_stale"):
            for name in ("latest", "best"):
                out = load_checkpoint(read_pointer(run, name)).model(src, tgt)
                assert any(torch.equal(out, o) for o in outputs.values()), (kill_at, when, name)
            clean_stale(run)
        assert sorted(p.name for p in run.iterdir()) == ["best", "latest", "step_0000001"], kill_at
        if finished:
            assert torch.equal(load_checkpoint(run).model(src, tgt), outputs["new"])
            break
    assert kill_at >= 3, "replacing takes several renames; each was a kill point"


def test_clean_stale_restores_a_checkpoint_an_older_version_left_moved_aside(tmp_path):
    """Older versions renamed step_N to .step_N.old-*/step_N before renaming the new one in."""
    model = make_model(presets.tiny(vocab=50))
    save_checkpoint(tmp_path / ".step_0000004.old-abc" / "step_0000004", model)
    save_checkpoint(tmp_path / ".step_0000004.tmp-def", model)
    (tmp_path / ".latest.tmp-ghi").write_text("step_0000002\n")
    write_pointer(tmp_path, "latest", "step_0000004")
    with pytest.raises(CheckpointError, match="points at step_0000004, which does not exist"):
        load_checkpoint(tmp_path)
    removed = clean_stale(tmp_path)
    assert sorted(removed) == [".latest.tmp-ghi", ".step_0000004.old-abc", ".step_0000004.tmp-def"]
    assert load_checkpoint(tmp_path).path == tmp_path / "step_0000004"

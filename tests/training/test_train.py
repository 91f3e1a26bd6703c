"""The trainer: the copy task learns; interrupted/resumed runs equal uninterrupted ones; bad runs stop clearly."""

import dataclasses
import json
import math

import pytest
import torch

from workbench.checkpoint.format import load_checkpoint, read_pointer
from workbench.cli import main as cli_main
from workbench.core.config import override
from workbench.training import Trainer, TrainingDiverged
from workbench.training.config import TrainConfig


def copy_cfg(tmp_path, **changes) -> TrainConfig:
    cfg = TrainConfig(
        dataset="copy", preset="tiny", copy_vocab=11, copy_len=8, copy_pairs=600, max_tokens=270,
        schedule="inverse_sqrt", lr=3e-3, warmup=30, label_smoothing=0.0, max_steps=8, log_every=1, eval_every=0,
        bleu=False,
        best_metric="valid_loss", out_dir=str(tmp_path / "run"), model={"dropout": 0.1}, device="cpu",
    )
    return dataclasses.replace(cfg, **changes)


def test_copy_task_learns(tmp_path):
    cfg = copy_cfg(tmp_path, copy_pairs=2000, max_tokens=450, max_steps=250, log_every=50, eval_every=250,
                   lr=5e-3, warmup=40, model={"dropout": 0.0})
    trainer = Trainer(cfg, progress="none").fit()
    valid = [r for r in trainer.log if r["kind"] == "valid"][-1]
    assert valid["valid_nll"] < 0.3, valid
    # the second path: greedy decoding actually copies the (held-out) sequences
    sources = trainer.valid_data.src[:32]
    outputs = trainer.translate_ids(sources)
    exact = sum(out[:-1] == src for out, src in zip(outputs, sources)) / len(sources)
    assert exact > 0.8
    train = [r for r in trainer.log if r["kind"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"] / 3


def _params(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_interrupted_and_resumed_run_equals_uninterrupted(tmp_path):
    ref = Trainer(copy_cfg(tmp_path, out_dir=str(tmp_path / "ref")), progress="none").fit()

    class StopAt:
        """A progress view that raises KeyboardInterrupt once, like Ctrl-C in a notebook."""

        def __init__(self, at):
            self.at = at

        def __getattr__(self, name):
            return lambda *a, **k: None

        def step(self, step, record):
            if step == self.at:
                self.at = None
                raise KeyboardInterrupt

    cut = Trainer(copy_cfg(tmp_path, out_dir=str(tmp_path / "cut")), progress="none")
    cut.progress = StopAt(3)
    cut.fit()
    assert cut.interrupted and cut.step == 3
    assert read_pointer(tmp_path / "cut").name == "step_0000003"
    # a new process: resume from the directory, continue to the same end
    again = Trainer(copy_cfg(tmp_path, out_dir=str(tmp_path / "cut")), progress="none")
    assert again.step == 3
    again.fit()
    losses = lambda t: [r["loss"] for r in t.log if r["kind"] == "train"]
    assert losses(again)[3:] == losses(ref)[3:]  # next-step losses identical, not just close
    for (k, a), b in zip(_params(again.model).items(), _params(ref.model).values()):
        assert torch.equal(a, b), k
    # the same object continues too (notebook: Ctrl-C, then .fit() again)
    cut.fit()
    assert losses(cut)[3:] == losses(ref)[3:]


def test_checkpoint_carries_log_config_and_opens(tmp_path):
    cfg = copy_cfg(tmp_path, max_steps=6, eval_every=3, keep_last=1)
    trainer = Trainer(cfg, progress="none").fit()
    ck = load_checkpoint(tmp_path / "run")
    assert ck.path.name == "step_0000006"
    kinds = [r["kind"] for r in ck.train_log]
    assert kinds.count("train") == 6 and kinds.count("valid") == 2
    lrs = [r["lr"] for r in ck.train_log if r["kind"] == "train"]
    assert lrs == [trainer.schedule(s) for s in range(1, 7)]  # the real LR curve
    assert ck.meta["train_config"]["max_steps"] == 6
    src = torch.tensor([[5, 6, 7, 2]])
    assert torch.equal(ck.model(src, src), trainer.model.eval()(src, src))
    names = sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("step_"))
    best = read_pointer(tmp_path / "run", "best").name
    assert set(names) == {"step_0000006", best}  # keep_last=1 plus the best


def test_nan_stops_with_clear_message_and_keeps_last_good(tmp_path):
    trainer = Trainer(copy_cfg(tmp_path, save_every=2), progress="none")
    trainer.fit(steps=2)
    with torch.no_grad():
        trainer.model.enc[0].ffn.up_proj.weight[0, 0] = float("nan")
    with pytest.raises(TrainingDiverged, match=r"at step 3 is not finite.*Last good checkpoint: .*step_0000002"):
        trainer.fit(steps=2)
    ck = load_checkpoint(tmp_path / "run")
    assert ck.path.name == "step_0000002"
    assert all(torch.isfinite(p).all() for p in ck.model.parameters())


def test_config_errors_come_before_any_data_is_read(tmp_path):
    missing = [str(tmp_path / "nope.de"), str(tmp_path / "nope.en")]
    cfg = TrainConfig(dataset="files", train_files=missing, max_steps=1, model={"n_heads": 7})
    with pytest.raises(ValueError, match=r"d_model \(256\) must be divisible by n_heads \(7\)"):
        Trainer(cfg, progress="none")
    with pytest.raises(ValueError, match="unknown preset"):
        Trainer(dataclasses.replace(cfg, preset="huge", model={}), progress="none")
    with pytest.raises(ValueError, match="never end"):
        TrainConfig(max_steps=0)
    with pytest.raises(ValueError, match="unknown key 'lrate'"):
        override(TrainConfig(max_steps=1), ["--lrate=1"], prefix="train")
    with pytest.raises(FileNotFoundError, match="nope.de"):  # only a valid config gets as far as the files
        Trainer(dataclasses.replace(cfg, model={}), progress="none")


def test_cli_train_with_overrides_and_average(tmp_path, capsys):
    cfg_file = tmp_path / "copy.json"
    cfg = copy_cfg(tmp_path, max_steps=4, eval_every=2, keep_last=5)
    cfg_file.write_text(json.dumps({k: v for k, v in cfg.to_dict().items() if k != "model"} | {"model": {}}))
    rc = cli_main(["train", str(cfg_file), "--max_steps=6", "--model.dropout=0.0", "--train.log_every=2"])
    assert rc == 0
    ck = load_checkpoint(tmp_path / "run")
    assert ck.path.name == "step_0000006" and ck.config.dropout == 0.0
    assert ck.meta["train_config"]["log_every"] == 2
    out = capsys.readouterr().out
    assert "6/6" in out and "validation @ step 6" in out
    rc = cli_main(["average", str(tmp_path / "run"), "--last", "2", "--out", str(tmp_path / "avg")])
    assert rc == 0
    avg = load_checkpoint(tmp_path / "avg").model.state_dict()
    a = load_checkpoint(tmp_path / "run" / "step_0000004").model.state_dict()
    b = load_checkpoint(tmp_path / "run" / "step_0000006").model.state_dict()
    for k in avg:
        assert torch.allclose(avg[k], (a[k] + b[k]) / 2, atol=1e-7), k
    assert cli_main(["train", str(cfg_file), "--max_steps=0"]) == 2  # config error: one line, exit 2
    assert "never end" in capsys.readouterr().err


def test_lr_schedule_used_matches_formula(tmp_path):
    cfg = copy_cfg(tmp_path, schedule="noam", noam_factor=2.0, warmup=4, max_steps=6, eval_every=6)
    trainer = Trainer(cfg, progress="none").fit()
    lrs = [r["lr"] for r in trainer.log if r["kind"] == "train"]
    expected = [2.0 * 32**-0.5 * min(s**-0.5, s * 4**-1.5) for s in range(1, 7)]
    assert all(math.isclose(a, b) for a, b in zip(lrs, expected))


def test_warmup_cosine_over_a_time_budget_ends_at_min_lr_when_the_minutes_do(tmp_path):
    # max_steps = 0: the cosine follows the fraction of max_minutes spent, so the run stops near min_lr
    cfg = copy_cfg(tmp_path, schedule="warmup_cosine", lr=3e-3, warmup=5, max_steps=0, max_minutes=0.05,
                   min_lr=1e-5, log_every=1)
    trainer = Trainer(cfg, progress="none").fit()
    lrs = [r["lr"] for r in trainer.log if r["kind"] == "train"]
    assert trainer.step > 10 and trainer.train_seconds >= 3.0
    assert max(lrs) > 2e-3  # warmed up to about the peak
    assert lrs[-1] < 0.1 * max(lrs)  # and decayed by the time the budget ran out
    peak_at = lrs.index(max(lrs))
    assert all(a >= b for a, b in zip(lrs[peak_at:], lrs[peak_at + 1 :]))  # monotone after the peak
    with pytest.raises(ValueError, match="time budget"):
        TrainConfig(schedule="warmup_cosine", max_steps=0, max_epochs=3, warmup=10)


def test_target_bleu_stops_at_the_first_validation_that_reaches_it_and_a_resume_trains_no_further(tmp_path,
                                                                                                monkeypatch):
    scores = iter([10.0, 39.9, 40.0, 45.0, 50.0])  # the validations' greedy BLEU, in order (the copy task has none)
    scored = Trainer.evaluate
    monkeypatch.setattr(Trainer, "evaluate", lambda self: {**scored(self), "valid_bleu": next(scores)})
    cfg = copy_cfg(tmp_path, bleu=True, target_bleu=40.0, best_metric="bleu", max_steps=20, eval_every=2)
    trainer = Trainer(cfg, progress="none").fit()
    assert trainer.step == 6  # the third validation reached it: no step after it
    assert trainer.reached_target()["step"] == 6
    assert read_pointer(tmp_path / "run").name == "step_0000006"
    again = Trainer(cfg, progress="none").fit()  # the same command again: resumed, and stopped at once
    assert again.step == 6 and [r["step"] for r in again.log if r["kind"] == "valid"] == [2, 4, 6]
    # without a target the same scores run to max_steps
    scores = iter([10.0, 39.9, 40.0, 45.0, 50.0] * 2)
    plain = Trainer(copy_cfg(tmp_path, bleu=True, best_metric="bleu", max_steps=10, eval_every=2,
                             out_dir=str(tmp_path / "plain")), progress="none").fit()
    assert plain.step == 10 and plain.reached_target() is None
    with pytest.raises(ValueError, match="needs bleu"):
        copy_cfg(tmp_path, target_bleu=40.0)

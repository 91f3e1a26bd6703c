"""A diverging or killed run never leaves a bad or missing checkpoint behind, and the same command resumes.

Divergence: every save checks the losses since the last save and the weights, so no checkpoint
with a NaN/inf is ever written and `latest` (the one the error names) is always good. Kills: real
SIGKILLs of a `workbench train` subprocess, at each rename/replace of its checkpoint writes and at
random moments; afterwards `latest` and `best` resolve to complete, finite checkpoints, and the
same command finishes the run with exactly the weights of an uninterrupted one.
"""

import json
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from workbench.checkpoint.format import load_checkpoint, read_pointer, save_checkpoint, write_pointer
from workbench.cli import main as cli_main
from workbench.training import Trainer, TrainingDiverged, run_dir
from workbench.training.config import TrainConfig


def copy_cfg(out_dir, **changes) -> dict:
    cfg = dict(
        dataset="copy", preset="tiny", copy_vocab=11, copy_len=8, copy_pairs=600, max_tokens=270,
        schedule="inverse_sqrt", lr=3e-3, warmup=30, label_smoothing=0.0, max_steps=8, log_every=1, eval_every=0,
        bleu=False, best_metric="valid_loss", out_dir=str(out_dir), device="cpu", threads=1, model={"dropout": 0.1},
    )
    return cfg | changes


def write_cfg(path, **cfg) -> str:
    path.write_text(json.dumps(cfg))
    return str(path)


def finite(ckpt) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in ckpt.model.state_dict().values())


def step_dirs(run):
    return sorted(p for p in run.iterdir() if p.name.startswith("step_"))


# A poisoned batch, not a huge learning rate: whether a large lr overflows to inf/NaN, and when, depends on the
# CPU's arithmetic (an AVX2-only machine grew the loss to 6.5e5 and never to NaN). From step POISONED_FROM on,
# every training loss is multiplied by NaN, so its gradients, the gradient norm and then the weights are NaN on
# any machine, and the run must stop at its next save without writing it.
POISONED_FROM = 5
DIVERGING = dict(max_steps=20, log_every=10, keep_last=2)


@pytest.fixture
def poisoned_batches(monkeypatch):
    """Training losses from step POISONED_FROM on are NaN (validation losses are left alone)."""
    import workbench.training.trainer as trainer_module

    reached = {"step": 0}
    train_step, loss_fn = Trainer._train_step, trainer_module.teacher_forced_loss

    def counting_step(self, group, acc):
        reached["step"] = self.step + 1  # the step this call computes
        return train_step(self, group, acc)

    def poisoned_loss(*args, **kwargs):
        loss, nll, n = loss_fn(*args, **kwargs)
        return (loss * float("nan"), nll, n) if reached["step"] >= POISONED_FROM else (loss, nll, n)

    monkeypatch.setattr(Trainer, "_train_step", counting_step)
    monkeypatch.setattr(trainer_module, "teacher_forced_loss", poisoned_loss)


@pytest.mark.parametrize("saves", [{"save_every": 3}, {"eval_every": 3}], ids=["periodic", "validation"])
def test_divergence_writes_no_bad_checkpoint_and_the_same_command_resumes_from_a_good_one(tmp_path, capsys, saves,
                                                                                          poisoned_batches):
    run = tmp_path / "run"
    cfg = write_cfg(tmp_path / "cfg.json", **copy_cfg(run, **DIVERGING, **saves))
    assert cli_main(["train", cfg]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err  # one line
    named = re.search(r"Last good checkpoint: (\S+)", err)
    assert "training diverged" in err and named, err
    latest = read_pointer(run)
    assert named[1] == str(latest) and latest.name == "step_0000003"  # the last save before the poison
    assert step_dirs(run), "some checkpoints were written before the divergence"
    for path in step_dirs(run):  # none holds a NaN/inf, so keep_last pruned no good one away
        assert finite(load_checkpoint(path)), path.name
    for line in load_checkpoint(run).train_log:
        assert all(v == v and abs(v) != float("inf") for v in line.values() if isinstance(v, float)), line
    # the same command resumes from the good checkpoint (step 3), says so, and (same poison) diverges again
    assert cli_main(["train", cfg]) == 2
    out, err = capsys.readouterr()
    assert f"resumed from {latest} at step" in out
    assert err.count("\n") == 1 and f"Last good checkpoint: {latest}" in err, err


def test_resume_skips_a_non_finite_checkpoint_an_older_version_wrote(tmp_path, capsys):
    run = tmp_path / "run"
    Trainer(TrainConfig(**copy_cfg(run, max_steps=4, save_every=2)), progress="none").fit()
    good = load_checkpoint(run, with_train_state=True)
    bad = load_checkpoint(run, with_train_state=True)
    with torch.no_grad():
        bad.model.enc[0].ffn.up_proj.weight[0, 0] = float("nan")
    save_checkpoint(run / "step_0000006", bad.model, meta=bad.meta, train_log=bad.train_log,
                    train_state=bad.train_state)
    write_pointer(run, "latest", "step_0000006")
    resumed = Trainer(TrainConfig(**copy_cfg(run, max_steps=4, save_every=2)), progress="terminal")
    out = capsys.readouterr().out
    assert "skipped step_0000006: non-finite weights" in out and f"resumed from {good.path}" in out
    assert resumed.step == 4 and finite(resumed)


def test_a_save_refuses_non_finite_weights_even_when_every_loss_was_finite(tmp_path):
    trainer = Trainer(TrainConfig(**copy_cfg(tmp_path / "run", save_every=2)), progress="none").fit(steps=2)
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    with torch.no_grad():
        trainer.model.dec[0].cross_attn.v_proj.weight[1, 2] = float("inf")
    with pytest.raises(TrainingDiverged, match=r"non-finite between step 2 and step 2.*Last good .*step_0000002"):
        trainer.save()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before


def test_unknown_model_key_in_a_toml_config_is_one_line(tmp_path, capsys):
    toml = tmp_path / "cfg.toml"
    toml.write_text(f'[train]\ndataset = "copy"\nmax_steps = 2\nout_dir = "{tmp_path / "run"}"\n'
                    '[model]\ndropout = 0.0\nd_modle = 64\n')
    assert cli_main(["train", str(toml)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown model key 'd_modle'" in err and "d_model" in err, err
    assert not (tmp_path / "run").exists()


def test_each_step_is_saved_once(tmp_path, monkeypatch):
    """max_steps % save_every == 0: the periodic save and the final validation are one save."""
    saved = []
    real = run_dir.save_checkpoint
    monkeypatch.setattr(run_dir, "save_checkpoint",
                        lambda path, *a, **kw: saved.append(path.name) or real(path, *a, **kw))
    trainer = Trainer(TrainConfig(**copy_cfg(tmp_path / "run", max_steps=6, save_every=3)), progress="none").fit()
    assert saved == ["step_0000003", "step_0000006"]
    assert [r["step"] for r in trainer.log if r["kind"] == "valid"] == [6]
    ck = load_checkpoint(tmp_path / "run")
    assert ck.train_log[-1]["kind"] == "valid" and read_pointer(tmp_path / "run", "best") == ck.path


# ------------------------------------------------------------------------------------------ kills

# `workbench train CFG` in a child process that, when KILL_AT >= 0, SIGKILLs itself at its KILL_AT-th
# os.rename/os.replace: the moments between the renames of a checkpoint write are where a kill can do harm.
# The child is forked from this process, which has torch and workbench imported already (a fresh interpreter
# spends seconds importing them, and these tests start 25 of them); what it runs is the CLI's own `main`.
FORK = multiprocessing.get_context("fork")


def _train_killing_at(cfg: str, kill_at: int, err_path: str) -> None:
    sys.stdout = open(os.devnull, "w")  # the child ends with the run: nothing to close
    sys.stderr = open(err_path, "w", buffering=1)
    calls = [0]

    def killing(real):
        def wrapper(*args, **kw):
            if calls[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            calls[0] += 1
            return real(*args, **kw)
        return wrapper

    os.rename, os.replace = killing(os.rename), killing(os.replace)
    sys.exit(cli_main(["train", cfg]))


class Child:
    """A started `workbench train` child: `.proc` (a multiprocessing.Process), `.err()` (what it wrote to stderr)."""

    def __init__(self, tmp_path, cfg: str, kill_at: int = -1):
        self.err_path = tmp_path / f"child_{time.monotonic_ns()}.err"
        self.proc = FORK.Process(target=_train_killing_at, args=(cfg, kill_at, str(self.err_path)))
        self.proc.start()

    def err(self) -> str:
        return self.err_path.read_text() if self.err_path.exists() else ""

    def wait(self) -> int:
        """The exit code (negative: killed by that signal), once the child has ended."""
        self.proc.join(timeout=120)
        if self.proc.exitcode is None:
            self.proc.kill()
            pytest.fail(f"the training child did not end within 120 s:\n{self.err()}")
        return self.proc.exitcode


def assert_run_dir_sound(run):
    """`latest` and `best` name complete, loadable, finite checkpoints (when a save got that far)."""
    for name in ("latest", "best"):
        target = read_pointer(run, name)
        if target is not None:
            ck = load_checkpoint(target)
            assert finite(ck), (name, target)


def final_weights(path):
    return load_checkpoint(path).model.state_dict()


@pytest.fixture
def reference(tmp_path):
    """Final weights of the run below, uninterrupted."""
    def make(**changes):
        cfg = TrainConfig(**copy_cfg(tmp_path / "ref", **changes))
        return Trainer(cfg, resume=False, progress="none").fit().model.state_dict()
    return make


KILL_RUN = dict(max_steps=6, save_every=3, log_every=3, keep_last=1)


@pytest.mark.slow  # one child run per kill point
def test_a_kill_at_any_rename_leaves_a_loadable_run_and_the_same_command_finishes_it_exactly(tmp_path, reference):
    ref = reference(**KILL_RUN)
    # kill at the 0th, 1st, ... rename/replace of the run until one more than the run makes
    for kill_at in range(16):
        run = tmp_path / f"run{kill_at}"
        cfg = write_cfg(tmp_path / f"cfg{kill_at}.json", **copy_cfg(run, **KILL_RUN))
        proc = Child(tmp_path, cfg, kill_at)
        returncode = proc.wait()
        if returncode == 0:
            break
        assert returncode == -signal.SIGKILL, (kill_at, returncode, proc.err())
        assert_run_dir_sound(run)
        assert cli_main(["train", cfg]) == 0  # the same command resumes and finishes
        assert not [p.name for p in run.iterdir() if p.name.startswith(".")], kill_at  # stale ones cleaned up
        assert_run_dir_sound(run)
        got = final_weights(run)
        for key, value in ref.items():
            assert torch.equal(got[key], value), (kill_at, key)
    assert kill_at >= 5, "two saves (directory, latest, best) make at least five renames"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sigkill_at_random_moments(tmp_path, reference, seed):
    changes = dict(max_steps=40, save_every=2, eval_every=10, log_every=5, keep_last=2)
    ref = reference(**changes)
    run = tmp_path / "run"
    cfg = write_cfg(tmp_path / "cfg.json", **copy_cfg(run, **changes))
    rng = random.Random(seed)
    killed_mid_run = 0
    for _ in range(3):
        before = read_pointer(run)
        proc = Child(tmp_path, cfg)
        # start-up (data, model) takes a while under load: kill at a random moment after the next save
        while read_pointer(run) == before and proc.proc.is_alive():
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        proc.proc.kill()
        returncode = proc.wait()
        assert_run_dir_sound(run)
        latest = read_pointer(run)
        killed_mid_run += returncode == -signal.SIGKILL and latest is not None and latest.name < "step_0000040"
    assert killed_mid_run, "no kill landed between the first checkpoint and the end"
    assert cli_main(["train", cfg]) == 0
    assert_run_dir_sound(run)
    got = final_weights(run)
    for key, value in ref.items():
        assert torch.equal(got[key], value), key


def train_until_first_save(cfg: str, run, **pipes) -> subprocess.Popen:
    """`workbench train CFG` in a subprocess, returned once its first checkpoint exists (or it ended)."""
    proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", "train", cfg], text=True, **pipes)
    while read_pointer(run) is None and proc.poll() is None:
        time.sleep(0.005)
    return proc


def test_sigterm_saves_the_step_reached_and_the_same_command_finishes_the_run_exactly(tmp_path, reference):
    """`kill PID` (a background run, `docker stop`, a preemption) saves as Ctrl-C does; nothing is lost."""
    changes = dict(max_steps=300, save_every=50, eval_every=0, log_every=10, keep_last=2)
    ref = reference(**changes)
    run = tmp_path / "run"
    cfg = write_cfg(tmp_path / "cfg.json", **copy_cfg(run, **changes))
    proc = train_until_first_save(cfg, run, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(0.05)  # a few steps past the periodic save
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, out)
    latest = read_pointer(run)
    stopped = re.search(r"interrupted at step (\d+): saving", out)
    if stopped:  # the step reached is the one saved
        assert latest.name == f"step_{int(stopped.group(1)):07d}", (latest, out)
    else:  # the signal came right after a periodic save, which already holds the step reached
        assert int(latest.name[5:]) % 50 == 0, (latest, out)
    assert latest.name < "step_0000300"
    assert_run_dir_sound(run)
    assert cli_main(["train", cfg]) == 0
    got = final_weights(run)
    for key, value in ref.items():
        assert torch.equal(got[key], value), key


@pytest.mark.slow
def test_time_spent_stopped_does_not_count_against_the_time_budget(tmp_path):
    """`kill -STOP` / `-CONT` (or Ctrl-Z, fg) pauses a `max_minutes` run; budget and schedule resume as they were."""
    changes = dict(schedule="warmup_cosine", warmup=5, max_steps=0, max_minutes=0.1, save_every=20, log_every=1,
                   keep_last=2)
    run = tmp_path / "run"
    cfg = write_cfg(tmp_path / "cfg.json", **copy_cfg(run, **changes))
    proc = train_until_first_save(cfg, run, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    proc.send_signal(signal.SIGSTOP)
    stopped_at = read_pointer(run)
    time.sleep(8.0)  # longer than the whole 6-second budget
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    log = load_checkpoint(run).train_log
    train = [r for r in log if r["kind"] == "train"]
    # The budget, not the budget plus the 8-second stop: every step is logged, and had the stop counted, the step
    # after SIGCONT would be logged 8 s or more after the one before it. Measured against the stop, not the clock's
    # speed: how many steps fit, and how long each takes, depends on the machine's load.
    gaps = [b["time"] - a["time"] for a, b in zip(train, train[1:], strict=False)]
    assert max(gaps) < 8.0, max(gaps)
    assert train[-1]["time"] >= 6.0, train[-1]  # and it used its whole budget
    assert train[-1]["step"] > int(stopped_at.name[5:])  # it trained on after the stop

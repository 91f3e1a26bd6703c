"""The exponential moving average of the weights (`ema_decay`): the formula, exact resume, the saved checkpoint."""

import pytest
import torch

from workbench.checkpoint.format import load_checkpoint
from workbench.training import Trainer, run_dir
from workbench.training.config import TrainConfig


def copy_cfg(out_dir, **changes) -> TrainConfig:
    cfg = dict(
        dataset="copy", preset="tiny", copy_vocab=11, copy_len=8, copy_pairs=600, max_tokens=270,
        schedule="inverse_sqrt", lr=3e-3, warmup=30, label_smoothing=0.0, max_steps=12, log_every=1, eval_every=0,
        bleu=False, best_metric="valid_loss", out_dir=str(out_dir), device="cpu", threads=1, model={"dropout": 0.1},
        ema_decay=0.9,
    )
    return TrainConfig(**(cfg | changes))


def test_the_average_follows_the_weights_after_every_step_with_the_warmed_up_decay(tmp_path):
    run = tmp_path / "run"
    trainer = Trainer(copy_cfg(run, save_every=1, keep_last=100), resume=False, progress="none")
    expected = {name: p.detach().double().clone() for name, p in trainer.model.named_parameters()}
    trainer.fit()
    for step, path in enumerate(run_dir.step_dirs(run), start=1):
        decay = min(0.9, (1 + step) / (10 + step))
        weights = load_checkpoint(path).model.state_dict()
        for name, value in expected.items():
            value.mul_(decay).add_(weights[name].double(), alpha=1 - decay)
    assert step == 12
    saved = load_checkpoint(run / "ema")
    assert saved.meta["ema_decay"] == 0.9 and saved.meta["step"] == 12
    got = saved.model.state_dict()
    final = trainer.model.state_dict()
    for name, value in expected.items():
        torch.testing.assert_close(got[name].double(), value, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(trainer.ema[name].double(), value, rtol=1e-5, atol=1e-6)
    assert any(not torch.allclose(got[name], final[name]) for name in expected), "the average is not the last weights"
    assert saved.src_tokenizer is None  # copy task: ids are the vocabulary; a text run saves its tokenizers


def test_an_interrupted_run_resumes_its_average_exactly(tmp_path):
    whole = Trainer(copy_cfg(tmp_path / "whole"), resume=False, progress="none").fit()
    cfg = copy_cfg(tmp_path / "split", save_every=4)
    Trainer(cfg, progress="none").fit(steps=5)  # saved at step 4 and at the end of fit (step 5)
    Trainer(cfg, progress="none").fit()
    a, b = load_checkpoint(tmp_path / "whole" / "ema").model.state_dict(), load_checkpoint(
        tmp_path / "split" / "ema").model.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert whole.step == 12


def test_turning_it_on_when_resuming_starts_from_the_weights_reached(tmp_path, capsys):
    run = tmp_path / "run"
    Trainer(copy_cfg(run, ema_decay=0.0, max_steps=4, save_every=4), progress="none").fit()
    assert not (run / "ema").exists()
    trainer = Trainer(copy_cfg(run, max_steps=5), progress="terminal")
    assert "moving average starts from step 4" in capsys.readouterr().out
    start = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.fit()
    decay = min(0.9, 6 / 15)
    now = dict(trainer.model.named_parameters())
    for name, value in start.items():
        torch.testing.assert_close(trainer.ema[name], decay * value + (1 - decay) * now[name].detach())


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5])
def test_a_decay_outside_0_to_1_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="ema_decay"):
        copy_cfg(tmp_path, ema_decay=bad)


def test_asking_for_the_average_of_a_run_without_one_says_so(tmp_path):
    trainer = Trainer(copy_cfg(tmp_path / "run", ema_decay=0.0, max_steps=1), resume=False, progress="none")
    with pytest.raises(ValueError, match="ema_decay is 0"):
        trainer.ema_model()

"""DDP through torchrun (gloo, 2 CPU processes) follows the same loss trajectory as one process."""

import json
import os
import subprocess
import sys

import pytest
import torch

from workbench.checkpoint.format import load_checkpoint
from workbench.training import Trainer
from workbench.training.config import TrainConfig

CFG = dict(
    dataset="copy", preset="tiny", copy_vocab=13, copy_len=7, copy_pairs=400, max_tokens=160, accum=2,
    schedule="inverse_sqrt", lr=3e-3, warmup=10, max_steps=6, log_every=1, eval_every=0, bleu=False,
    best_metric="valid_loss", device="cpu", threads=1, model={"dropout": 0.0},  # no dropout: ranks draw differently
)


@pytest.mark.slow
def test_two_process_gloo_matches_one_process(tmp_path):
    cfg_file = tmp_path / "ddp.json"
    cfg_file.write_text(json.dumps(CFG | {"out_dir": str(tmp_path / "ddp")}))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2",
           "-m", "workbench.cli", "train", str(cfg_file)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    before = torch.get_num_threads()
    try:
        single = Trainer(TrainConfig(**CFG | {"out_dir": str(tmp_path / "single")}), progress="none").fit()
    finally:
        torch.set_num_threads(before)
    ddp = load_checkpoint(tmp_path / "ddp", with_train_state=True)
    assert ddp.train_state["world"] == 2
    one = [r for r in single.log if r["kind"] == "train"]
    two = [r for r in ddp.train_log if r["kind"] == "train"]
    assert [r["step"] for r in two] == [r["step"] for r in one] == list(range(1, 7))
    assert [r["tokens"] for r in two] == [r["tokens"] for r in one]  # same global batches
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), (a, b)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3), (a, b)
    for (k, p), q in zip(single.model.state_dict().items(), ddp.model.state_dict().values()):
        if k.endswith("k_proj.bias"):
            # softmax ignores a constant key bias, so its true gradient is 0 and Adam turns the
            # rounding noise (which differs with the reduction order) into full-size steps
            continue
        assert torch.allclose(p, q, atol=1e-5), k


# Each rank trains through the same code as `workbench train` and writes its own weights, so the test can see
# whether the ranks stayed identical.
RANK_SCRIPT = """
import os, sys, torch
from safetensors.torch import save_file
from workbench.training.config import TrainConfig
from workbench.training import Trainer
import json
trainer = Trainer(TrainConfig(**json.loads(open(sys.argv[1]).read())), progress="none").fit()
state = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}  # tied weights: copies
save_file(state, os.path.join(sys.argv[2], f"rank{os.environ['RANK']}.safetensors"),
          metadata={"step": str(trainer.step)})
"""


@pytest.mark.slow
def test_ranks_agree_on_a_time_budget(tmp_path):
    """max_minutes and the time-budget cosine under DDP: the ranks stop at the same step with identical weights."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    cfg = CFG | {"out_dir": str(tmp_path / "ddp"), "schedule": "warmup_cosine", "max_steps": 0, "max_minutes": 0.05,
                 "log_every": 5}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2",
           str(tmp_path / "rank.py"), str(tmp_path / "cfg.json"), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = []
    for rank in (0, 1):
        with safe_open(str(tmp_path / f"rank{rank}.safetensors"), "pt") as f:
            steps.append(int(f.metadata()["step"]))
    assert steps[0] == steps[1] > 10, steps
    zero, one = (load_file(str(tmp_path / f"rank{r}.safetensors")) for r in (0, 1))
    for key, value in zero.items():
        assert torch.equal(value, one[key]), key

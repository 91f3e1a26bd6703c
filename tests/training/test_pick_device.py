"""`pick_device` on a CUDA machine, emulated on any machine: torch >= 2.11 refuses `set_device("cuda")` without an
index, which stopped every CUDA training run (found by benchmarks/gpu_check.sh on an H100)."""

from __future__ import annotations

import pytest
import torch

from workbench.training.distributed import Dist, pick_device


@pytest.fixture
def fake_cuda(monkeypatch):
    chosen = []

    def set_device(dev):
        if isinstance(dev, torch.device) and dev.index is None:
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{dev}")
        chosen.append(dev)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32  # pick_device sets both
    yield chosen
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("name", ["cuda", "auto"])
def test_plain_cuda_gets_the_current_index(fake_cuda, name):
    assert pick_device(name, Dist()) == torch.device("cuda", 0)
    assert fake_cuda == [torch.device("cuda", 0)]


def test_an_index_and_ddp_ranks_are_kept(fake_cuda):
    assert pick_device("cuda:1", Dist()) == torch.device("cuda", 1)
    assert pick_device("cuda", Dist(rank=1, world=2, local_rank=1)) == torch.device("cuda", 1)

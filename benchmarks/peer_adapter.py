"""Adds the workbench Transformer as a peer of ../shared/bench/peers.py, built to the same spec.

peers.py's header: "give it a name in PEERS, build it in Peer.__init__, and answer train_logits /
plain_forward / capture_forward / decoders". We subclass its Peer instead of editing it, so the
peers' own code and figures stay untouched and every peer runs in the same process and run.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PEERS_DIR = Path(os.environ.get("WORKBENCH_BENCH", ROOT.parent / "shared" / "bench"))


def load_peers():
    if not (PEERS_DIR / "peers.py").is_file():
        raise SystemExit(f"peers.py not found in {PEERS_DIR}; set WORKBENCH_BENCH to the folder holding it")
    sys.path.insert(0, str(PEERS_DIR))
    import peers

    return peers


def workbench_config(peers, cfg: dict):
    """The peers' architecture in workbench terms: post-norm, interleaved sinusoids, one shared
    embedding for source, target and output, dropout 0.1 everywhere peers apply it."""
    from workbench.core.config import ModelConfig

    return ModelConfig(
        src_vocab=cfg["vocab"], tgt_vocab=cfg["vocab"], d_model=cfg["d_model"], n_heads=cfg["heads"],
        d_ff=cfg["d_ff"], enc_layers=cfg["enc_layers"], dec_layers=cfg["dec_layers"],
        dropout=peers.DROPOUT, attn_dropout=peers.DROPOUT, act_dropout=peers.DROPOUT,
        max_positions=peers.MAX_POS, tie_embeddings="all", norm_first=False,
        pad_id=peers.PAD, bos_id=peers.BOS, eos_id=peers.EOS, unk_id=3,
    )


def _cpu_peak_memory(peers) -> None:
    """peers.py reports peak memory on CUDA only; on Linux CPUs use the process's peak resident set
    (VmHWM), which writing "5" to /proc/self/clear_refs resets, so each measurement gets its own peak."""
    clear, status = Path("/proc/self/clear_refs"), Path("/proc/self/status")
    if not (clear.exists() and status.exists()):
        return
    reset_cuda, peak_cuda = peers.reset_mem, peers.peak_mem_gib

    def reset_mem(dev):
        reset_cuda(dev)
        if dev.type == "cpu":
            clear.write_text("5")

    def peak_mem_gib(dev):
        if dev.type != "cpu":
            return peak_cuda(dev)
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20  # kB -> GiB
        return None

    peers.reset_mem, peers.peak_mem_gib = reset_mem, peak_mem_gib


def install(peers) -> None:
    """Register the `workbench` peer and CPU peak-memory reporting."""
    from workbench.core.model import Transformer

    base = peers.Peer

    class Peer(base):
        def __init__(self, name, cfg, dev, seed):
            if not name.startswith("workbench"):
                super().__init__(name, cfg, dev, seed)
                return
            self.name, self.cfg, self.dev = name, cfg, dev
            torch.manual_seed(seed)
            self.model = Transformer(workbench_config(peers, cfg))
            self.model.check_inputs = False  # the trainer's setting: no host sync per step
            self.model.to(dev)
            self.fwd_module = self.model

        def train_logits(self, src, tgt_in):
            if not self.name.startswith("workbench"):
                return super().train_logits(src, tgt_in)
            return self.fwd_module(src, tgt_in)

        def plain_forward(self, src, tgt_in):
            if not self.name.startswith("workbench"):
                return super().plain_forward(src, tgt_in)
            return self.model(src, tgt_in)

        def capture_forward(self, src, tgt_in):
            if not self.name.startswith("workbench"):
                return super().capture_forward(src, tgt_in)
            logits, trace = self.model.run_with_cache(src, tgt_in, names="*.hook_probs")
            m = self.model.cfg
            return logits, {
                "enc_self": [trace.attention("enc_self", i) for i in range(m.enc_layers)],
                "dec_self": [trace.attention("dec_self", i) for i in range(m.dec_layers)],
                "cross": [trace.attention("cross", i) for i in range(m.dec_layers)],
            }

        def decoders(self, beam, steps):
            if not self.name.startswith("workbench"):
                return super().decoders(beam, steps)
            return {"": lambda s, k, n: peers.beam_search(WorkbenchBeamAdapter(self.model), s, k, n)[0]}

    class WorkbenchBeamAdapter:
        """peers.beam_search's adapter protocol over the workbench KV cache."""

        def __init__(self, model):
            self.m = model

        def start(self, src, K):
            index = torch.arange(src.size(0), device=src.device).repeat_interleave(K)
            self.encoded = self.m.encode(src).index_select(index)
            self.cache = self.m.start_cache(self.encoded)

        def step(self, ys):
            logits, self.cache = self.m.decode(ys[:, -1:], self.encoded, self.cache)
            return logits[:, -1]

        def reorder(self, sel):
            # peers.beam_search picks parents within each sentence's beams, whose cross-attention K/V are equal:
            # only the self-attention K/V follow (owed, gathered by the next step's append), as in beam_search
            self.cache = self.cache.reorder(sel)

    peers.Peer = Peer
    peers.PEERS[:0] = ["workbench"]
    _cpu_peak_memory(peers)


def measure_peak(device: torch.device, reps: int = 10) -> float:
    """Achievable dense matmul rate in TFLOP/s: fp32 2048^3 on CPU, bf16 8192^3 on CUDA; median of `reps` after 3."""
    n, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (2048, torch.float32)
    x = torch.randn(n, n, device=device, dtype=dtype)
    y = torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for i in range(3 + reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        torch.mm(x, y)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 3:
            times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times) / 1e12

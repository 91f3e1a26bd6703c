"""What listening for plain PyTorch hooks costs when none is registered.

    python benchmarks/bench_hooks.py --json benchmarks/results/hooks_idle_cpu.json

Hook points and the fused projections check, on every call, whether a `register_forward_hook`-style hook
(or nnsight's instrumented forward) watches them (`workbench.core.hooks.observed`). This times an eval forward
with those checks against the same model with the checks patched out (the hook points' old fast call:
`__call__ = forward`; projections always fused), interleaved in one run, median of `--repeats` rounds each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench import Transformer, presets  # noqa: E402
from workbench.core import attention, hooks  # noqa: E402


@contextmanager
def unchecked():
    """The code path before plain hooks were honoured: no `observed` test anywhere."""
    saved = (hooks.HookPoint.__call__, hooks.HookPoint.is_active, attention.observed)
    hooks.HookPoint.__call__ = hooks.HookPoint.forward
    hooks.HookPoint.is_active = lambda self: hooks._ACTIVE_COUNT != 0 and hooks._listens(self)
    attention.observed = lambda module: False
    try:
        yield
    finally:
        hooks.HookPoint.__call__, hooks.HookPoint.is_active, attention.observed = saved


def time_forward(model, src, tgt, n: int) -> float:
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(n):
            model(src, tgt)
        return (time.perf_counter() - start) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    for label, cfg, batch, length, n in (("tiny", presets.tiny(), 8, 12, 50),
                                         ("multi30k_small", presets.multi30k_small(), 8, 24, 3)):
        torch.manual_seed(0)
        model = Transformer(cfg).eval()
        src = torch.randint(4, cfg.src_vocab, (batch, length))
        tgt = torch.randint(4, cfg.tgt_vocab, (batch, length))
        time_forward(model, src, tgt, 3)  # warm up
        checked, plain = [], []
        for _ in range(args.repeats):
            checked.append(time_forward(model, src, tgt, n))
            with unchecked():
                plain.append(time_forward(model, src, tgt, n))
        c, p = statistics.median(checked), statistics.median(plain)
        results[label] = {"batch": batch, "length": length, "hook_points": len(model.hook_names()),
                          "forward_ms_with_checks": c * 1e3, "forward_ms_without": p * 1e3, "ratio": c / p}
        print(f"{label}: {c * 1e3:.3f} ms with the checks, {p * 1e3:.3f} ms without: ratio {c / p:.3f}")
    out = {"benchmark": "bench_hooks", "threads": args.threads, "repeats": args.repeats,
           "torch": torch.__version__, "results": results}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()

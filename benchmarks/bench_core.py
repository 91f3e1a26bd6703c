"""Core speed: the workbench model next to ../shared/bench/peers.py's peers, in one run.

    python benchmarks/bench_core.py --device cpu --config tiny --workload train
    python benchmarks/bench_core.py --device cuda --config base --workload all --json out.json

Every option of peers.py is accepted (see `--help`); `--peers` defaults to workbench,torch,naive.
Reports forward+backward target tokens/s (train), capture-vs-plain forward ratio (capture), and
peak memory on CUDA, exactly as peers.py measures its own peers.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peer_adapter import install, load_peers  # noqa: E402


def main() -> None:
    peers = load_peers()
    install(peers)
    argv = sys.argv[1:]
    if not any(a.startswith("--peers") for a in argv):
        argv += ["--peers", "workbench,torch,naive"]
    sys.argv = [sys.argv[0], *argv]
    peers.main()


if __name__ == "__main__":
    main()

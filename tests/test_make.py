"""`make test`, the README's test command, installs Chromium and its driver itself when they are missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
INSTALL = "apt-get install -y -qq --no-install-recommends chromium chromium-driver"


def dry_run(tmp_path: Path, tools: dict[str, str], target: str = "test") -> str:
    """`make -n TARGET` (prints the commands, runs none) with only `tools` (name -> shell script) on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / name).chmod(0o755)
    proc = subprocess.run([MAKE, "-n", target], cwd=ROOT, env={"PATH": str(bin_dir)}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


pytestmark = pytest.mark.skipif(MAKE is None, reason="needs GNU make")


def test_make_test_installs_chromium_and_driver_when_missing(tmp_path):
    out = dry_run(tmp_path, {"id": "echo 0"})
    lines = out.splitlines()
    assert "apt-get update -qq" in lines
    assert f"env DEBIAN_FRONTEND=noninteractive {INSTALL}" in lines
    assert lines.index(f"env DEBIAN_FRONTEND=noninteractive {INSTALL}") < next(
        i for i, line in enumerate(lines) if "-m pytest" in line), "Chromium must be there before pytest runs"


def test_make_test_uses_sudo_only_when_not_root(tmp_path):
    out = dry_run(tmp_path, {"id": "echo 1000"})
    assert f"sudo env DEBIAN_FRONTEND=noninteractive {INSTALL}" in out.splitlines()


def test_make_test_installs_nothing_when_both_are_there(tmp_path):
    out = dry_run(tmp_path, {"id": "echo 0", "chromium": "true", "chromedriver": "true"})
    assert "apt-get" not in out and "-m pytest" in out


def test_make_test_installs_the_driver_when_only_the_browser_is_there(tmp_path):
    out = dry_run(tmp_path, {"id": "echo 0", "chromium": "true"})
    assert INSTALL in out


def test_ci_runs_the_readme_command():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    assert commands[-1] in ("make test", "exec make test")
    assert not [line for line in commands if "apt-get" in line or "pytest" in line], commands

"""The `workbench` command line: discoverable hook names, clear errors."""

import subprocess
import sys

import pytest

from workbench.cli import main


def test_info_lists_hook_points_by_glob(capsys):
    assert main(["info", "tiny", "--hooks", "dec.1.cross_attn.hook_*"]) == 0
    out = capsys.readouterr().out
    assert '"d_model": 32' in out
    assert "dec.1.cross_attn.hook_probs" in out and "enc.0.self_attn.hook_probs" not in out


def test_info_on_a_missing_path_is_one_clear_line(capsys, tmp_path):
    assert main(["info", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "neither a preset" in err and "Traceback" not in err


def test_info_on_a_directory_without_a_config_says_so(capsys, tmp_path):
    assert main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is not a checkpoint directory: it has no config.json" in err and "Errno" not in err


def test_console_script_runs_as_module():
    out = subprocess.run([sys.executable, "-m", "workbench.cli", "--help"], capture_output=True, text=True, check=True)
    assert "info" in out.stdout


def test_help_lists_every_subcommand(capsys):
    from workbench.cli import COMMANDS

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


@pytest.mark.parametrize(("command", "flag"), [("train", "--fresh"), ("average", "--last"), ("translate", "--beam"),
                                               ("evaluate", "--ref"), ("import", "--spm"), ("info", "--hooks"),
                                               ("views", "--min-weight"), ("heads", "--stat"),
                                               ("align", "--choose"), ("aer", "--swap-gold")])
def test_subcommand_help_shows_its_own_flags(command, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert flag in capsys.readouterr().out


def test_unknown_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["trian", "x.toml"])
    assert exc.value.code == 2
    assert "invalid choice: 'trian'" in capsys.readouterr().err


def test_a_warning_is_one_line_named_by_the_command(tmp_path):
    """A line too long for the model is translated truncated, and said so in one stderr line like the errors, not
    as a Python warning with its source line."""
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[2] / "checkpoints" / "multi30k-de-en"
    run = subprocess.run([sys.executable, "-m", "workbench.cli", "translate", "--checkpoint", str(shipped),
                          "--beam", "1", "--max-len", "5"], input="Hund " * 400 + "\nEin Hund .\n",
                         capture_output=True, text=True, check=True)
    assert len(run.stdout.splitlines()) == 2
    assert run.stderr.splitlines() == [
        "workbench translate: warning: line 1 has 400 source tokens; truncated to 255 to fit the model's "
        "max_positions (256)"]

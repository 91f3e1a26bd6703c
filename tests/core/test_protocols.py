"""One progress protocol: every long-running function reports `progress(done, total, what)`."""

from workbench.core.protocols import print_progress


def test_print_progress_prints_one_line(capsys):
    print_progress(2, 5, "step 40")
    print_progress(3, 5)
    assert capsys.readouterr().out == "[2/5] step 40\n[3/5]\n"

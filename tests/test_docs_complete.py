"""The docs list what the code has (issue 37 point 6): every CLI command, every tab of the app's one list
(`ui.app_tabs.TABS`, which also builds the served page's tabs and their `tab=` values), every URL key the page binds,
and no URL key the page does not bind. A command, tab or key added (or removed) without its line in the docs fails
here."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "ui"))
from app_fixtures import build_checkpoint  # noqa: E402

from workbench.cli import COMMANDS  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_command_has_its_row_in_the_architecture_doc():
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    missing = [name for name in COMMANDS if f"| `workbench {name}` |" not in text]
    assert not missing, f"docs/architecture.md's command table lacks: {missing}"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from workbench.ui import Workbench
    from workbench.ui.app_tabs import SERVED_TABS

    root = tmp_path_factory.mktemp("ckpts")
    build_checkpoint(root / "alpha", seed=0, steps=0)
    return Workbench(root / "alpha", default_dir=None, background=False, sync_url=True, extra_tabs=SERVED_TABS)


def test_one_tab_list_drives_the_page(served):
    """The served page's tabs and their `tab=` values are TABS', in its order (no second list of tabs)."""
    from workbench.ui.app_tabs import TABS

    assert [title for title, _ in served.tabs] == [t.title for t in TABS]
    assert list(served.param.tab.objects) == [t.key for t in TABS]
    assert [f.key for f in served.link.fields].count("tab") == 1


def test_every_tab_has_its_row_in_the_app_doc(served):
    from workbench.ui.app_tabs import TABS

    text = (DOCS / "app.md").read_text(encoding="utf-8")
    missing = [t.title for t in TABS if f"| {t.title} tab |" not in text]
    assert not missing, f"docs/app.md's table of what the page does lacks: {missing}"
    row = next(line for line in text.splitlines() if line.startswith("| `tab` |"))
    assert re.findall(r"`([a-z-]+)`", row.split("|")[2]) == [t.key for t in TABS], row


def test_every_url_key_is_in_the_app_doc(served):
    text = (DOCS / "app.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| ((?:`[a-z]+`(?:, )?)+) \|", text, flags=re.M))
    keys = {k for cell in documented for k in re.findall(r"`([a-z]+)`", cell)}
    bound = {field.key for field in served.link.fields}
    assert bound, "no URL key bound: the test would pass for nothing"
    assert bound <= keys, f"docs/app.md's URL table lacks: {sorted(bound - keys)}"
    assert keys <= bound, f"docs/app.md's URL table names keys the page does not read: {sorted(keys - bound)}"

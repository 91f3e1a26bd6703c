"""The Compare tab's picker without a browser: with no B (A has no compatible partner) it shows an empty first
choice, so that choosing any checkpoint, A's own included, draws the comparison and puts `cmp=` in the URL; a
link with `cmp=` opens with B chosen."""

from __future__ import annotations

import sys
from pathlib import Path

import panel as pn
import pytest
from panel.io.location import Location

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint  # noqa: E402

from workbench.ui import workbench_app  # noqa: E402
from workbench.ui.link import parse  # noqa: E402
from workbench.ui.views import CompareView  # noqa: E402


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("compare_ckpts")
    build_checkpoint(root / "alpha", seed=0, steps=0)  # de->en
    build_checkpoint(root / "reverse", seed=3, steps=0, langs=("en", "de"))  # no other en->de: no partner
    return root


def _page(ckpt_dir, monkeypatch, query: str):
    """A Workbench as a served page would be, opened on `query` (inline work, a Location of its own)."""
    location = Location(search=query)
    monkeypatch.setattr(workbench_app.Link, "of_page", classmethod(lambda cls: cls(location.search, location)))
    wb = workbench_app.Workbench(checkpoints=[ckpt_dir], default_dir=None, sync_url=True, background=False)
    return wb, location


def _figures(view) -> list[str]:
    return [f.object.title.text for o in view.content if isinstance(o, pn.FlexBox) for c in o for f in c]


def test_without_b_the_picker_offers_an_empty_choice_and_a_s_own_name_draws(ckpt_dir, monkeypatch):
    wb, location = _page(ckpt_dir, monkeypatch, "?ckpt=reverse&src=A+dog+runs.&tab=compare")
    view = wb.compare
    picker = view.__panel__()[0]
    assert view.other is None and picker.value is None
    assert list(picker.options) == [CompareView.CHOOSE, "alpha", "reverse"]  # the empty choice first
    assert picker.get_root().value == "None"  # the browser shows that choice, not A's name
    assert "cmp" not in parse(location.search) and not _figures(view)
    picker.value = "reverse"  # A's own name: a change like any other
    assert view.other == "reverse" and view._why == "chosen by you"
    assert parse(location.search)["cmp"] == "reverse"
    assert [t.split("\n")[0] for t in _figures(view)] == ["A = reverse", "B = reverse", "B − A"]
    assert list(picker.options) == ["alpha", "reverse"]  # B is chosen: the empty choice is gone
    picker.value = "alpha"
    assert view.other == "alpha" and parse(location.search)["cmp"] == "alpha" and len(_figures(view)) == 3


def test_a_link_with_cmp_opens_with_b_chosen_and_a_new_a_without_partner_empties_b(ckpt_dir, monkeypatch):
    wb, location = _page(ckpt_dir, monkeypatch, "?ckpt=reverse&src=A+dog+runs.&tab=compare&cmp=reverse")
    view = wb.compare
    picker = view.__panel__()[0]
    assert view.other == picker.value == "reverse" and view._why == "chosen by you"
    assert CompareView.CHOOSE not in picker.options and len(_figures(view)) == 3
    assert parse(location.search)["cmp"] == "reverse"
    fresh, _ = _page(ckpt_dir, monkeypatch, "?ckpt=alpha&src=Ein+Hund+l%C3%A4uft.&tab=compare")
    view = fresh.compare
    picker = view.__panel__()[0]
    assert view.other is None  # alpha has no other de->en checkpoint here
    fresh.session.checkpoint = "reverse"  # B follows A while nobody chose it: still none, still the empty choice
    assert view.other is None and picker.value is None and list(picker.options)[0] == CompareView.CHOOSE

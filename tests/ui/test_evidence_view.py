"""The Evidence tab without a browser: on a real (tiny) checkpoint it draws the current sentence's alignment, the
source share of every output token and a role for every head; the method picker changes the drawn weights."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from bokeh.models import Div, GlyphRenderer

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint  # noqa: E402

from workbench.analysis.alignment.word_align import align_pairs, aligner  # noqa: E402
from workbench.analysis.attribution.sentence_evidence import sentence_evidence  # noqa: E402
from workbench.ui import loader  # noqa: E402
from workbench.ui.evidence_view import EvidenceView, checkpoint_roles, evidence_figure  # noqa: E402
from workbench.ui.session import Session  # noqa: E402


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    build_checkpoint(root / "alpha", seed=0, steps=0)
    entries, problems = loader.discover([root], default=None)
    assert problems == []
    return Session(entries, checkpoint="alpha", sentence="Ein Hund läuft im Schnee .")


def _data(fig, name):
    return fig.select_one({"name": name}).data_source.data


def test_tab_draws_alignment_shares_and_roles(session):
    view = EvidenceView(session=session)
    view.show()
    assert [type(o).__name__ for o in view.content] == ["Bokeh"]
    fig = view.content[0].object
    r = session.result
    tm = session.translation_model()
    ev = sentence_evidence(tm, r.request.sentence, r.text, method="weights")
    assert _data(fig, "source_share")["share"] == pytest.approx(list(ev.shares))
    assert sorted(set(_data(fig, "alignment_weights")["src"])) <= sorted(ev.src_words)
    grids = [g for g in fig.select({"type": GlyphRenderer}) if (g.name or "").startswith("roles_")]
    assert sorted(g.name for g in grids) == ["roles_cross", "roles_dec_self", "roles_enc_self"]
    assert sum(len(g.data_source.data["roles"]) for g in grids) == 3 * 2 * 4  # every head of the 2+2-layer model
    roles, where = checkpoint_roles(r.model, r.request.sentence, r.text)
    assert checkpoint_roles(r.model, "x", "y")[0] is roles  # measured once per model
    assert "Multi30k test2016" in where and "RWTH" in where and roles.diagonal_aer is not None
    texts = [d.text for d in fig.select({"type": Div}) if "roles</b>, measured on" in d.text]
    assert texts and 'class="term" href="#glossary-aer"' in texts[0]  # its terms of art link to the glossary


def test_method_picker_and_roles_switch(session):
    view = EvidenceView(session=session, roles=False)
    view.show()
    fig = view.content[0].object
    weights = _data(fig, "alignment_weights")["w"]
    assert not [g for g in fig.select({"type": GlyphRenderer}) if (g.name or "").startswith("roles_")]
    assert view.method == "its own aligner"  # the links `workbench align` writes come first
    view.method = "ALTI+ contributions"
    alti = _data(view.content[0].object, "alignment_weights")["w"]
    assert not np.allclose(sorted(weights), sorted(alti)) or len(weights) != len(alti)
    with pytest.raises(ValueError, match="method must be one of"):
        evidence_figure(session.translation_model(), "Ein Hund .", "A dog .", method="rollout")


def test_the_tab_starts_on_the_checkpoints_own_aligner_and_draws_what_workbench_align_writes():
    """general-en-de stores a trained alignment layer as its aligner (alignment.json): the tab's first drawing is its
    links, pair for pair what `word_align.align_pairs` (`workbench align`) writes, labelled with its held-out AER;
    the attention methods stay one click away and are labelled as themselves."""
    general = Path(__file__).resolve().parents[2] / "checkpoints" / "general-en-de"
    entries, problems = loader.discover([general], default=None)
    assert problems == []
    s = Session(entries, checkpoint=entries[0].label, sentence="The committee approved the report yesterday .")
    view = EvidenceView(session=s, roles=False)
    view.show()
    fig = view.content[0].object
    r, tm = s.result, s.translation_model()
    spec = aligner(tm.model, tm.alignment, None, directory=tm.meta["path"])[0]
    assert spec.method == "layer"
    written = align_pairs(tm.model, tm.src_tokenizer, tm.tgt_tokenizer, [r.request.sentence], [r.text], spec)[0]
    ev = sentence_evidence(tm, r.request.sentence, r.text)
    assert ev.links == written and len(written) >= 4
    drawn = _data(fig, "alignment_links")  # the dashed links: x of a source word on top, of an output word below
    n_src, n_out = len(ev.src_words), len(ev.out_words)
    n = max(n_src, n_out)
    xs_src, xs_out = np.linspace(0, n - 1, n_src), np.linspace(0, n - 1, n_out)
    assert {(int(np.abs(xs_src - a).argmin()), int(np.abs(xs_out - b).argmin()))
            for a, b in zip(drawn["x0"], drawn["x1"])} == written
    label = [d.text for d in fig.select({"type": Div}) if "Word alignment" in d.text][0]
    label = re.sub(r"<[^>]+>", "", label)  # as read: its terms of art are glossary links
    held_out = tm.alignment["provenance"]["held_out_aer"]  # 0.1904 as shipped
    assert "the checkpoint's aligner" in label and f"AER {100 * held_out:.1f} %" in label
    assert "no link between a punctuation mark and a word" in label
    view.method = "attention weights"
    label = [d.text for d in view.content[0].object.select({"type": Div}) if "Word alignment" in d.text][0]
    assert "weights AWO units" in label and "checkpoint's aligner" not in label

"""The learner's tour and glossary (issue 37 point 5): every step opens a place the app has, in the Annotated
Transformer's order; every term of art has a definition a student can read, reachable by its anchor."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint  # noqa: E402

from workbench.ui import Workbench  # noqa: E402
from workbench.ui.learn import GLOSSARY, TOUR, Glossary, anchor, glossary_html, start_here, term  # noqa: E402


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    build_checkpoint(root / "alpha", seed=0, steps=0)
    return Workbench(root / "alpha", default_dir=None, background=False)


def test_the_tour_follows_the_annotated_transformers_order():
    topics = [s.topic for s in TOUR]
    order = ["positions", "Masks", "Encoder self", "Decoder self", "Cross", "Heads", "schedule", "smoothing",
             "Decoding"]
    assert [next(i for i, t in enumerate(topics) if word.lower() in t.lower()) for word in order] == \
        sorted(next(i for i, t in enumerate(topics) if word.lower() in t.lower()) for word in order)


def test_every_step_opens_its_tab_and_kind(app):
    for step in TOUR:
        app.tab = "attention" if step.tab != "attention" else "internals"
        app.open_step(step)
        assert app.tab == step.tab, step.topic
        if step.kind:
            assert app.session.kind == step.kind, step.topic
    card = start_here(app.open_step)
    assert card.collapsed and len(card.objects) == len(TOUR) + 1  # the steps, then the glossary
    (glossary,) = card.objects[-1].objects  # the entries, in the component that opens them on a term's click
    assert isinstance(glossary, Glossary) and glossary.html == glossary_html()


def test_the_glossary_defines_every_term_once_with_an_anchor():
    anchors = [anchor(name) for name in GLOSSARY]
    assert len(set(anchors)) == len(anchors)
    page = glossary_html()
    assert all(f'id="{a}"' in page for a in anchors)
    for name in ("AER", "ALTI+", "DLA", "FVU", "L0"):  # the jargon the issue names
        assert len(GLOSSARY[name].split()) >= 8  # a sentence, not an expansion of the acronym
    link = term("ALTI+")
    assert f'href="#{anchor("ALTI+")}"' in link and "title=" in link and "ALTI+" in link
    assert "<" not in term("AER", shown="<b>x</b>").split(">", 1)[1].rsplit("<", 1)[0]  # shown text escaped


def test_every_control_has_a_tooltip_written_for_users():
    """The controls' tooltips (their params' docs) say what the control does in a sentence, not a developer note:
    every parameter that any class of `workbench.ui` declares, found by walking the package (a new control without
    its sentence fails here), but for the store's own state, which no widget shows."""
    import importlib
    import inspect
    import pkgutil

    import param

    import workbench.ui as ui

    state = {("Session", "autorun"), ("Session", "result"), ("Session", "busy"), ("Session", "version"),
             ("Session", "error")}
    checked = set()
    for info in pkgutil.iter_modules(ui.__path__):
        module = importlib.import_module(f"workbench.ui.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if not issubclass(cls, param.Parameterized) or cls.__module__ != module.__name__:
                continue
            for name, p in cls.param.objects("existing").items():
                if p.owner is not cls or name == "name" or (cls.__name__, name) in state \
                        or isinstance(p, param.ClassSelector):  # the session a view is given: no widget
                    continue
                doc = p.doc or ""
                assert len(doc.split()) >= 8 and "-1:" not in doc and "''" not in doc and "`" not in doc, \
                    (cls.__name__, name, doc)
                checked.add((cls.__name__, name))
    assert {("Session", "head"), ("GraphView", "threshold"), ("FeaturesView", "feature"), ("EvidenceView", "method"),
            ("ModelAnalysisView", "step"), ("AnalysisView", "stat"), ("Workbench", "tab")} <= checked


def test_terms_of_art_in_a_views_text_link_to_the_glossary():
    from workbench.ui.learn import GLOSSARY, anchor, link_terms

    text = ("Estimate by attribution patching: AER and ALTI+, then label smoothing, Label smoothing again; "
            "`AER` in code and <a href='x'>AER</a> stay.")
    out = link_terms(text)
    for name in ("attribution patching", "AER", "ALTI+", "label smoothing"):
        assert out.count(f'href="#{anchor(name)}"') == 1, name  # the first mention only
    assert 'href="#glossary-patching' not in out  # the longer term won: no "patching" link inside it
    assert "`AER` in code and <a href='x'>AER</a> stay." in out  # code spans and existing links untouched
    assert ">attribution patching</a>" in out and ">label smoothing</a>" in out  # the text's own spelling
    assert link_terms("no jargon here") == "no jargon here"
    assert all(link_terms(name) != name for name in GLOSSARY)  # every entry is found by its own name


def test_the_views_texts_carry_their_terms():
    from workbench.ui import views
    from workbench.ui.learn import link_terms

    assert 'href="#glossary-causal-mask"' in link_terms(views.MASKS_HOW_TO_READ)
    assert 'href="#glossary-positional-encoding"' in link_terms(views.POSITIONS_HOW_TO_READ)
    note = views.InternalsView._smoothing(0.1, RuntimeError("not measured here"))[0]
    assert 'href="#glossary-label-smoothing"' in note.object


def test_every_views_text_links_its_terms(app):
    """The terms of art in the views' own texts link to the glossary (issue 37 point 5): the header, the ablation
    panel, the Analysis and Graph tabs' texts, the Features tab's dictionary names (L0, FVU), the Compare note."""
    from workbench.ui import features_view, graph_view, views
    from workbench.ui.learn import link_terms

    header = app.__panel__().objects[0].object
    assert 'href="#glossary-head"' in header
    ablation = views._ablation_md([], None, None)
    assert 'href="#glossary-ablation"' in ablation and 'href="#glossary-head"' in ablation
    assert 'href="#glossary-rollout"' in link_terms(views.ANALYSIS_HOW_TO_READ)
    for name in ("L0", "FVU", "SAE", "transcoder", "dictionary"):
        assert f'href="#{anchor(name)}"' in features_view.DICTIONARY_TERMS, name
    intro = graph_view.GraphView(session=app.session).__panel__().objects[0].object
    assert 'href="#glossary-attribution-graph"' in intro and 'href="#glossary-logit"' in intro
    assert 'href="#glossary-teacher-forcing"' in link_terms(views._md_escape("B reads A's output (teacher forcing)"))

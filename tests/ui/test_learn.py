"""The learner's tour and glossary (issue 37 point 5): every step opens a place the app has, in the Annotated
Transformer's order; every term of art has a definition a student can read, reachable by its anchor."""

from __future__ import annotations

import re
import sys
from dataclasses import replace
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
    note = views.InternalsView._smoothing(0.1)[0]
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


def test_other_spellings_of_a_term_link_to_its_entry():
    from workbench.ui.learn import ALIASES, link_terms

    for spelling, name in ALIASES.items():
        assert name in GLOSSARY and f'href="#{anchor(name)}"' in link_terms(spelling), spelling
    out = link_terms("topk, then TopK: symmetrized")
    assert out.count('href="#glossary-topk"') == 1  # one link per entry, whichever spelling comes first
    assert '>symmetrized</a>' in out  # the text's own spelling shown


def _linked(text: str, *names: str) -> list[str]:
    """The names among `names` that `text` does not link to their glossary entry."""
    return [name for name in names if f'class="term" href="#{anchor(name)}"' not in text]


def test_the_tabs_terms_of_art_link_to_the_glossary(app):
    """The jargon each tab shows (issue 37 point 5), drawn as the tab draws it: the Evidence caption (its aligner's
    rules), the Why tab's patching note (the estimate against the sweep), the Features tab's dictionary names and
    card, the Model analysis tab's attribution methods, the Analysis tab's statistics."""
    import panel as pn
    from bokeh.models import Div

    from workbench.analysis.alignment.word_align import AlignmentSpec
    from workbench.analysis.attribution.sentence_evidence import describe_aligner, sentence_evidence
    from workbench.ui import analysis_views, features_view
    from workbench.ui.evidence_view import EvidenceView, draw_evidence
    from workbench.ui.views import AnalysisView
    from workbench.ui.why_view import WhyView

    session = app.session
    evidence = EvidenceView(session=session, roles=False)
    evidence.show()
    (caption,) = [d.text for d in evidence.content[0].object.select({"type": Div})
                  if "evidence-method-label" in d.css_classes]
    assert "EOS dropped, symmetrized none" in re.sub(r"<[^>]+>", "", caption)  # the words a reader sees
    assert _linked(caption, "symmetrization", "EOS", "argmax") == [], caption
    stored = AlignmentSpec("weights", "awi", "drop", ((0, None),), {"held_out_aer": 0.25}, "grow-diag")  # as shipped
    ev = replace(sentence_evidence(session.translation_model(), session.result.request.sentence,
                                   session.result.text), spec=describe_aligner(stored, own=True))
    (caption,) = [d.text for d in draw_evidence(ev).select({"type": Div}) if "evidence-method-label" in d.css_classes]
    assert "symmetrized grow-diag" in re.sub(r"<[^>]+>", "", caption)
    assert _linked(caption, "symmetrization", "grow-diag", "EOS", "argmax", "AER") == [], caption

    why = WhyView(session=session)
    why.show()
    tm, r = session.model, session.result
    ids = list(r.src_ids)
    swapped = tm.src_tokenizer.decode([ids[1], ids[0], *ids[2:-1]])
    if tm.encode_source(swapped)[0] == ids or len(tm.encode_source(swapped)[0]) != len(ids):
        pytest.skip("this tokenizer re-splits the swapped text")
    why.corrupted = swapped  # small: the exact sweep, with the estimate's agreement with it
    (note,) = [o.object for o in why.content if "why-patching-note" in o.css_classes]
    assert "Spearman" in note and _linked(note, "Spearman", "nats", "scale ratio") == [], note

    assert _linked(features_view.DICTIONARY_TERMS, "TopK", "skip transcoder") == []
    view = features_view.FeaturesView(session=session)
    shown = view.render({"site_labels": {}, "site": "hook_memory", "n": 4, "sites": ["hook_memory"], "sentence": "",
                         "card": "| | FVU |\n|---|---|\n| PCA, L0 components | 0.5 |"})
    (card,) = [o for o in shown if isinstance(o, pn.Card)]
    assert _linked(" ".join(str(o.object) for o in card.objects), "PCA", "L0", "nats") == []

    analysis = analysis_views.ModelAnalysisView(session=session, analysis="attribution vs attention")
    page = analysis.__panel__()
    (terms,) = [o for o in page.objects if "analysis-method-terms" in o.css_classes]
    assert terms.visible and _linked(terms.object, "saliency", "input × gradient", "Spearman") == []
    picker = page.objects[0].objects[1]  # the method picker shows words; the link keeps the identifier
    assert picker.options == {"saliency": "saliency", "input × gradient": "input_x_gradient"}
    analysis.method = "input_x_gradient"
    assert picker.value == "input_x_gradient" and analysis.analysis == "attribution vs attention"
    analysis.analysis = "logit lens"
    assert not terms.visible  # the methods' words only beside the analysis they belong to

    stats = AnalysisView(session=session)
    stats.show()
    assert _linked(stats.content[0].object, "entropy", "rollout") == []


def test_controls_without_a_label_of_their_own_get_a_question_mark(app):
    """Every control shows its tooltip's "?" (issue 37 point 5): widgets that draw none (a button group, a checkbox)
    sit beside a tooltip icon with their parameter's sentence; the Features pickers built by hand carry it too."""
    import panel as pn

    from workbench.ui.evidence_view import EvidenceView
    from workbench.ui.features_view import FeaturesView
    from workbench.ui.views import AttentionView

    def icons(layout) -> set[str]:
        return {o.value for o in layout.select(pn.widgets.TooltipIcon)}

    session = app.session
    evidence = EvidenceView(session=session, roles=False)
    assert {EvidenceView.param.method.doc, EvidenceView.param.roles.doc} <= icons(evidence.__panel__())
    assert session.param.words.doc in icons(AttentionView(session=session).__panel__())
    features = FeaturesView(session=session)
    assert features._site_picker.description == FeaturesView.param.site.doc
    assert features._feature_box.description == FeaturesView.param.feature.doc

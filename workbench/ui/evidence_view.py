"""The "Evidence" tab: the current sentence's word alignment (lines whose width is the strength; first by the
checkpoint's own aligner, the links `workbench align` writes, with a picker for the attention methods), the source
share under each output token (ALTI+), and every head's role on a layers × heads grid.

The work is `evidence(snapshot, method, roles)` (`analysis.sentence_evidence` and the head roles), heavy work that
runs in a worker process when the server has a pool (`workers.py`; it gets a `work.Snapshot` of the page's result,
never its model); the view draws its answer (`draw_evidence`, `charts.evidence`). `evidence_figure(tm, source,
output, ...)` does both in one call (notebooks, tests). Roles are measured once per
checkpoint on test sentences of its language pair (`model_roles`: Multi30k test2016 when it has the pair, else
the current sentence alone, said in the figure's title) and cached; the alignment role needs gold alignments
(RWTH German–English, either direction), else it is left out.
"""

from __future__ import annotations

from pathlib import Path

import panel as pn
import param
from bokeh.layouts import column
from bokeh.models import Div

from ..analysis.alignment.alignment import read_alignments
from ..analysis.alignment.word_align import METHODS
from ..analysis.attribution.sentence_evidence import sentence_evidence
from ..analysis.training_dynamics.formation import gold_aer, model_roles
from ..charts.evidence import alignment_lines, role_grid, source_share_bars
from ..corpus.data import dataset_files, default_data_root
from . import loader
from .learn import link_terms
from .views import LazyTab
from .work import Offloaded, Snapshot

OWN_ALIGNER = "its own aligner"  # its alignment.json (else fairseq's default): what `workbench align` writes
METHOD_LABELS = {OWN_ALIGNER: None, "attention weights": "weights", "value-weighted norms": "norms",
                 "ALTI+ contributions": "alti"}
ROLE_SENTENCES = 60  # test sentences the roles are measured on (a few seconds on one CPU thread)
ROLE_GOLD_PAIRS = 100  # RWTH gold pairs for the alignment role
ROLE_BATCH = 15  # sentences per batch of the role measurement: a closed page stops it within a batch (< 1 s)


def _corpus(src_lang: str, tgt_lang: str) -> tuple[list[str], list[str], str] | None:
    try:
        src, ref = dataset_files("multi30k", "test", src_lang, tgt_lang, download=False)
        s = Path(src).read_text(encoding="utf-8").splitlines()[:ROLE_SENTENCES]
        r = Path(ref).read_text(encoding="utf-8").splitlines()[:ROLE_SENTENCES]
    except (FileNotFoundError, OSError, ValueError):
        return None
    return s, r, f"{len(s)} Multi30k test2016 sentences"


def _gold(src_lang: str, tgt_lang: str):
    rwth = default_data_root() / "alignments" / "rwth-deen"
    if {src_lang, tgt_lang} != {"de", "en"} or not (rwth / "test.talp").is_file():
        return None
    de = (rwth / "test.de").read_text(encoding="utf-8").splitlines()[:ROLE_GOLD_PAIRS]
    en = (rwth / "test.en").read_text(encoding="utf-8").splitlines()[:ROLE_GOLD_PAIRS]
    swap = src_lang == "en"  # the gold file writes the German word first
    links = read_alignments(rwth / "test.talp", base=1, swap=swap)[:ROLE_GOLD_PAIRS]
    return (en, de, links) if swap else (de, en, links)


def _alignment_scores(tm):
    """(per-head AER, diagonal AER, pairs) of a model on the RWTH gold, or None: once per checkpoint and process,
    kept with the model in `loader.CACHE` (evicted with it)."""
    def measure():
        gold = _gold(tm.meta.get("src_lang", ""), tm.meta.get("tgt_lang", ""))
        return None if gold is None else gold_aer(tm, *gold, shift="awi")
    return loader.load_derived("evidence", tm, measure, "gold_aer")


def _corpus_roles(tm, progress=None):
    """The head roles measured on the checkpoint's corpus, or None: once per checkpoint and process (`loader.CACHE`).
    A measurement stopped by `progress` raising caches nothing (the next caller measures)."""
    def measure():
        corpus = _corpus(tm.meta.get("src_lang", ""), tm.meta.get("tgt_lang", ""))
        return None if corpus is None else _roles(tm, corpus[0], corpus[1], corpus[2], progress)
    return loader.load_derived("evidence", tm, measure, "roles")


def _roles(tm, sources, refs, where: str, progress=None):
    scores = _alignment_scores(tm)
    aer = diagonal = None
    if scores is not None:
        aer, diagonal, n = scores
        where += f"; alignment: AER on {n} RWTH gold pairs"
    if progress is not None:
        progress(0, len(sources))  # between the gold AER and the roles: a closed page stops here too
    return model_roles(tm, sources, refs, aer=aer, diagonal_aer=diagonal, progress=progress,
                       batch_size=ROLE_BATCH), where


def checkpoint_roles(tm, source: str, output: str, progress=None):
    """(HeadRoles, where they were measured) of a `TranslationModel`: on test sentences of its language pair,
    measured once per model and process; without such a test set, on (`source`, `output`) alone. `progress(done,
    total)` after each batch of the measurement: a caller stops it by raising from there."""
    found = _corpus_roles(tm, progress)
    return found if found is not None else _roles(tm, [source], [output], "this sentence only (no test set here)",
                                                  progress)


def evidence_figure(tm, source: str, output: str, *, method: str | None = None, roles=None, roles_from: str = ""):
    """The tab's figure: alignment lines (the checkpoint's own aligner, or `method`), source-share bars and (given
    `roles`) the role grids, one column."""
    if method is not None and method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return draw_evidence(sentence_evidence(tm, source, output, method=method), roles, roles_from)


ROLES_STAGE = "measuring the heads' roles (once per checkpoint)"


def evidence(r, method: str | None, with_roles: bool, ticket=None) -> tuple:
    """The tab's work for result `r` (a `work.Snapshot` in a worker process): (SentenceEvidence, HeadRoles or None,
    where the roles were measured), for `draw_evidence`. `method` None: the checkpoint's own aligner."""
    if method is not None and method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    tm = r.model
    roles, where = None, ""
    if with_roles:
        progress = None
        if ticket is not None:
            progress = ticket.report  # each batch: a closed page or a newer request stops it
            progress(0, 0, ROLES_STAGE)
        roles, where = checkpoint_roles(tm, r.request.sentence, r.text, progress)
        if ticket is not None:
            ticket.check()  # a newer sentence or method supersedes this one: stop before the evidence
    return sentence_evidence(tm, r.request.sentence, r.text, method=method), roles, where


def draw_evidence(ev, roles=None, roles_from: str = ""):
    """Alignment lines, source-share bars and (given `roles`) the role grids of a `SentenceEvidence`, one column."""
    lines = alignment_lines(ev.src_words, ev.out_words, ev.weights, links=ev.links, title="word alignment")
    bars = source_share_bars(ev.pieces, ev.shares, title="source share")
    for fig in (lines, bars):  # as wide as the page, however long the sentence (no sideways scrolling)
        fig.sizing_mode, fig.min_width = "stretch_width", 300
    parts = [Div(text=link_terms(f"<b>Word alignment</b>: {ev.spec}; line width = strength, dashed = the argmax "
                                 "links"), css_classes=["evidence-method-label"], sizing_mode="stretch_width"),
             lines,
             Div(text=link_terms("<b>Source share</b> of each output token (ALTI+): the rest comes from the target "
                                 "prefix"), sizing_mode="stretch_width"),
             bars]
    if roles is not None:
        parts.append(Div(text=link_terms(f"<b>Head roles</b>, measured on {roles_from}. A head has a role when: "
                                         + "; ".join(roles.rules.lines(roles.diagonal_aer))),
                         sizing_mode="stretch_width"))
        parts.append(role_grid(roles, stacked=True))  # one grid per kind, under one another: fits a 1000 px page
    return column(*parts, sizing_mode="stretch_width")


class EvidenceView(LazyTab):
    """Alignment, source shares and head roles of the session's current sentence and model."""

    method = param.Selector(default=OWN_ALIGNER, objects=list(METHOD_LABELS), doc=(
        "Where the word links come from: the checkpoint's own aligner, the cross-attention weights, those weights "
        "times the size of what each source word sends (value-weighted norms), or ALTI+ contributions."))
    roles = param.Boolean(default=True, doc=("Also show what each head mostly does (aligns words, attends to the end "
                                             "of the sentence, to the previous word…), measured once per model."))

    title = "Evidence"
    redraws = ("method", "roles")
    url = {"method": "ev", "roles": "evroles"}
    heavy = True  # the request path's heavy lane, where there is one: ALTI+ and the role statistics

    def inputs(self):
        r = self.session.result
        if r is None:
            return "*Nothing to show yet: translate a sentence.*"
        if not r.text.strip():
            return "*The output is empty: nothing to align.*"
        # A snapshot of the result (its model along in this process, none in a worker's): the view never turns a
        # path into a model.
        return Snapshot.of(r), METHOD_LABELS[self.method], self.roles

    compute = Offloaded(evidence)  # heavy: in a worker process when the server has a pool

    def render(self, answer):
        return [pn.pane.Bokeh(draw_evidence(*answer), sizing_mode="stretch_width")]

    def progress(self, done: int, total: int, what: str = "") -> None:
        counted = f": {done} of {total} sentences" if total else ""
        self._box.objects = [pn.pane.Markdown(f"*{what or ROLES_STAGE}{counted}…*")]

    def __panel__(self):
        # A button group and a checkbox draw no "?" of their own (their description is at most a hover title):
        # each gets a tooltip icon with its parameter's sentence, as labelled widgets show theirs.
        controls = pn.Row(
            pn.widgets.RadioButtonGroup.from_param(self.param.method, name="Alignment method",
                                                   css_classes=["evidence-method"]),
            pn.widgets.TooltipIcon(value=self.param.method.doc, css_classes=["evidence-method-help"]),
            pn.widgets.Checkbox.from_param(self.param.roles, name="Head roles", css_classes=["evidence-roles"]),
            pn.widgets.TooltipIcon(value=self.param.roles.doc, css_classes=["evidence-roles-help"]),
        )
        return pn.Column(controls, self._box, sizing_mode="stretch_width")


TAB = ("Evidence", lambda session: EvidenceView(session=session))
"""The tab as `Workbench(extra_tabs=[TAB])` takes it."""

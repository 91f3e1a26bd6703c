"""The app's tabs in one list, `TABS`, in the order the page shows them: it drives the tabs `Workbench` builds (the
built-in ones in every Workbench, the others in the served app through `SERVED_TABS`), the URL's `tab=` values
(each tab's title `slug`ged: "Model analysis" -> model-analysis) and the docs (tests/test_docs_complete.py checks
that docs/app.md has a row for every tab of this list and names every `tab=` value)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .analysis_views import TAB as MODEL_ANALYSIS
from .evidence_view import TAB as EVIDENCE
from .features_view import TAB as FEATURES
from .graph_view import TAB as GRAPH
from .link import slug
from .views import AnalysisView, CompareView, InternalsView
from .why_view import TAB as WHY


@dataclass(frozen=True)
class Tab:
    """One tab: its title, what builds its view from the page's session (None: the Attention tab, the workbench's
    own attention view beside the ablation panel), what it shows in one line, and whether every Workbench has it
    (`built_in`; the others join the served app through `extra_tabs`)."""

    title: str
    factory: Callable | None
    shows: str
    built_in: bool = False

    @property
    def key(self) -> str:
        """Its `tab=` value in the URL."""
        return slug(self.title)


TABS: tuple[Tab, ...] = (
    Tab("Attention", None, "the three attention kinds per layer and head: heatmap, head view, model-view grid; "
        "ablation", built_in=True),
    Tab("Internals", lambda session: InternalsView(session=session),
        "positional encodings, masks, the LR schedule, label smoothing, training curves", built_in=True),
    Tab("Compare", lambda session: CompareView(session=session), "checkpoint B on A's output, B - A",
        built_in=True),
    Tab("Analysis", lambda session: AnalysisView(session=session), "head statistics and decoder rollout of the "
        "sentence's trace", built_in=True),
    Tab(MODEL_ANALYSIS[0], MODEL_ANALYSIS[1], "logit lens, gradient attribution, beam replay, flow, value norms"),
    Tab(WHY[0], WHY[1], "direct logit attribution and patching of one output token"),
    Tab(EVIDENCE[0], EVIDENCE[1], "the sentence's word alignment by method, source shares (ALTI+), head roles"),
    Tab(FEATURES[0], FEATURES[1], "sparse-dictionary features of the sentence, one feature's dashboard, steering"),
    Tab(GRAPH[0], GRAPH[1], "the attribution graph of one output token (tap a node: what it is), exported offline"),
)
BUILT_IN: tuple[Tab, ...] = tuple(t for t in TABS if t.built_in)
SERVED_TABS = [(t.title, t.factory) for t in TABS if not t.built_in]
"""The tabs after the built-in ones, as `Workbench(extra_tabs=...)` takes them (`apps/attention.py`)."""

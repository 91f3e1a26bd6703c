"""The tabs the served app shows after the built-in ones, in order: one list for `apps/attention.py`, the URL's
`tab=` values and the docs (tests/test_docs_complete.py checks docs/app.md against it)."""

from __future__ import annotations

from .analysis_views import TAB as MODEL_ANALYSIS
from .evidence_view import TAB as EVIDENCE
from .features_view import TAB as FEATURES
from .graph_view import TAB as GRAPH
from .why_view import TAB as WHY

# "Model analysis": logit lens, attribution, beam replay, flow, norms. "Why": logit attribution and patching.
# "Evidence": the sentence's word alignment by method, source shares (ALTI+), head roles.
# "Features": sparse-dictionary features of the sentence and one feature's dashboard.
# "Graph": the attribution graph of one output token (tap a node: its attention, its edges), exported offline.
SERVED_TABS = [MODEL_ANALYSIS, WHY, EVIDENCE, FEATURES, GRAPH]

"""The Attention Workbench dashboard: `panel serve apps/attention.py [--args --checkpoints DIR...]`.

Thin on purpose: the per-process model cache and checkpoint discovery live in `workbench.ui.loader`,
the per-session store in `workbench.ui.session`, the model work in `workbench.ui.work`, the views in
`workbench.ui.views`.
"""

import sys

import panel as pn

from workbench.ui import Workbench
from workbench.ui.analysis_views import TAB as MODEL_ANALYSIS
from workbench.ui.evidence_view import TAB as EVIDENCE
from workbench.ui.features_view import TAB as FEATURES
from workbench.ui.graph_view import TAB as GRAPH
from workbench.ui.loader import configure_torch_threads, parse_args
from workbench.ui.why_view import TAB as WHY
from workbench.ui.workbench_app import TITLE

pn.extension("vega", notifications=False)
configure_torch_threads()

# "Model analysis": logit lens, attribution, beam replay, flow, norms. "Why": logit attribution and patching.
# "Evidence": the sentence's word alignment by method, source shares (ALTI+), head roles.
# "Features": sparse-dictionary features of the sentence and one feature's dashboard.
# "Graph": the attribution graph of one output token (tap a node: its attention, its edges), exported offline.
Workbench(checkpoints=parse_args(sys.argv[1:]), extra_tabs=[MODEL_ANALYSIS, WHY, EVIDENCE, FEATURES, GRAPH]).servable(
    title=TITLE)

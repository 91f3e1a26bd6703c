"""The Attention Workbench dashboard: `panel serve apps/attention.py [--args --checkpoints DIR...]`.

Thin on purpose: the per-process model cache and checkpoint discovery live in `workbench.ui.loader`,
the per-session store in `workbench.ui.session`, the model work in `workbench.ui.work`, the views in
`workbench.ui.views`, and the tabs after the built-in ones in `workbench.ui.app_tabs`.
"""

import sys

import panel as pn

from workbench.ui import Workbench
from workbench.ui.app_tabs import SERVED_TABS
from workbench.ui.loader import configure_torch_threads, parse_args
from workbench.ui.workbench_app import TITLE

pn.extension("vega", notifications=False)
configure_torch_threads()

Workbench(checkpoints=parse_args(sys.argv[1:]), extra_tabs=SERVED_TABS).servable(title=TITLE)

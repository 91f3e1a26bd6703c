"""The Attention Workbench dashboard: `panel serve apps/attention.py [--args --checkpoints DIR...]`.

Thin on purpose: the per-process model cache and checkpoint discovery live in `workbench.ui.loader`,
the per-session store in `workbench.ui.session`, the model work in `workbench.ui.work`, the views in
`workbench.ui.views`, and the tabs after the built-in ones in `workbench.ui.app_tabs`.
"""

import sys

import panel as pn
from panel.io.resources import LOCAL_DIST, patch_model_css

from workbench.ui import Workbench
from workbench.ui.app_tabs import SERVED_TABS
from workbench.ui.loader import configure_torch_threads, parse_args
from workbench.ui.workbench_app import TITLE

pn.extension("vega", notifications=False)
configure_torch_threads()


def offline_document(doc) -> None:
    """Every stylesheet of this session's page from the server's own static route, never from Panel's CDN.

    Panel writes its components' stylesheets as CDN URLs and rewrites them to the server's route by the document's
    `dist_url`, which it sets only when it renders the page's HTML (`server_html_page_for_session`). A session
    created by the websocket instead (the page's first session expired before its scripts connected, a slow load on
    a busy machine; or `bokeh.client.pull_session`) never had one: every stylesheet, the loading spinner's first,
    and every component drawn later asked the CDN (an unstyled page offline, requests off the machine). So each
    session's document gets the route before the app is built (its components are patched as they are made) and
    its roots are patched after. Idempotent; no-op when not served."""
    if doc is None:
        return
    doc._template_variables.setdefault("dist_url", LOCAL_DIST)
    for root in doc.roots:
        patch_model_css(root, dist_url=doc._template_variables["dist_url"])


offline_document(pn.state.curdoc)
Workbench(checkpoints=parse_args(sys.argv[1:]), extra_tabs=SERVED_TABS).servable(title=TITLE)
offline_document(pn.state.curdoc)

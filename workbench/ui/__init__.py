"""Panel components of the Attention Workbench: a per-session store, small views, the assembled app.

The model is loaded once per process (`loader`), state lives per session (`session.Session`), and the
views (`views`) are small Viewers over it; `Workbench` puts them together for `panel serve` and notebooks.
"""

from .session import Session
from .workbench_app import Workbench

__all__ = ["Session", "Workbench"]

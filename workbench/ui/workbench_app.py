"""`Workbench`: the whole dashboard as one Viewer, for `panel serve` and for notebooks alike.

    from workbench.ui import Workbench
    Workbench("checkpoints/multi30k").servable()      # a notebook cell or a served script
    Workbench(checkpoints=["runs/"]).attention          # one view on its own

Served (`background=True`, the default under `panel serve`), model work runs in the process's worker
threads and the page shows a spinner; in a notebook without a server it runs inline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

import panel as pn
import param

from . import loader
from .session import Session
from .views import AblationPanel, AnalysisView, AttentionView, CompareView, InternalsView, OutputPanel, SourcePanel

TITLE = "Attention Workbench"
URL_PARAMS = {"checkpoint": "ckpt", "sentence": "src", "target": "tgt", "beam": "beam", "alpha": "alpha",
              "kind": "kind", "layer": "layer", "head": "head", "token": "tok", "words": "words", "view": "view",
              "ablate": "ablate"}
CSS = """
.wb-header h1 { margin: 0 0 2px 0; font-size: 1.5em; }
.wb-header p { margin: 0; color: #555; }
"""


class Workbench(pn.viewable.Viewer):
    """Store + views, assembled. `checkpoint` picks a directory directly (notebooks); `checkpoints`
    adds directories to the discovered list; `sync_url` ties the store to the page's query string."""

    session = param.ClassSelector(class_=Session)

    # More tabs (the analysis views: head statistics, rollout, attribution, beam replay, logit lens) join
    # here without touching this file: Workbench.add_tab("Heads", lambda session: HeadStats(session=session)).
    extra_tabs: ClassVar[list[tuple[str, Callable[[Session], object]]]] = []

    @classmethod
    def add_tab(cls, title: str, factory: Callable[[Session], object]) -> None:
        """Register a tab for every Workbench built afterwards; `factory(session)` returns a Panel object."""
        cls.extra_tabs = [t for t in cls.extra_tabs if t[0] != title] + [(title, factory)]

    def __init__(self, checkpoint: str | Path | None = None, *, checkpoints: Sequence[str | Path] = (),
                 sentence: str | None = None, sync_url: bool | None = None, background: bool | None = None,
                 default_dir: Path | None = loader.DEFAULT_DIR, **params):
        dirs = [*checkpoints, *([checkpoint] if checkpoint is not None else [])]
        entries, problems = loader.discover(dirs, default=default_dir)
        chosen = None
        if checkpoint is not None:
            target = Path(checkpoint).resolve()
            chosen = next((e.label for e in entries if e.path == target), None)
        served = pn.state.curdoc is not None and pn.state.curdoc.session_context is not None
        extra = {"sentence": sentence} if sentence is not None else {}
        session = Session(entries, problems=problems, checkpoint=chosen, autorun=False, **extra)
        super().__init__(session=session, **params)
        if served if sync_url is None else sync_url:
            pn.state.location.sync(session, URL_PARAMS, on_error=self._bad_url)
        session._autorun = True
        session.refresh()  # the first result inline, so the page opens on something real
        session.background = served if background is None else background
        if served:
            pn.state.on_session_destroyed(lambda _ctx: session.close())
        self.source = SourcePanel(session=session)
        self.output = OutputPanel(session=session)
        self.attention = AttentionView(session=session)
        self.ablation = AblationPanel(session=session)
        self.internals = InternalsView(session=session)
        self.compare = CompareView(session=session)
        self.analysis = AnalysisView(session=session)

    def _bad_url(self, values: dict) -> None:
        """Panel applies a link's values all or nothing; apply the good ones one by one, name the bad ones."""
        bad = {}
        for name, value in values.items():
            try:
                setattr(self.session, name, value)
            except Exception:
                bad[URL_PARAMS.get(name, name)] = value
        if bad:
            self.session.notes_once.append("Some settings in the link could not be used and were ignored: "
                                           + ", ".join(f"{k}={v!r}" for k, v in bad.items()))

    def __panel__(self):
        header = pn.pane.Markdown(
            f"# {TITLE}\nType a sentence and see what the translation model attends to. Views: pick a kind, "
            "layer and head; tap a heatmap row to highlight a token; tap a grid tile to select a head to ablate.",
            css_classes=["wb-header"], stylesheets=[CSS], sizing_mode="stretch_width")
        inspect = pn.Row(pn.Column(self.attention, sizing_mode="stretch_width"),
                         pn.Column("### Ablate heads", self.ablation, width=420), sizing_mode="stretch_width")
        extra = [(title, factory(self.session)) for title, factory in self.extra_tabs]
        tabs = pn.Tabs(("Attention", inspect), ("Internals", self.internals), ("Compare", self.compare),
                       ("Analysis", self.analysis), *extra,
                       dynamic=True, css_classes=["main-tabs"], sizing_mode="stretch_width")
        shows = {1: self.internals.show, 2: self.compare.show, 3: self.analysis.show}
        tabs.param.watch(lambda e: shows[e.new]() if e.new in shows else None, "active")
        return pn.Column(header, self.source, self.output, tabs, sizing_mode="stretch_width")

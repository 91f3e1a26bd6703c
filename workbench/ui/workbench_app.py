"""`Workbench`: the whole dashboard as one Viewer, for `panel serve` and for notebooks alike.

    from workbench.ui import Workbench
    Workbench("checkpoints/multi30k").servable()      # a notebook cell or a served script
    Workbench(checkpoints=["runs/"]).attention          # one view on its own
    Workbench(extra_tabs=[("Heads", lambda session: HeadStats(session=session))])   # more tabs

Served (`background=True`, the default under `panel serve`), model work runs in the process's worker
threads and the page shows a spinner; in a notebook without a server it runs inline.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

import panel as pn
import param

from . import loader
from .notebook import ordered_notebook_updates
from .session import Session, first_loadable
from .views import (
    AblationPanel,
    AnalysisView,
    AttentionView,
    CompareView,
    InternalsView,
    LazyTab,
    OutputPanel,
    SourcePanel,
)

TITLE = "Attention Workbench"
URL_PARAMS = {"checkpoint": "ckpt", "sentence": "src", "target": "tgt", "beam": "beam", "alpha": "alpha",
              "kind": "kind", "layer": "layer", "head": "head", "token": "tok", "words": "words", "view": "view",
              "ablate": "ablate"}
# Applied from a link after the first result, when the model's layers and heads and the sentence's tokens are known.
SELECTION = ("kind", "layer", "head", "token", "words", "view", "ablate")
CSS = """
.wb-header h1 { margin: 0 0 2px 0; font-size: 1.5em; }
.wb-header p { margin: 0; color: #555; }
"""

TabFactory = Callable[[Session], object]


class Workbench(pn.viewable.Viewer):
    """Store + views, assembled. `checkpoint` picks a directory directly (notebooks); `checkpoints` adds
    directories to the discovered list; `sync_url` ties the store to the page's query string; `extra_tabs`
    adds (title, factory(session)) tabs after the built-in ones."""

    session = param.ClassSelector(class_=Session)

    def __init__(self, checkpoint: str | Path | None = None, *, checkpoints: Sequence[str | Path] = (),
                 sentence: str | None = None, sync_url: bool | None = None, background: bool | None = None,
                 default_dir: Path | None = loader.DEFAULT_DIR, extra_tabs: Sequence[tuple[str, TabFactory]] = (),
                 **params):
        dirs = [*checkpoints, *([checkpoint] if checkpoint is not None else [])]
        entries, problems = loader.discover(dirs, default=default_dir)
        chosen = None
        if checkpoint is not None:
            target = Path(checkpoint).resolve()
            chosen = next((e.label for e in entries if e.path == target), None)
        served = pn.state.curdoc is not None and pn.state.curdoc.session_context is not None
        if not served:
            ordered_notebook_updates()  # a cell that changes the dashboard right after showing it loses nothing
        extra = {"sentence": sentence} if sentence is not None else {}
        background = served if background is None else background
        session = Session(entries, problems=problems, checkpoint=chosen, autorun=False, background=background,
                          **extra)
        super().__init__(session=session, **params)
        sync = served if sync_url is None else sync_url
        link = _link_values() if sync else {}
        bad = self._apply_link({k: v for k, v in link.items() if k not in SELECTION})
        location = pn.state.location if sync else None
        if location is not None:
            # Written by us, not `location.sync`: that one also re-reads the page's query (the browser reports
            # its URL after loading) and would apply a refused value, such as an ablated head that the model
            # lacks, straight into the store.
            session.param.watch(lambda *events: location.update_query(
                **{URL_PARAMS[e.name]: _serialize(e.new) for e in events}), list(URL_PARAMS))

        def finish_link() -> None:
            """The link's selection, checked against the first result; the refused values named and dropped."""
            refused = bad + self._apply_link({k: v for k, v in link.items() if k in SELECTION})
            if refused:
                note = ("Some settings in the link could not be used and were ignored: "
                        + ", ".join(f"{URL_PARAMS[name]}={raw[:80]}" for name, raw in refused))
                if session.busy:  # the link's ablation is running: the note comes with its answer
                    session.note_next(note)
                else:
                    session.notes = [*session.notes, note]
            if location is not None:
                _drop_from_link(location, [URL_PARAMS[name] for name, _ in refused])

        session.autorun = True
        if session.background:  # served: even the first model load and translation run off the event loop
            pending = [True]

            def first_answer(_event) -> None:  # the first applied answer only
                if pending:
                    pending.clear()
                    finish_link()

            session.param.watch(first_answer, "version")
            if chosen is None and "checkpoint" not in link and session.entries:
                _open_first_loadable(session)
            else:
                session.refresh()
        else:
            session.refresh()  # notebooks: the first result inline, so the cell opens on something real
            finish_link()
        if served:
            pn.state.on_session_destroyed(lambda _ctx: session.close())
        self.source = SourcePanel(session=session)
        self.output = OutputPanel(session=session)
        self.attention = AttentionView(session=session)
        self.ablation = AblationPanel(session=session)
        self.internals = InternalsView(session=session)
        self.compare = CompareView(session=session)
        self.analysis = AnalysisView(session=session)
        self.tabs = [("Attention", None), ("Internals", self.internals), ("Compare", self.compare),
                     ("Analysis", self.analysis), *[(title, factory(session)) for title, factory in extra_tabs]]

    def _apply_link(self, values: dict[str, str]) -> list[tuple[str, str]]:
        """Set each value from the link that the store accepts; return the (name, raw value) of the others."""
        bad = []
        for name, raw in values.items():
            try:
                value = _coerce(self.session.param[name], raw)
                if name == "ablate" and not all(self.session.head_exists(h) for h in value):
                    raise ValueError(f"no such head in {value}")
                setattr(self.session, name, value)
            except Exception:  # any value the store refuses is named in the page, never raised
                bad.append((name, raw))
        return bad

    def __panel__(self):
        header = pn.pane.Markdown(
            f"# {TITLE}\nType a sentence and see what the translation model attends to. Views: pick a kind, "
            "layer and head; tap a heatmap row to highlight a token; tap a grid tile to select a head to ablate.",
            css_classes=["wb-header"], stylesheets=[CSS], sizing_mode="stretch_width")
        # The view takes what the ablation panel leaves; below ~1200 px the panel moves under it (nothing overlaps).
        inspect = pn.FlexBox(pn.Column(self.attention, sizing_mode="stretch_width", min_width=0,
                                       styles={"flex": "1 1 760px", "min-width": "0"}),
                             pn.Column(self.ablation, width=400, styles={"flex": "0 0 400px"}),
                             flex_wrap="wrap", align_items="start", sizing_mode="stretch_width")
        views = [view for _, view in self.tabs]
        tabs = pn.Tabs(*[(title, inspect if view is None else view) for title, view in self.tabs],
                       dynamic=True, css_classes=["main-tabs"], sizing_mode="stretch_width")

        def switched(event) -> None:
            for i, view in enumerate(views):
                if isinstance(view, LazyTab):
                    view.active = i == event.new

        tabs.param.watch(switched, "active")
        return pn.Column(header, self.source, self.output, tabs, sizing_mode="stretch_width")


def _open_first_loadable(session: Session) -> None:
    """Load the default checkpoint in a worker (the page shows busy meanwhile); if it fails, switch to the
    first one that loads. The switch runs the first translation; otherwise it is started here."""
    session.busy = True

    def picked(label: str) -> None:
        if not session.autorun:  # the page closed meanwhile (Session.close)
            return
        if label != session.checkpoint:
            session.checkpoint = label  # its change event runs the model
        else:
            session.refresh()

    session.lane("translate").submit(first_loadable, session.entries, done=picked,
                                     failed=lambda _exc: picked(session.checkpoint))


def _link_values() -> dict[str, str]:
    """The store's values in the page's query string, as raw strings by param name (unknown keys ignored)."""
    by_key = {key: name for name, key in URL_PARAMS.items()}
    query = parse_qsl((pn.state.location.search or "").lstrip("?"), keep_blank_values=True)
    return {by_key[k]: v for k, v in query if k in by_key}


def _drop_from_link(location, keys: list[str]) -> None:
    if keys:
        kept = [(k, v) for k, v in parse_qsl((location.search or "").lstrip("?"), keep_blank_values=True)
                if k not in keys]
        location.search = "?" + urlencode(kept) if kept else ""


def _serialize(value) -> str:
    """A store value as the query string carries it (what `_coerce` reads back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return json.dumps(value)
    return "" if value is None else str(value)


def _coerce(p: param.Parameter, raw: str):
    """A query-string value as the parameter's type; ValueError when it is not one (the param checks the range)."""
    if isinstance(p, param.Boolean):
        if raw.lower() not in ("true", "false"):
            raise ValueError(raw)
        return raw.lower() == "true"
    if isinstance(p, param.Integer):
        return int(raw)
    if isinstance(p, param.Number):
        value = float(raw)
        if not math.isfinite(value):
            raise ValueError(raw)
        return value
    if isinstance(p, param.List):
        value = json.loads(raw)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(raw)
        return value
    if isinstance(p, param.Selector):
        for value in p.objects:
            if str(value) == raw:
                return value
        raise ValueError(raw)
    return raw

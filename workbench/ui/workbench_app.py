"""`Workbench`: the whole dashboard as one Viewer, for `panel serve` and for notebooks alike.

    from workbench.ui import Workbench
    Workbench("checkpoints/multi30k").servable()      # a notebook cell or a served script
    Workbench(checkpoints=["runs/"]).attention          # one view on its own
    Workbench(extra_tabs=[("Heads", lambda session: HeadStats(session=session))])   # more tabs

Served (`background=True`, the default under `panel serve`), model work runs in the process's worker
threads and the page shows a spinner; in a notebook without a server it runs inline.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Sequence
from pathlib import Path

import panel as pn
import param
from bokeh.events import ConnectionLost

from . import loader
from .app_tabs import BUILT_IN
from .learn import Step, link_terms, start_here
from .link import Link, slug
from .notebook import ordered_notebook_updates
from .session import Session, first_loadable
from .views import AblationPanel, AttentionView, LazyTab, OutputPanel, SourcePanel
from .work import HINT_WAIT_S, Result, pending_hints

TITLE = "Attention Workbench"
# The store's URL keys, in the order the query lists them (link.py writes and reads them; docs/app.md lists all keys).
URL_KEYS = {"checkpoint": "ckpt", "sentence": "src", "target": "tgt", "beam": "beam", "alpha": "alpha",
              "kind": "kind", "layer": "layer", "head": "head", "token": "tok", "words": "words", "view": "view",
            "ablate": "ablate"}
# Applied from a link after the first result, when the model's layers and heads and the sentence's tokens are known.
SELECTION = ("kind", "layer", "head", "token", "words", "view", "ablate")
CSS = """
.wb-header h1 { margin: 0 0 2px 0; font-size: 1.5em; }
.wb-header p { margin: 0; color: #555; }
"""

TabFactory = Callable[[Session], object]


def stop_work_when_the_page_goes(doc, session: Session) -> None:
    """Stop the page's jobs as soon as its websocket closes (Bokeh's `ConnectionLost` document event): the session
    itself is destroyed (`Session.close`) only after Bokeh's unused-session lifetime, seconds later, and a closed
    page's exact sweep or graph would run on until then."""
    if doc is not None:
        doc.on_event(ConnectionLost, lambda _event: session.requests.stop_all())


def hint_when_measured(session: Session) -> None:
    """An answer made while its checkpoint's yardstick was being measured (a checkpoint's first, in practice) gets
    its wrong-language hint when the yardstick arrives (`work.pending_hints`), if it is still the answer shown.

    Served, the hint is asked for only once the yardstick is there (`loader.on_familiarity`, from the measuring
    thread back onto the page's loop), so no interactive worker waits for it: eight pages opening at once on a
    checkpoint not measured yet would otherwise hold both workers and queue every page's translation behind.
    Inline (a notebook), the cell waits for it."""

    def follow(event) -> None:
        r: Result | None = event.new
        if r is None or not r.hints_pending or r.model is None:
            return
        lane = session.lane("hints")

        def add(hints: list[str]) -> None:
            new = [h for h in hints if h not in session.notes]
            if session.result is r and new:
                session.notes = [*session.notes, *new]

        if not session.requests.background:
            lane.submit(pending_hints, r, HINT_WAIT_S, done=add)
            return
        loop, ctx = asyncio.get_running_loop(), contextvars.copy_context()  # the page's loop and document
        loader.on_familiarity(str(r.request.path), r.model, lambda: loop.call_soon_threadsafe(
            lambda: lane.submit(pending_hints, r, done=add), context=ctx))

    session.param.watch(follow, "result")


class Workbench(pn.viewable.Viewer):
    """Store + views, assembled. `checkpoint` picks a directory directly (notebooks); `checkpoints` adds
    directories to the discovered list; `sync_url` ties the store to the page's query string; `extra_tabs`
    adds (title, factory(session)) tabs after the built-in ones."""

    session = param.ClassSelector(class_=Session)
    tab = param.Selector(default="attention", objects=["attention"],
                         doc="The tab shown: Attention, Compare, Analysis, Why, Graph and the others, in page order.")

    def __init__(self, checkpoint: str | Path | None = None, *, checkpoints: Sequence[str | Path] = (),
                 sentence: str | None = None, sync_url: bool | None = None, background: bool | None = None,
                 default_dir: Path | None = loader.DEFAULT_DIR, extra_tabs: Sequence[tuple[str, TabFactory]] = (),
                 **params):
        served = pn.state.curdoc is not None and pn.state.curdoc.session_context is not None
        if not served:
            ordered_notebook_updates()  # a cell that changes the dashboard right after showing it loses nothing
        session, chosen = _open_session(checkpoint, checkpoints, sentence, served if background is None else background,
                                        default_dir)
        super().__init__(session=session, **params)
        sync = served if sync_url is None else sync_url
        self.link = link = Link.of_page() if sync else Link()
        named_checkpoint = "ckpt" in link.values
        for name, key in URL_KEYS.items():
            link.bind(key, session, name, late=name in SELECTION,
                      check=_ablation_check(session) if name == "ablate" else None)
        self._build_views(extra_tabs)
        link.bind("tab", self, "tab")
        self._show_tab()
        for _, view in self.tabs:
            if isinstance(view, LazyTab):
                view.bind_link(link)
        session.param.watch(lambda _e: link.write(), "version")  # changes made without events (discard_events)
        hint_when_measured(session)
        self._first_answer(open_first=chosen is None and not named_checkpoint)
        if served:
            pn.state.on_session_destroyed(lambda _ctx: session.close())
            stop_work_when_the_page_goes(pn.state.curdoc, session)

    def _build_views(self, extra_tabs: Sequence[tuple[str, TabFactory]]) -> None:
        """The panels and the tabs: app_tabs.TABS' built-in ones (None: the Attention tab, built in `__panel__`),
        then `extra_tabs`."""
        session = self.session
        self.source = SourcePanel(session=session)
        self.output = OutputPanel(session=session)
        self.attention = AttentionView(session=session)
        self.ablation = AblationPanel(session=session)
        self.tabs = [(t.title, None if t.factory is None else t.factory(session)) for t in BUILT_IN]
        self.tabs += [(title, factory(session)) for title, factory in extra_tabs]
        built = dict(self.tabs)
        self.internals, self.compare, self.analysis = built["Internals"], built["Compare"], built["Analysis"]
        self.param.tab.objects = [slug(title) for title, _ in self.tabs]

    def _finish_link(self) -> None:
        """The link's late values, checked against the first result; what was refused named in one message."""
        note = self.link.finish()
        if note:
            if self.session.busy:  # the link's ablation is running: the note comes with its answer
                self.session.note_next(note)
            else:
                self.session.notes = [*self.session.notes, note]

    def _first_answer(self, *, open_first: bool) -> None:
        """Turn autorun on and get the first result, then finish the link. Served, off the event loop (the link
        finished on the first applied answer; `open_first`: open the first loadable checkpoint, none being
        named); in a notebook inline, so the cell opens on something real."""
        session = self.session
        session.autorun = True
        if session.background:  # served: even the first model load and translation run off the event loop
            pending = [True]

            def first_answer(_event) -> None:  # the first applied answer only
                if pending:
                    pending.clear()
                    self._finish_link()

            session.param.watch(first_answer, "version")
            if open_first and session.entries:
                _open_first_loadable(session)
            else:
                session.refresh()
        else:
            session.refresh()
            self._finish_link()

    @param.depends("tab", watch=True)
    def _show_tab(self) -> None:
        """Only the tab on screen works (`LazyTab.active`); a link's `tab=` opens its tab like a click."""
        for title, view in getattr(self, "tabs", []):
            if isinstance(view, LazyTab):
                view.active = slug(title) == self.tab

    def open_step(self, step: Step) -> None:
        """The tour's "Show me": open the step's tab, and its attention kind where it names one."""
        if step.kind is not None:
            self.session.kind = step.kind
        if step.tab in self.param.tab.objects:
            self.tab = step.tab

    def __panel__(self):
        header = pn.pane.Markdown(
            f"# {TITLE}\n" + link_terms("Type a sentence and see what the translation model attends to. Views: pick "
                                          "a kind, layer and head; tap a heatmap row to highlight a token; tap a grid "
                                          "tile to select a head to ablate."),
            css_classes=["wb-header"], stylesheets=[CSS], sizing_mode="stretch_width")
        # The view takes what the ablation panel leaves; below ~1200 px the panel moves under it (nothing overlaps).
        inspect = pn.FlexBox(pn.Column(self.attention, sizing_mode="stretch_width", min_width=0,
                                       styles={"flex": "1 1 760px", "min-width": "0"}),
                             pn.Column(self.ablation, width=400, styles={"flex": "0 0 400px"}),
                             flex_wrap="wrap", align_items="start", sizing_mode="stretch_width")
        names = list(self.param.tab.objects)
        tabs = pn.Tabs(*[(title, inspect if view is None else view) for title, view in self.tabs],
                       active=names.index(self.tab), dynamic=True, css_classes=["main-tabs"],
                       sizing_mode="stretch_width")
        tabs.param.watch(lambda e: setattr(self, "tab", names[e.new]), "active")
        self.param.watch(lambda e: setattr(tabs, "active", names.index(e.new)), "tab")
        return pn.Column(header, start_here(self.open_step), self.source, self.output, tabs,
                         sizing_mode="stretch_width")


def _open_session(checkpoint, checkpoints: Sequence[str | Path], sentence: str | None, background: bool,
                  default_dir: Path | None) -> tuple[Session, str | None]:
    """The store over the discovered checkpoints, autorun off until the views are bound, and the label of
    `checkpoint` among them (None: not given, or not found)."""
    dirs = [*checkpoints, *([checkpoint] if checkpoint is not None else [])]
    entries, problems = loader.discover(dirs, default=default_dir)
    chosen = None
    if checkpoint is not None:
        target = Path(checkpoint).resolve()
        chosen = next((e.label for e in entries if e.path == target), None)
    extra = {"sentence": sentence} if sentence is not None else {}
    session = Session(entries, problems=problems, checkpoint=chosen, autorun=False, background=background, **extra)
    return session, chosen


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


def _ablation_check(session: Session):
    """The link's ablated heads that the first result's model has, each once; the others are refused one by one
    (a head given twice is kept once and its repeat named, so the URL written back is the page's state)."""
    def check(heads: list[str]) -> tuple[list[str], list[str]]:
        kept: list[str] = []
        refused: list[str] = []
        for h in heads:
            if h in kept:
                refused.append(f"{h} (given twice)")
            elif session.head_exists(h):
                kept.append(h)
            else:
                refused.append(h)
        return kept, refused
    return check

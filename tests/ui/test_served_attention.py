"""The Attention tab in a served document: a Bokeh server in the test's own event loop, no browser.

Panel applies a widget change in a Bokeh callback that holds the document's lock, except when a click arrives
within the change's debounce (50 ms): the click's handler then applies the pending change first, in a callback
that runs without the lock (Panel's `async_execute` schedules it `nolock`; Panel's own models write to the page
through `pn.io.unlocked`). A Bokeh model changed directly there made the server raise "_pending_writes should be
non-None when we have a document lock" (CI, stop 43: a head pick, then the Ablate button at once). The test sends
the page's two messages as Bokeh's patch handler would (the change, then the click, in one locked callback), so
the click always finds the change pending.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import time
from pathlib import Path

import numpy as np
import panel as pn
import pytest
from bokeh.events import ButtonClick
from bokeh.models import Button as BokehButton
from bokeh.models import Select as BokehSelect
from panel.io.server import get_server
from tornado.httpclient import AsyncHTTPClient

sys.path.insert(0, str(Path(__file__).parent))

from workbench.charts.heatmap import IMAGE_NAME  # noqa: E402
from workbench.ui.session import Session  # noqa: E402
from workbench.ui.views import AttentionView  # noqa: E402

SENTENCE = "Ein Hund läuft durch den Park."
WAIT_S = 60  # a bound on waiting for the server's callbacks, not a timing


@pytest.fixture
def callback_errors():
    """Exceptions raised in the server's Panel callbacks (Panel hands them to `config.exception_handler`)."""
    errors: list[BaseException] = []
    before = pn.config.exception_handler
    pn.config.exception_handler = errors.append
    yield errors
    pn.config.exception_handler = before


async def _serve(app, pages: list[dict], actions) -> None:
    """Serve `app(pages)` on a free port of this loop, open two sessions of it (an HTTP request each, as two users'
    first requests; `app` records each page in `pages`), run `actions(pages)`, stop the server."""
    server = get_server({"/app": lambda: app(pages)}, port=0, address="127.0.0.1", start=False)
    server.start()
    try:
        client = AsyncHTTPClient()
        for _ in range(2):  # two sessions of the page, as two users
            response = await client.fetch(f"http://127.0.0.1:{server.port}/app")
            assert response.code == 200
        await actions(pages)
    finally:
        server.stop()


def _attention_page(entries):
    def app(pages: list[dict]):
        session = Session(entries, checkpoint="alpha", sentence=SENTENCE)
        view = AttentionView(session=session)
        click = pn.widgets.Button(label="Any button", css_classes=["any-button"])  # e.g. Ablate
        pages.append({"doc": pn.state.curdoc, "session": session, "view": view})
        return pn.Column(view, click)

    return app


def _pick_head(doc, label: str, click: bool) -> None:
    """What Bokeh's patch handler does with a page's messages "head picker = label" and, if `click`, "button
    clicked" right after it."""
    picker = doc.select_one({"type": BokehSelect, "title": "Head"})
    picker.value = label
    if click:
        doc.callbacks.trigger_event(ButtonClick(doc.select_one({"type": BokehButton})))


async def _until(condition, errors) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition() and not errors:
        assert time.monotonic() < deadline, "the server never applied the change"
        await asyncio.sleep(0.01)


def _shows(view, fresh) -> bool:
    """Whether the view's shown figure has the title and the image values of `fresh` (a newly built figure)."""
    def image(fig):
        return np.asarray(fig.select_one({"name": IMAGE_NAME}).data_source.data["image"][0])

    return view.figure.title.text == fresh.title.text and np.array_equal(image(view.figure), image(fresh),
                                                                          equal_nan=True)


def _run(coroutine_fn) -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a loop of its own, whatever pytest runs in
        pool.submit(asyncio.run, coroutine_fn()).result(timeout=3 * WAIT_S)


@pytest.mark.parametrize("click", [True, False], ids=["click-at-once", "pick-alone"])
def test_a_head_pick_changes_the_shown_heatmap_in_each_page(entries, callback_errors, click):
    """Two pages pick heads, and click at once (each pick then applied without the document's lock) or not (applied
    under it): each shows its own pick's heatmap, equal to a freshly built one, in the figure it showed (changed in
    place), and no callback fails."""
    picks = {0: ("head 1", 1), 1: ("head 2", 2)}

    async def actions(pages):
        for page in pages:
            page["shown"] = page["view"].figure
        for i, page in enumerate(pages):
            page["doc"].add_next_tick_callback(lambda doc=page["doc"], label=picks[i][0]: _pick_head(doc, label, click))

        def applied(page, head):
            return page["session"].head == head and _shows(page["view"], page["view"].build(page["session"].result))

        for i, page in enumerate(pages):
            await _until(lambda page=page, head=picks[i][1]: applied(page, head), callback_errors)

    pages: list[dict] = []
    _run(lambda: _serve(_attention_page(entries), pages, actions))
    assert callback_errors == []
    assert len(pages) == 2 and pages[0]["view"].figure is not pages[1]["view"].figure
    for i, page in enumerate(pages):
        assert f"head {picks[i][1]}" in page["view"].figure.title.text
        assert page["view"].figure is page["shown"]  # changed in place: one data source for the page to update

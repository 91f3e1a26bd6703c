"""The request path in Chromium: every fresh load draws, links set the widgets, no user stalls another.

Issue 28: about 1 load in 10 showed the translation and then "No attention to show yet." forever; a link's
selection drew one head while the pickers named another; a Why sweep on a long sentence stalled another
user's translation for minutes.
"""

from __future__ import annotations

from test_app import FIGURE_JS, open_app


def test_thirty_fresh_loads_each_draw_the_attention_view(browser, app_server):
    ctx = browser.new_context()
    for i in range(30):
        page = ctx.new_page()
        open_app(page, app_server)  # the default checkpoint, as a new user opens it
        page.wait_for_function(f"({FIGURE_JS})() !== null", timeout=20_000)
        assert page.get_by_text("No attention to show yet").count() == 0, i
        page.close()
    ctx.close()

"""Server settings the app needs, run once before `panel serve` starts (`--setup apps/serve_setup.py`).

Links carry the sentence, so a link may be long. Tornado refuses a request whose headers pass 64 KB by closing
the connection (the browser shows an empty response); here the limit is 4 MB, and the app itself cuts the
sentence to `work.MAX_CHARS` with a message. (`panel serve` has no option for it.) With `WORKBENCH_STALL_LOG` set, a
watchdog writes the stacks of the server's threads whenever its event loop stalls (workbench.ui.stall_watch).
"""

import asyncio
import os

from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop

from workbench.ui.stall_watch import StallWatch

MAX_HEADER_BYTES = 4 * 1024 * 1024
_initialize = HTTPServer.initialize


def _initialize_with_room(self, *args, **kwargs):
    kwargs["max_header_size"] = max(kwargs.get("max_header_size") or 0, MAX_HEADER_BYTES)
    return _initialize(self, *args, **kwargs)


HTTPServer.initialize = _initialize_with_room


def _watch_stalls() -> None:
    """`WORKBENCH_STALL_LOG=PATH`: write the server's thread stacks whenever its event loop stalls
    (workbench.ui.stall_watch; `WORKBENCH_STALL_S`, default 0.5 s, is the stall's threshold)."""
    path = os.environ.get("WORKBENCH_STALL_LOG")
    if not path:
        return
    watch = StallWatch(path, float(os.environ.get("WORKBENCH_STALL_S", "0.5")))
    # runs once the server's loop runs: tornado's current IOLoop of this (main) thread is the one it serves on
    IOLoop.current().add_callback(lambda: watch.start(asyncio.get_running_loop()))


_watch_stalls()

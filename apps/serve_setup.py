"""Server settings the app needs, run once before `panel serve` starts (`--setup apps/serve_setup.py`).

Links carry the sentence, so a link may be long. Tornado refuses a request whose headers pass 64 KB by closing
the connection (the browser shows an empty response); here the limit is 4 MB, and the app itself cuts the
sentence to `work.MAX_CHARS` with a message. (`panel serve` has no option for it.)
"""

from tornado.httpserver import HTTPServer

MAX_HEADER_BYTES = 4 * 1024 * 1024
_initialize = HTTPServer.initialize


def _initialize_with_room(self, *args, **kwargs):
    kwargs["max_header_size"] = max(kwargs.get("max_header_size") or 0, MAX_HEADER_BYTES)
    return _initialize(self, *args, **kwargs)


HTTPServer.initialize = _initialize_with_room

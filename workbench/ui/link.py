"""The page's URL, in one place (issue 37, "the link is the page"): a link is read once when the page opens, and
from the first answer on the whole query is written from the state, every key in one spelling.

    link = Link.of_page()                       # the page's query (empty in a notebook)
    link.bind("head", session, "head", late=True)   # read the link's `head` (after the first answer), write it back
    link.finish()                               # the first answer came: late values, the one message, the first write

Spelling (what `encode` writes; `decode` also reads the old spellings of links already shared):

| value | written | also read |
| --- | --- | --- |
| integer | `2`, `-1` | `-1.0`, `2.0`, `1e1` (Panel's `update_query` re-printed `-1` as `-1.0`) |
| number | `0.8`, `1`, `1e-05` (Python's shortest exact spelling) | what `float()` reads, except nan and inf |
| boolean | `true`, `false` | any case (`True`) |
| list of names | comma-separated: `cross:0:2,enc_self:1:0` (empty: ``) | `["cross:0:2"]`, `['cross:0:2']` |
| text, choice | as is (urlencode escapes it) | |

Why one writer. Panel's `location.update_query(key=value)` parses the *other* keys of the current query with its
own rules and prints them back (`["a"]` became `['a']`, `-1` `-1.0`, `true` `True`), so every change re-spelled
the link and a copied one no longer opened: here the query string is built with `urllib.parse.urlencode` from the
bound params and set whole (`location.search = "?..."`); nothing else in the app touches `location`.

Why write everything, in a fixed order. A link then means the same page even after a default changes, and two
links to the same page are the same string. Keys whose value is None are left out (nothing to say).

Why only after the first answer. Until then the layer, head and token pickers have no choices (they follow the
model and the sentence), so the link's values wait, and a write would lose them. The browser also reports its own
URL once its page is built (Panel's `LocationView.initialize`); a report that differs from what was written is
answered with the state again (`_reported`).

Refused values (a head the model lacks, `beam=1e20`, an unknown key, a refused or repeated entry of `ablate`, the
earlier values of a repeated key) are collected
and named in one message (`finish` returns it), and leave the URL with the next write.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

import panel as pn
import param

MESSAGE = "Some settings in the link could not be used and were ignored: "
SHOWN = 80  # characters of a refused value named in the message
LITERAL_MAX = 10_000  # longer bracketed lists are not given to the Python parser (an old spelling; JSON is tried first)


def encode(value: Any) -> str | None:
    """The query-string spelling of a param value (None: left out of the query)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)  # the shortest spelling that reads back as the same float
        return text[:-2] if text.endswith(".0") else text
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def decode(p: param.Parameter, raw: str) -> Any:
    """A query-string value as parameter `p`'s type (new and old spellings); ValueError when it is not one. The
    param itself then checks bounds and choices when the value is set."""
    if isinstance(p, param.Boolean):
        if raw.strip().lower() not in ("true", "false"):
            raise ValueError(raw)
        return raw.strip().lower() == "true"
    if isinstance(p, param.Integer):
        return decode_int(raw)
    if isinstance(p, param.Number):
        value = float(raw)
        if not math.isfinite(value):
            raise ValueError(raw)
        return value
    if isinstance(p, param.List):
        return decode_list(raw)
    if isinstance(p, param.Selector):
        objects = list(p.objects.values()) if isinstance(p.objects, dict) else list(p.objects)
        if objects and all(isinstance(v, int) and not isinstance(v, bool) for v in objects):
            value = decode_int(raw)
            if value in objects:
                return value
            raise ValueError(raw)
        for value in objects:
            if encode(value) == raw:
                return value
        raise ValueError(raw)
    if isinstance(p, param.String):
        return raw
    raise TypeError(f"no URL spelling for {type(p).__name__} parameters")


def decode_int(raw: str) -> int:
    """`2`; also `-1.0` and `1e1` (integral values only, below 2**53 so the float is exact)."""
    text = raw.strip()
    try:
        return int(text)
    except ValueError:
        pass
    value = float(text)  # ValueError for anything else
    if not math.isfinite(value) or not value.is_integer() or abs(value) >= 2**53:
        raise ValueError(raw)
    return int(value)


def decode_list(raw: str) -> list[str]:
    """`a,b`; also `["a", "b"]` (JSON) and `['a', 'b']` (Python literal); `` is the empty list."""
    text = raw.strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            if len(text) > LITERAL_MAX:
                raise ValueError(raw[:SHOWN]) from None
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
                raise ValueError(raw[:SHOWN]) from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(raw[:SHOWN])
        return [v.strip() for v in value]
    return [v.strip() for v in text.split(",") if v.strip()]


def parse(query: str) -> dict[str, str]:
    """The query's values by key (`?` optional; the last of a repeated key wins: `repeated` names the others)."""
    return dict(parse_qsl(query.lstrip("?"), keep_blank_values=True))


def repeated(query: str) -> list[str]:
    """`key=value` for each value of a repeated key that `parse` drops (all but its last)."""
    pairs = parse_qsl(query.lstrip("?"), keep_blank_values=True)
    last = {k: i for i, (k, _) in enumerate(pairs)}
    return [f"{k}={v[:SHOWN]}" for i, (k, v) in enumerate(pairs) if last[k] != i]


@dataclass
class Field:
    """One URL key bound to a param. `late`: read after the first answer (its choices follow the result).
    `check(value)`: the value kept (or raise ValueError) and the refused parts of it as text (e.g. ablated heads
    the model lacks). `empty_unset`: an empty value in a link means "not given" (e.g. a prefilled text)."""

    key: str
    obj: param.Parameterized
    name: str
    late: bool = False
    check: Callable[[Any], tuple[Any, list[str]]] | None = None
    empty_unset: bool = False

    def query_value(self) -> str | None:
        return encode(getattr(self.obj, self.name))


class Link:
    """The link the page was opened with and the URL written from its state (see the module docstring)."""

    def __init__(self, query: str = "", location=None):
        self.values = parse(query)
        self.location = location
        self.fields: list[Field] = []
        self.refused: list[str] = [f"{r} (the key is repeated: its last value is used)" for r in repeated(query)]
        self.ready = False  # the first answer came: late values applied, writes on
        self._written: str | None = None
        if location is not None:
            location.param.watch(self._reported, "search")

    @classmethod
    def of_page(cls) -> Link:
        """The served page's link (bound to its `pn.state.location`); outside a served page, an empty one."""
        location = pn.state.location
        served = pn.state.curdoc is not None and pn.state.curdoc.session_context is not None
        if location is None or not served:
            return cls()
        return cls(location.search or "", location)

    # -- reading ------------------------------------------------------------------------------------
    def bind(self, key: str, obj: param.Parameterized, name: str, *, late: bool = False,
             check: Callable[[Any], tuple[Any, list[str]]] | None = None, empty_unset: bool = False) -> None:
        """Tie URL `key` to `obj.name`: the link's value is set now (or, `late`, at `finish`), and every change
        of the param rewrites the query."""
        if any(f.key == key for f in self.fields):
            raise ValueError(f"URL key {key!r} is bound twice")
        field = Field(key, obj, name, late, check, empty_unset)
        self.fields.append(field)
        if not late or self.ready:
            self._take(field)
        obj.param.watch(lambda *_: self.write(), [name])

    def _take(self, field: Field) -> None:
        raw = self.values.pop(field.key, None)
        if raw is None or (field.empty_unset and not raw.strip()):
            return
        p = field.obj.param[field.name]
        try:
            value = decode(p, raw)
            parts: list[str] = []
            if field.check is not None:
                value, parts = field.check(value)
            setattr(field.obj, field.name, value)
        except Exception:  # any value the page refuses is named in it, never raised
            self.refused.append(f"{field.key}={raw[:SHOWN]}")
            return
        self.refused += [f"{field.key}={part[:SHOWN]}" for part in parts]

    def finish(self) -> str:
        """The first answer is here: apply the late values, name what was refused (also keys nothing reads), write
        the query. Returns the one message ('' when everything was used)."""
        if self.ready:
            return ""
        self.ready = True
        for field in self.fields:
            if field.late:
                self._take(field)
        self.refused += [f"{key}={raw[:SHOWN]}" for key, raw in self.values.items()]
        self.values = {}
        self.write()
        refused, self.refused = self.refused, []
        return MESSAGE + ", ".join(refused) if refused else ""

    # -- writing ------------------------------------------------------------------------------------
    def query(self) -> str:
        """The state as a query string (no `?`), every bound key in bind order."""
        pairs = [(f.key, v) for f in self.fields if (v := f.query_value()) is not None]
        return urlencode(pairs)

    def href(self, **values: Any) -> str:
        """A link to this page with some keys changed (`href(feature=7)`): the state's query, those values in the
        same spelling, as a relative URL (`?...`)."""
        pairs = [(f.key, encode(values[f.key]) if f.key in values else f.query_value()) for f in self.fields]
        return "?" + urlencode([(k, v) for k, v in pairs if v is not None])

    def write(self) -> None:
        """Set the page's URL to the state (after the first answer; a no-op outside a served page)."""
        if not self.ready or self.location is None:
            return
        search = "?" + self.query()
        self._written = search
        if self.location.search != search:
            self.location.search = search

    def _reported(self, event) -> None:
        """The browser reported a URL other than the one written (its first report can come after the first
        write): write the state again, on the next tick (a value set inside the report's own event would not be
        sent back to the browser)."""
        if self._written is None or event.new == self._written:
            return
        doc = pn.state.curdoc
        if doc is not None and doc.session_context is not None:
            doc.add_next_tick_callback(self.write)
        else:
            self.write()


def slug(title: str) -> str:
    """A tab's title as its `tab=` value: lower case, spaces as dashes ("Model analysis" -> model-analysis)."""
    return "-".join(title.lower().split())

"""The URL helper (`workbench.ui.link`) without a browser: one spelling per value, old spellings still read, hostile
values refused or carried exactly, and a whole page (every bound control, random seeded values) survives the trip
through its own query string into a second page."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import param
import pytest
from panel.io.location import Location

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint  # noqa: E402

from workbench.ui import workbench_app  # noqa: E402
from workbench.ui.analysis_views import TAB as MODEL_ANALYSIS  # noqa: E402
from workbench.ui.evidence_view import TAB as EVIDENCE  # noqa: E402
from workbench.ui.features_view import TAB as FEATURES  # noqa: E402
from workbench.ui.graph_view import TAB as GRAPH  # noqa: E402
from workbench.ui.link import MESSAGE, Link, decode, encode, parse, slug  # noqa: E402
from workbench.ui.why_view import TAB as WHY  # noqa: E402

HOSTILE_TEXT = [
    "Ein Hund läuft 🐕 — «schnell»",
    "كلب يجري في الحديقة",
    "a&b=c#d?e%20f+g;h",
    "<script>alert(1)</script>' OR 1=1 --",
    "line\nbreak\ttab\x00nul\u202eright-to-left",
    "x" * 100_000,
    "",
]


class P(param.Parameterized):
    flag = param.Boolean(default=False)
    count = param.Integer(default=1, bounds=(1, 10))
    share = param.Number(default=0.8, bounds=(0.0, 1.0))
    heads = param.List(default=[], item_type=str)
    text = param.String(default="")
    choice = param.Selector(default=-1, objects={"all": -1, "one": 1, "two": 2})
    word = param.Selector(default="heatmap", objects=["heatmap", "lines", "grid"])


@pytest.mark.parametrize("name, value, spelled", [
    ("flag", True, "true"), ("flag", False, "false"), ("count", 7, "7"), ("share", 0.8, "0.8"),
    ("share", 1.0, "1"), ("share", 0.05, "0.05"), ("heads", ["cross:0:2", "enc_self:1:3"], "cross:0:2,enc_self:1:3"),
    ("heads", [], ""), ("choice", -1, "-1"), ("word", "lines", "lines"),
])
def test_each_value_has_one_spelling_and_reads_back(name, value, spelled):
    assert encode(value) == spelled
    assert decode(P.param[name], spelled) == value


@pytest.mark.parametrize("name, old, value", [
    ("choice", "-1.0", -1), ("choice", "2.0", 2), ("count", "1e1", 10), ("flag", "True", True),
    ("flag", "FALSE", False),
    ("heads", "['cross:0:2']", ["cross:0:2"]), ("heads", '["cross:0:2"]', ["cross:0:2"]),
    ("heads", '["cross:0:2", "dec_self:1:0"]', ["cross:0:2", "dec_self:1:0"]), ("heads", "[]", []),
    ("share", "8e-1", 0.8),
])
def test_links_shared_in_the_old_spellings_still_read(name, old, value):
    """Panel's `update_query` re-printed every other value: `-1` as `-1.0`, `true` as `True`, `["a"]` as `['a']`."""
    assert decode(P.param[name], old) == value


@pytest.mark.parametrize("name, raw", [
    ("count", "abc"), ("count", "1.5"), ("count", "1" * 5000), ("count", "1e400"), ("count", "nan"), ("count", ""),
    ("share", "nan"), ("share", "inf"), ("share", "-inf"), ("share", "1e400"), ("share", "0x10"),
    ("flag", "yes"), ("flag", "1"), ("choice", "3"), ("choice", "all"), ("word", "<script>"), ("word", "Lines"),
    ("heads", "[1, 2]"), ("heads", "[" * 50_000), ("heads", "['a'" + ", 'a'" * 5000), ("heads", "[__import__('os')]"),
])
def test_values_of_the_wrong_type_are_refused(name, raw):
    with pytest.raises(ValueError):
        decode(P.param[name], raw)


def test_injection_looking_list_text_is_only_names():
    """A comma-separated list is split, never evaluated: whatever the names say, they stay text (the store then
    refuses heads it does not have)."""
    assert decode(P.param.heads, "__import__('os'),x") == ["__import__('os')", "x"]
    assert decode(P.param.heads, "{'a': 1}") == ["{'a': 1}"]


@pytest.mark.parametrize("text", HOSTILE_TEXT)
def test_text_is_carried_exactly(text):
    p = P(text=text)
    link = Link()
    link.bind("t", p, "text")
    link.bind("n", p, "count")
    back = parse("?" + link.query())
    assert back["t"] == text and back["n"] == "1"
    q = P()
    again = Link("?" + link.query())
    again.bind("t", q, "text")
    again.bind("n", q, "count")
    assert q.text == text and again.finish() == ""


def test_refused_values_and_unknown_keys_are_named_once_and_leave_the_url():
    p = P()
    location = Location(search="?n=100000000000000000000&flag=True&c=-1.0&w=%3Cb%3E&utm=x&heads=a,b,c")
    link = Link(location.search, location)

    def only_known(heads):
        return [h for h in heads if h != "b"], [h for h in heads if h == "b"]

    link.bind("n", p, "count")
    link.bind("flag", p, "flag")
    link.bind("c", p, "choice", late=True)
    link.bind("w", p, "word")
    link.bind("heads", p, "heads", late=True, check=only_known)
    assert location.search.startswith("?n=1000")  # nothing is written before the first answer
    message = link.finish()
    assert message == MESSAGE + "n=100000000000000000000, w=<b>, heads=b, utm=x"
    assert (p.count, p.flag, p.choice, p.word, p.heads) == (1, True, -1, "heatmap", ["a", "c"])
    assert location.search == "?n=1&flag=true&c=-1&w=heatmap&heads=a%2Cc"
    p.choice = 2  # each change rewrites the whole query, in the one spelling
    assert parse(location.search) == {"n": "1", "flag": "true", "c": "2", "w": "heatmap", "heads": "a,c"}
    location.search = "?flag=True"  # the browser's own report of an older URL: the state is written again
    assert parse(location.search)["c"] == "2"
    assert link.finish() == ""  # the message comes once


def test_href_is_this_page_with_some_keys_changed():
    p = P(count=3, text="a b&c")
    link = Link()
    link.bind("n", p, "count")
    link.bind("t", p, "text")
    link.bind("heads", p, "heads")
    assert link.href(n=5) == "?n=5&t=a+b%26c&heads="
    assert link.href(heads=["x:1:2", "y:0:0"]) == "?n=3&t=a+b%26c&heads=x%3A1%3A2%2Cy%3A0%3A0"


def test_a_key_bound_twice_is_a_mistake():
    link = Link()
    link.bind("k", P(), "count")
    with pytest.raises(ValueError, match="bound twice"):
        link.bind("k", P(), "flag")


def test_tab_names():
    assert slug("Model analysis") == "model-analysis" and slug("Why") == "why"


# ------------------------------------------------------------------------------------ a whole page, both ways


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("link_ckpts")
    build_checkpoint(root / "alpha", seed=0, steps=0, run="runs/a", step=150)
    build_checkpoint(root / "beta", seed=1, steps=0, run="runs/a", step=10)
    return root


def _page(ckpt_dir, monkeypatch, query: str = ""):
    """A Workbench as a served page would be, opened on `query` (inline work, a Location of its own)."""
    location = Location(search=query)
    monkeypatch.setattr(workbench_app.Link, "of_page", classmethod(lambda cls: cls(location.search, location)))
    wb = workbench_app.Workbench(checkpoints=[ckpt_dir], default_dir=None, sync_url=True, background=False,
                                 extra_tabs=[MODEL_ANALYSIS, WHY, EVIDENCE, FEATURES, GRAPH])
    return wb, location


CHEAP_TABS = ("attention", "internals", "compare", "analysis")  # others compute heavy analyses when shown


def _random_value(rng: random.Random, wb, field):
    p = field.obj.param[field.name]
    if field.key == "tab":
        return rng.choice(CHEAP_TABS)
    if field.key == "site":
        return ""  # no dictionaries ship with these checkpoints: '' is "the first one"
    if field.key == "ablate":
        r = wb.session.result
        heads = [f"{k}:{layer}:{h}" for k in ("enc_self", "dec_self", "cross") for layer in range(r.depth(k))
                 for h in range(r.n_heads(k))]
        return rng.sample(heads, rng.randint(0, 3))
    if isinstance(p, param.Selector):
        objects = list(p.objects.values()) if isinstance(p.objects, dict) else list(p.objects)
        return rng.choice(objects)
    if isinstance(p, param.Boolean):
        return rng.choice([True, False])
    if isinstance(p, param.Integer):
        low, high = p.bounds or (None, None)
        return rng.randint(0 if low is None else low, 20 if high is None else high)
    if isinstance(p, param.Number):
        low, high = p.bounds
        return round(rng.uniform(low, high) / 0.05) * 0.05 if field.key == "gthr" else round(rng.uniform(low, high), 3)
    if isinstance(p, param.String):
        if field.key == "src":
            return rng.choice(["Ein Hund läuft durch den Park.", "Zwei Männer «spielen» 🎉 & lachen.",
                               "Eine Frau <b>liest</b> ein Buch?"])
        if field.key == "tgt":
            return rng.choice(["", "A dog runs & plays #1."])
        return rng.choice(HOSTILE_TEXT[:5])
    raise AssertionError(f"no random value for {field.key}")


@pytest.mark.parametrize("seed", range(4))
def test_a_page_opened_on_its_own_url_has_every_control_as_it_was(ckpt_dir, monkeypatch, seed):
    rng = random.Random(seed)
    a, location = _page(ckpt_dir, monkeypatch)
    keys = [f.key for f in a.link.fields]
    assert keys[:13] == ["ckpt", "src", "tgt", "beam", "alpha", "kind", "layer", "head", "tok", "words", "view",
                         "ablate", "tab"]
    assert {"cmp", "an", "stat", "ma", "mam", "mab", "mas", "wtok", "wsrc", "ev", "evroles", "site", "feature", "fq",
            "fout", "gtok", "gthr", "gcap", "gctx"} <= set(keys)
    for field in a.link.fields:  # in bind order: the checkpoint and the sentence first, then what follows them
        value = _random_value(rng, a, field)
        try:
            setattr(field.obj, field.name, value)
        except ValueError:  # e.g. a layer the new result lacks: the control keeps its value
            pass
    a.session.refresh()
    query = location.search
    assert query == "?" + a.link.query()
    b, _ = _page(ckpt_dir, monkeypatch, query)
    assert "could not be used" not in b.session.message, b.session.message
    for fa, fb in zip(a.link.fields, b.link.fields, strict=True):
        assert fa.key == fb.key
        assert getattr(fb.obj, fb.name) == getattr(fa.obj, fa.name), (fa.key, query[:300])
    assert b.session.result.text == a.session.result.text


def test_the_issue_37_link_opens_with_its_ablation(ckpt_dir, monkeypatch):
    """Head 2, ablate it, layer 1, all heads, words: the copied link (and its old Panel spelling) opens the same."""
    a, location = _page(ckpt_dir, monkeypatch)
    s = a.session
    s.head = 2
    s.toggle_head()
    s.param.update(layer=1, head=-1, words=True)
    query = parse(location.search)
    assert (query["ablate"], query["head"], query["layer"], query["words"]) == ("cross:0:2", "-1", "1", "true")
    old = location.search.replace("ablate=cross%3A0%3A2", "ablate=%5B%27cross%3A0%3A2%27%5D").replace(
        "head=-1", "head=-1.0").replace("words=true", "words=True")
    for link in (location.search, old):
        b, b_location = _page(ckpt_dir, monkeypatch, link)
        assert "could not be used" not in b.session.message
        assert (b.session.ablate, b.session.head, b.session.layer, b.session.words) == (["cross:0:2"], -1, 1, True)
        assert b.session.ablation is not None
        assert b_location.search == location.search  # the old spelling is written anew


def test_a_link_names_each_refused_head_of_an_otherwise_good_ablation(ckpt_dir, monkeypatch):
    b, location = _page(ckpt_dir, monkeypatch,
                        "?ckpt=alpha&ablate=cross:0:1,cross:9:9,bogus,cross:0:1&tab=nowhere&gtok=999")
    assert b.session.ablate == ["cross:0:1"] and b.session.ablation is not None
    message = b.session.message
    assert message.count("could not be used") == 1
    for named in ("ablate=cross:9:9", "ablate=bogus", "ablate=cross:0:1 (given twice)", "tab=nowhere", "gtok=999"):
        assert named in message
    query = parse(location.search)
    assert query["ablate"] == "cross:0:1" and query["tab"] == "attention" and query["gtok"] == "0"


def test_a_repeated_key_uses_its_last_value_and_names_the_others(ckpt_dir, monkeypatch):
    b, location = _page(ckpt_dir, monkeypatch, "?ckpt=alpha&head=1&head=2&layer=1")
    assert b.session.head == 2 and b.session.layer == 1
    assert "head=1 (the key is repeated: its last value is used)" in b.session.message
    query = parse(location.search)
    assert query["head"] == "2" and location.search.count("head=") == 1


def test_tab_in_a_link_opens_that_tab(ckpt_dir, monkeypatch):
    b, _ = _page(ckpt_dir, monkeypatch, "?ckpt=alpha&tab=analysis")
    assert b.tab == "analysis" and b.analysis.active and not b.compare.active
    b.tab = "compare"
    assert b.compare.active and not b.analysis.active


def test_compare_shows_b_and_a_choice_sets_b(ckpt_dir, monkeypatch):
    b, location = _page(ckpt_dir, monkeypatch, "?ckpt=alpha")
    view = b.compare
    picker = view.__panel__()[0]
    assert picker.value == view.other == "beta"  # the partner (another snapshot of run a), not A
    picker.value = "alpha"
    assert view.other == "alpha" and view._why == "chosen by you"
    assert parse(location.search)["cmp"] == "alpha"
    b.session.checkpoint = "beta"  # a chosen B stays when A changes
    assert view.other == "alpha" and picker.value == "alpha"


def _graph_nodes(wb):
    view = next(v for title, v in wb.tabs if title == "Graph")
    pane = next(o for o in view.content if "graph-figure" in o.css_classes)
    return view, pane.object.select_one({"name": "graph_nodes"})


class _HeldLane:
    """A lane whose jobs wait until `run()`: a served page's graph still being built while other events come."""

    def __init__(self, lane):
        self.lane, self.jobs = lane, []

    def submit(self, fn, *args, done, **kw):
        self.jobs.append((fn, args, done))

    def cancel(self):
        self.jobs.clear()

    def run(self):
        jobs, self.jobs = self.jobs, []
        for fn, args, done in jobs:
            done(fn(*args))


def test_a_links_node_waits_for_the_graph_of_its_own_token(ckpt_dir, monkeypatch):
    """A link's token and node are applied after the first answer, so on a served page the node can arrive while
    the graph of the default token is still shown and the link's own is being built. The node then waits for its
    graph (not dropped as "not drawn", no message, its QK key kept), and that graph selects it; an answer of
    settings the page no longer asks for is not drawn (the copied link whose panel never opened, stops 47, 49)."""
    a, location = _page(ckpt_dir, monkeypatch, "?ckpt=alpha&tab=graph&gtok=1&gthr=0.5")
    view, _ = _graph_nodes(a)
    view.position = 0
    zero = view._answer
    kept_at_zero = {int(i) for i in zero["keep"]}
    view.position = 1
    view, nodes = _graph_nodes(a)
    tap = next(i for i, n in enumerate(nodes.data["index"]) if int(n) not in kept_at_zero)
    nodes.selected.indices = [tap]
    node = view.node
    assert parse(location.search)["gnode"] == str(node)
    b, _ = _page(ckpt_dir, monkeypatch, "?ckpt=alpha&tab=graph&gthr=0.5")  # the default token's graph is shown
    view_b, _ = _graph_nodes(b)
    assert view_b.position == 0 and view_b.node == -1
    held = view_b.lane = _HeldLane(view_b.lane)
    view_b.position = 1  # the link's late values: its token (a new graph, building) ...
    view_b._link_node_check(node)
    view_b.node = node  # ... and its node, not in the shown graph
    assert view_b.node == node and "could not be used" not in b.session.message
    view_b._done(zero)  # an answer of the old token, arriving late: not drawn
    assert view_b._answer["position"] == 0 and view_b.node == node
    held.run()  # the link's own graph: its node selected, its panel opens
    view_b, nodes_b = _graph_nodes(b)
    assert view_b._answer["position"] == 1 and view_b.node == node
    assert list(nodes_b.selected.indices) == [tap] and "could not be used" not in b.session.message


def test_a_tapped_graph_node_round_trips_and_a_missing_one_is_named(ckpt_dir, monkeypatch):
    a, location = _page(ckpt_dir, monkeypatch, "?ckpt=alpha&tab=graph&gtok=1&gthr=0.5")
    view, nodes = _graph_nodes(a)
    assert view.position == 1 and view.node == -1
    nodes.selected.indices = [2]  # a tap
    assert view.node == nodes.data["index"][2] and parse(location.search)["gnode"] == str(view.node)
    b, _ = _page(ckpt_dir, monkeypatch, location.search)
    view_b, nodes_b = _graph_nodes(b)
    assert view_b.node == view.node and list(nodes_b.selected.indices) == [2]  # its panel opens
    assert "could not be used" not in b.session.message
    c, location_c = _page(ckpt_dir, monkeypatch, "?ckpt=alpha&tab=graph&gtok=1&gnode=99999")
    assert "gnode=99999" in c.session.message and parse(location_c.search)["gnode"] == "-1"

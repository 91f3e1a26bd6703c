"""The Graph tab without a browser, on a real (tiny) checkpoint: it draws the analysis' pruned nodes; a tapped head's
panel data is its attention row as the model computed it (`hook_probs`, read here from a separate run); the token
picker follows the output length; the threshold re-prunes the kept graph without rebuilding it; a superseded
request is never applied; the export is one offline file named after the checkpoint, the view and the token."""

from __future__ import annotations

import asyncio
import re
import sys
import threading
from pathlib import Path
from urllib.parse import parse_qs

import panel as pn
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import build_checkpoint  # noqa: E402
from test_link import _page  # noqa: E402
from test_requests import on_loop, until  # noqa: E402

from workbench.analysis.attribution.graph import graph_size  # noqa: E402
from workbench.charts.export import external_references  # noqa: E402
from workbench.charts.graph import selected_detail  # noqa: E402
from workbench.core.batching import decoder_input  # noqa: E402
from workbench.ui import Workbench, graph_view, workers  # noqa: E402
from workbench.ui.graph_view import TAB, GraphView, build_graph  # noqa: E402
from workbench.ui.session import Session  # noqa: E402
from workbench.ui.views import _md_escape  # noqa: E402

SENTENCE = "Ein Hund läuft durch den Park."


@pytest.fixture
def session(entries):
    return Session(entries, checkpoint="alpha", sentence=SENTENCE)


def _figure(view):
    pane = next(o for o in view.content if "graph-figure" in o.css_classes)
    return pane.object


def test_the_drawn_nodes_are_the_pruned_graph_and_a_tapped_head_shows_its_attention_row(session):
    view = GraphView(session=session)
    view.param.update(position=2, threshold=0.9)
    view.show()
    r = session.result
    graph = build_graph(r.model, r.src_ids, r.out_ids, r.src_pieces, r.out_pieces, 2)
    keep = graph.prune(0.9, 100).tolist()
    layout = _figure(view)
    nodes = layout.select_one({"name": "graph_nodes"})
    assert nodes.data["index"] == keep
    assert [n["label"] for n in (graph.nodes[i] for i in keep)] == nodes.data["label"]
    assert graph.token == r.out_ids[2]
    assert graph_size(r.model.model, len(r.src_ids), 2) == len(graph.nodes)  # the cost said before building
    # a head node tapped (the selection JavaScript reads): its attention row is the clean run's hook_probs row
    heads = [k for k, kind in enumerate(nodes.data["kind"]) if kind == "head"]
    assert heads, "no head among the kept nodes"
    k = heads[0]
    nodes.selected.indices = [k]
    shown = selected_detail(layout)
    node = graph.nodes[keep[k]]
    model, cfg = r.model.model, r.model.model.cfg
    name = f"{node['stack']}.{node['layer']}.{node['block']}.hook_probs"
    src = torch.tensor([list(r.src_ids)])
    tgt = torch.tensor([decoder_input(r.out_ids[:3], cfg.start_id)])
    with torch.no_grad():
        _, cache = model.run_with_cache(src, tgt, names=[name])
    row = cache[name][0, node["head"], node["position"]].tolist()
    assert shown["label"] == node["label"] and shown["weights"] == pytest.approx(row, abs=1e-4)
    keys = list(r.src_pieces) if node["block"] == "cross_attn" or node["stack"] == "enc" else ["<s>", *r.out_pieces]
    assert shown["keys"] == keys[: len(row)]
    # its edges in and out: the strongest of the adjacency, by |weight|
    strongest = graph.adjacency[keep[k]].abs().max().item()
    assert abs(float(shown["edges_in"][0].rsplit(" ", 1)[1])) == pytest.approx(strongest, abs=1e-3)
    # an FFN or embedding node shows its position's token and its edges, no attention
    other = next(j for j, kind in enumerate(nodes.data["kind"]) if kind in ("ffn", "embed"))
    nodes.selected.indices = [other]
    shown = selected_detail(layout)
    assert shown["weights"] == [] and shown["edges_out"]
    n = graph.nodes[keep[other]]
    assert shown["context"] == (r.src_pieces if n["stack"] == "enc" else ["<s>", *r.out_pieces])[n["position"]]


def test_a_tapped_head_shows_where_it_writes_most_in_the_test_corpus(session):
    view = GraphView(session=session)
    view.show()
    layout = _figure(view)
    nodes = layout.select_one({"name": "graph_nodes"})
    k = nodes.data["kind"].index("head")
    nodes.selected.indices = [k]
    shown = selected_detail(layout)
    assert len(shown["contexts"]) == 5 and all("[" in line and "norm" in line for line in shown["contexts"])
    r = session.result
    found, where = graph_view.model_contexts(r.model)
    assert "60 Multi30k test2016" in where
    node = _node(view, nodes.data["index"][k])
    entries = found[(node["stack"], node["layer"], node["block"], node["head"])]
    scores = [e["score"] for e in entries]
    assert scores == sorted(scores, reverse=True)
    # by hand: the first context's sentence, teacher-forced on its reference; the head's write norm peaks there
    src_lines, ref_lines, _ = graph_view._corpus("de", "en")
    tm, cfg = r.model, r.model.model.cfg
    e = entries[0]
    src = torch.tensor([tm.encode_source(src_lines[e["sentence"]])[0]])
    tgt = torch.tensor([decoder_input(tm.tgt_tokenizer.encode(ref_lines[e["sentence"]]), cfg.start_id, prefix=True)])
    name = f"{node['stack']}.{node['layer']}.{node['block']}.hook_result"
    with torch.no_grad():
        _, cache = tm.model.run_with_cache(src, tgt, names=[name])
    norms = cache[name][0, node["head"]].norm(dim=-1)
    assert int(norms.argmax()) == e["position"] and float(norms.max()) == pytest.approx(e["score"], rel=1e-5)
    view.contexts = False
    nodes = _figure(view).select_one({"name": "graph_nodes"})
    assert all(c == [] for c in nodes.data["contexts"])


def _node(view, index):
    return view._answer["graph"].nodes[index]


def test_threshold_and_cap_reprune_the_kept_graph(session, monkeypatch):
    view = GraphView(session=session, threshold=0.95)
    view.show()
    first = _figure(view).select_one({"name": "graph_nodes"}).data["index"]
    built = []
    monkeypatch.setattr(graph_view, "attribution_graph", lambda *a, **k: built.append(1))
    view.threshold = 0.5
    fewer = _figure(view).select_one({"name": "graph_nodes"}).data["index"]
    assert built == [] and len(fewer) < len(first) and set(fewer) <= set(first)
    view.max_nodes = 5
    assert len(_figure(view).select_one({"name": "graph_nodes"}).data["index"]) <= 6  # 5 + the logit
    assert "only the pruning ran again" in next(o.object for o in view.content if "graph-note" in o.css_classes)


def test_picker_follows_the_output_length(session):
    view = GraphView(session=session)
    view.show()
    n = len(session.result.out_pieces)
    assert list(view.param.position.objects.values()) == list(range(n))
    view.position = n - 1
    session.sentence = "Ein Hund ."
    m = len(session.result.out_pieces)
    assert list(view.param.position.objects.values()) == list(range(m))
    assert view.position < m
    nodes = _figure(view).select_one({"name": "graph_nodes"})
    assert nodes.data["kind"][-1] == "logit"
    # too large a graph is refused with its cost, before any work
    tokens = len(session.result.src_ids)
    view_limit = graph_view.MAX_GRAPH_NODES
    try:
        graph_view.MAX_GRAPH_NODES = 10
        view.threshold = 0.7
        text = view.content[0].object
        assert "nodes" in text and f"{tokens} source tokens" in text and "MB" in text
    finally:
        graph_view.MAX_GRAPH_NODES = view_limit


def test_export_is_one_offline_captioned_file(session):
    view = GraphView(session=session)
    view.position = 1
    view.show()
    assert view.export_name() == "alpha_graph_tok1-thr0.8-cap100.html"
    html = view.export_html().getvalue()
    assert "Checkpoint: alpha" in html and "Sentence: " in html and "Translation: " in html
    assert "graph_detail" in html and "graph_node_attention" in html
    assert external_references(html) == []
    # the caption names the sentence the graph is of, even after the page moved on while the tab was hidden
    view.active = False
    session.sentence = "Ein Hund ."
    html = view.export_html().getvalue()  # (the document's JSON escapes the umlaut)
    assert "Sentence: Ein Hund l" in html and "Sentence: Ein Hund ." not in html


def test_a_superseded_graph_is_never_applied(entries, monkeypatch):
    """Served (background): the graph of token 1 is held in its worker while token 2 is picked; token 2's graph is
    shown, with its progress per sub-layer, and token 1's, released afterwards, stops at its first sub-layer and
    never lands."""
    started, release = threading.Event(), threading.Event()
    real = graph_view.attribution_graph

    finished = []

    def held(*args, position, **kw):
        if position == 1:
            started.set()
            assert release.wait(60)
        graph = real(*args, position=position, **kw)
        finished.append(position)
        return graph

    monkeypatch.setattr(graph_view, "attribution_graph", held)
    monkeypatch.setattr(workers, "_PLACEMENT", None)  # the server's threads: the held graph is patched here
    monkeypatch.setattr(workers, "_REFUSED", True)
    rendered, reports = [], []

    async def main():
        s = Session(entries, checkpoint="alpha", sentence=SENTENCE, background=True)
        await until(lambda: s.result is not None and not s.busy, "the translation")
        view = GraphView(session=s)
        original = view.render
        view.render = lambda answer: rendered.append(answer["position"]) or original(answer)
        shown = view.progress
        view.progress = lambda done, total, what="": (what or reports.append((done, total))) or shown(done, total, what)
        view.position = 1
        view.show()
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 60)
        view.position = 2
        await until(lambda: rendered, "the second graph")
        release.set()
        await asyncio.sleep(1.0)
        s.close()
        return view

    view = on_loop(main)
    assert rendered == [2]
    assert finished == [2]  # the superseded graph stopped at its first sub-layer, once released
    total = reports[-1][1]
    assert reports and reports[-1] == (total, total) and total == 2 * (2 * 2 + 3 * 2)  # every sub-layer of 2+2 layers
    assert _figure(view).select_one({"name": "graph_nodes"}).data["index"][-1] > 0


def test_the_app_adds_the_tab(entries):
    wb = Workbench(checkpoints=[Path(entries[0].path).parent], default_dir=None, extra_tabs=[TAB])
    assert [t for t, _ in wb.tabs][-1] == "Graph"


def test_the_graph_says_how_far_to_trust_it(session):
    """Issue 38 point 4: beside the graph, its top computed nodes' predicted effects and real removals, with ρ."""
    view = GraphView(session=session)
    view.param.update(position=2)
    view.show()
    r = session.result
    card = next(o for o in view.content if isinstance(o, pn.Card))
    text = card.objects[0].object
    assert "ρ = " in text and "| node | predicted | real |" in text
    graph = build_graph(r.model, r.src_ids, r.out_ids, r.src_pieces, r.out_pieces, 2)
    trust = graph_view.graph_trust(r.model.model, *graph_view.sentence_tensors(r.model, r.src_ids, r.out_ids, 2),
                                   graph, top=graph_view.TRUSTED_TOP)
    top = trust.labels[0]
    assert f"| {graph_view._md_escape(top)} | {trust.predicted[0]:+.3f} | {trust.real[0]:+.3f} |" in text


def _qk_parts(view):
    box = view._qk_box
    note = next(o for o in box.objects if "graph-qk-note" in o.css_classes)
    table = next(o for o in box.objects if "graph-qk-table" in o.css_classes)
    select = next(w for row in box.objects if isinstance(row, pn.Row) for w in row.objects
                  if "graph-qk-key" in w.css_classes)
    return note.object, table.object, select


def test_a_tapped_cross_attention_head_says_why_it_attends_there(session):
    """Issue 36 point 4: tapping a cross-attention head lists the top query x key pairs of its score at the piece it
    attends most (the terms are `qk_attribution`'s, the score the model's); another piece can be picked; a decoder
    self-attention head gets the same over its causal keys; tapping another kind of node clears the table."""
    view = GraphView(session=session)
    view.param.update(position=2, threshold=1.0, max_nodes=400)
    view.show()
    nodes = _figure(view).select_one({"name": "graph_nodes"})
    k = next(j for j, i in enumerate(nodes.data["index"]) if _node(view, i)["block"] == "cross_attn")
    assert view._qk_box.objects == []
    nodes.selected.indices = [k]  # the tap
    node = _node(view, nodes.data["index"][k])
    assert view.node == nodes.data["index"][k]
    note, table, select = _qk_parts(view)
    r = session.result
    row = node["attention"]
    s = max(range(len(row)), key=lambda j: row[j])
    assert select.value == s
    name = f"dec.{node['layer']}.cross_attn.hook_scores"
    src = torch.tensor([list(r.src_ids)])
    tgt = torch.tensor([decoder_input(r.out_ids[:3], r.model.model.cfg.start_id)])
    with torch.no_grad():
        _, cache = r.model.model.run_with_cache(src, tgt, names=[name])
    score = float(cache[name][0, node["head"], node["position"], s])
    assert _md_escape(f"score {score:.3f}") in note
    assert _md_escape(f"reading source piece {s} ({r.src_pieces[s]!r})") in note
    assert len(table) == graph_view.QK_TOP and list(table.columns) == ["query side", "key side", "term",
                                                                       "share of score"]
    terms = table["term"].abs().to_numpy()
    assert (terms[:-1] >= terms[1:]).all()
    # another source piece: the table follows it
    other = (s + 1) % len(row)
    select.value = other
    assert view.qk_key == other
    note, _, select = _qk_parts(view)
    assert _md_escape(f"reading source piece {other} ") in note and select.value == other
    # a self-attention head (decoder: causal, its keys the target prefix up to the query): the same, from its scores
    picked = [_node(view, i) for i in nodes.data["index"]]
    j = next(j for j, n in enumerate(picked) if (n["block"], n["stack"]) == ("self_attn", "dec") and n["position"])
    nodes.selected.indices = [j]
    node = _node(view, nodes.data["index"][j])
    note, table, select = _qk_parts(view)
    name = f"dec.{node['layer']}.self_attn.hook_scores"
    with torch.no_grad():
        _, cache = r.model.model.run_with_cache(src, tgt, names=[name])
    s = select.value
    assert len(select.options) == node["position"] + 1 and s <= node["position"]
    score = float(cache[name][0, node["head"], node["position"], s])
    assert _md_escape(f"dec_self:{node['layer']}:{node['head']}, output position {node['position']}") in note
    assert _md_escape(f"score {score:.3f}") in note and _md_escape("reading decoder position") in note
    # an FFN or embedding node: no table
    nodes.selected.indices = [next(j for j, kind in enumerate(nodes.data["kind"]) if kind in ("ffn", "embed"))]
    assert view._qk_box.objects == []


def test_the_edge_table_names_features_on_the_shipped_checkpoint():
    """With the checkpoint's dictionaries the pairs are features (named by the piece their top contexts hold)."""
    from workbench.decoding.translator import load

    tm = load(Path(__file__).resolve().parents[2] / "checkpoints" / "multi30k-de-en")
    src_ids = tm.encode_source("Ein Hund läuft durch den Park.")[0]
    out_ids = [*tm.tgt_tokenizer.encode("A dog runs through the park."), tm.model.cfg.eos_id]
    src_pieces, out_pieces = tm.src_tokenizer.pieces(src_ids), tm.tgt_tokenizer.pieces(out_ids)
    answer = graph_view.edge_qk(tm, src_ids, out_ids, src_pieces, out_pieces, 4, 1, 0, 3, 1, True)
    qk = answer["qk"]
    assert abs(qk.total - qk.score) < 1e-5 * max(1.0, abs(qk.score))
    assert "hook_memory" in answer["dictionaries"] and "dec.0.cross_attn.hook_out" in answer["dictionaries"]
    keys = answer["table"]["key side"].tolist()
    named = [k for k in keys if k.startswith("hook_memory f")]
    assert named and all(k.endswith("%)") for k in named)
    plain = graph_view.edge_qk(tm, src_ids, out_ids, src_pieces, out_pieces, 4, 1, 0, 3, 1, False)
    assert plain["dictionaries"] == [] and plain["qk"].score == pytest.approx(qk.score, abs=1e-5)


def test_the_explained_key_is_in_the_link(tmp_path, monkeypatch):
    """The picked key and the features switch are in the URL (`gqk`, `gqkf`): a page opened on it explains the same
    head at the same key; a key the head does not have is named and the head's own used; tapping another head starts
    at its own argmax."""
    build_checkpoint(tmp_path / "alpha", seed=0, steps=0, run="runs/a", step=150)
    a, location = _page(tmp_path, monkeypatch, "?ckpt=alpha&tab=graph&gtok=2&gthr=1.0&gcap=400")
    view = next(v for title, v in a.tabs if title == "Graph")
    nodes = _figure(view).select_one({"name": "graph_nodes"})
    crosses = [j for j, i in enumerate(nodes.data["index"]) if _node(view, i)["block"] == "cross_attn"]
    nodes.selected.indices = [crosses[0]]
    _, _, select = _qk_parts(view)
    other = (select.value + 1) % len(select.options)
    select.value = other
    query = parse_qs(location.search.lstrip("?"))
    assert query["gqk"] == [str(other)] and query["gnode"] == [str(view.node)]
    b, _ = _page(tmp_path, monkeypatch, location.search)
    view_b = next(v for title, v in b.tabs if title == "Graph")
    note, _, select_b = _qk_parts(view_b)
    assert view_b.node == view.node and select_b.value == other and f"piece {other} " in note
    assert "could not be used" not in b.session.message
    nodes_b = _figure(view_b).select_one({"name": "graph_nodes"})
    nodes_b.selected.indices = [crosses[1]]  # another head: its own argmax again
    assert view_b.qk_key == -1
    row = _node(view_b, nodes_b.data["index"][crosses[1]])["attention"]
    assert _qk_parts(view_b)[2].value == max(range(len(row)), key=lambda j: row[j])
    c, location_c = _page(tmp_path, monkeypatch, location.search.replace(f"gqk={other}", "gqk=999"))
    assert "gqk=999" in c.session.message and parse_qs(location_c.search.lstrip("?"))["gqk"] == ["-1"]


def test_the_graph_over_the_checkpoints_dictionary_features():
    """*Dictionary features* builds the feature-level graph with the checkpoint's shipped dictionaries: features
    replace the heads and FFNs they cover, the graph is complete and the chart places every kept node."""
    from workbench.charts.graph import graph_data
    from workbench.decoding.translator import load

    tm = load(Path(__file__).resolve().parents[2] / "checkpoints" / "multi30k-de-en")
    src_ids = tm.encode_source("Ein Hund läuft durch den Park.")[0]
    out_ids = [*tm.tgt_tokenizer.encode("A dog runs through the park."), tm.model.cfg.eos_id]
    src_pieces, out_pieces = tm.src_tokenizer.pieces(src_ids), tm.tgt_tokenizer.pieces(out_ids)
    g = graph_view.build_graph(tm, src_ids, out_ids, src_pieces, out_pieces, 2, features=True)
    sites = {n["site"] for n in g.nodes if n["kind"] == "feature"}
    assert "hook_memory" in sites and any(s.endswith("cross_attn.hook_out") for s in sites)
    assert not any(n["kind"] == "head" and n["block"] == "cross_attn" and n["layer"] == 0 for n in g.nodes)
    assert abs(float(g.adjacency[-1].sum()) - g.logit) <= 1e-6 * max(1.0, abs(g.logit))
    nodes, _ = graph_data(g, g.prune(0.8, 100))
    assert len(set(zip(nodes["x"], nodes["y"]))) == len(nodes["x"])


def test_dictionary_features_on_a_checkpoint_without_dictionaries_say_so(session):
    view = graph_view.GraphView(session=session)
    view.features = True
    assert "ships no dictionaries" in str(view.inputs())


def test_a_tapped_feature_node_links_its_dashboard_with_its_contexts_and_effects(tmp_path, monkeypatch):
    """In a feature graph (*Dictionary features*), a tapped feature node shows the link to its dashboard (this page on
    the Features tab at its site and feature, checkpoint and sentence kept), its top contexts and output effects (the
    feature's dashboard data, `feature_details`); the link opens the Features tab on that feature; a head clears it."""
    from workbench.analysis.attribution.feature_graph import feature_details
    from workbench.ui.features_view import sites_of

    (tmp_path / "multi30k-de-en").symlink_to(Path(__file__).resolve().parents[2] / "checkpoints" / "multi30k-de-en")
    query = "?ckpt=multi30k-de-en&src=Ein+Hund+l%C3%A4uft+durch+den+Park.&tab=graph&gtok=1&gfeat=true"
    a, _ = _page(tmp_path, monkeypatch, query)
    view = next(v for title, v in a.tabs if title == "Graph")
    nodes = _figure(view).select_one({"name": "graph_nodes"})
    j = next(j for j, kind in enumerate(nodes.data["kind"]) if kind == "feature")
    nodes.selected.indices = [j]
    node = _node(view, nodes.data["index"][j])
    box = "".join(str(o.object) for o in view._feature_box.objects)
    href = re.search(r"class='graph-feature-link' href='([^']*)'", box).group(1).replace("&amp;", "&")
    query_b = parse_qs(href.lstrip("?"))
    assert query_b["ckpt"] == ["multi30k-de-en"] and query_b["src"] == ["Ein Hund läuft durch den Park."], href
    assert query_b["tab"] == ["features"] and query_b["site"] == [node["site"]], href
    assert query_b["feature"] == [str(node["feature"])], href
    details = feature_details(a.session.result.model, {p.name: p for p in sites_of(a.session.result.model)}, node,
                              contexts=graph_view.FEATURE_CONTEXTS, effects=graph_view.FEATURE_EFFECTS)
    first = details["contexts"][0]
    assert f"{first['value']:6.2f}" in box and "Output effects" in box
    top = details["output_effects"]["tokens"][0]
    assert f"({top['dp']:+.4f})" in box
    # the link opens the Features tab on that dictionary and feature, on the same checkpoint and sentence
    b, location_b = _page(tmp_path, monkeypatch, href)
    features = next(v for title, v in b.tabs if title == "Features")
    assert b.tab == "features" and features.site == node["site"] and features.feature == node["feature"]
    assert b.session.checkpoint == "multi30k-de-en" and b.session.sentence == "Ein Hund läuft durch den Park."
    assert "could not be used" not in b.session.message
    # another kind of node clears the box
    nodes.selected.indices = [next(j for j, kind in enumerate(nodes.data["kind"]) if kind != "feature")]
    assert view._feature_box.objects == []


def test_progress_changes_one_line_in_place_and_shows_sub_layers_at_most_every_quarter_second(session, monkeypatch):
    view = GraphView(session=session)
    clock = [100.0]
    monkeypatch.setattr("workbench.ui.graph_view.time.monotonic", lambda: clock[0])
    view.progress(1, 40)
    shown = list(view._box.objects)
    assert "sub-layer 1 of 40" in shown[0].object and view._bar.value == 1
    view.progress(2, 40)  # at once: not shown
    assert "sub-layer 1 of 40" in shown[0].object and view._bar.value == 1
    clock[0] += 0.3
    view.progress(3, 40)
    view.progress(40, 40)  # the last one always
    assert "sub-layer 40 of 40" in shown[0].object and view._bar.value == 40
    view.progress(0, 0, "Measuring where each head writes")
    assert view._box.objects == [shown[0]] and "Measuring" in shown[0].object
    view.progress(1, 40)
    assert all(a is b for a, b in zip(view._box.objects, shown)) and len(view._box.objects) == 2  # the same panes


def test_a_second_page_reprunes_the_graph_another_page_built(entries, monkeypatch):
    # one cache keyed by checkpoint (issue 37 pt 6): the graph is the checkpoint's, not one page's
    first = GraphView(session=Session(entries, checkpoint="alpha", sentence="Ein Hund läuft."), threshold=0.95)
    first.show()
    built = []
    monkeypatch.setattr(graph_view, "attribution_graph", lambda *a, **k: built.append(1))
    second = GraphView(session=Session(entries, checkpoint="alpha", sentence="Ein Hund läuft."), threshold=0.5)
    second.show()
    assert built == [] and "only the pruning ran again" in next(o.object for o in second.content
                                                                  if "graph-note" in o.css_classes)

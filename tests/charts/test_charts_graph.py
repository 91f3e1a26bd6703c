"""The attribution-graph view (workbench.charts.graph): its data, an offline HTML file, and the tap in Chromium."""

from __future__ import annotations

import shutil

import pytest
import torch
from model_helpers import make_model

from workbench import presets
from workbench.analysis.attribution.graph import attribution_graph
from workbench.charts import attribution_graph_view, graph_data, save_html
from workbench.charts.export import external_references


@pytest.fixture(scope="module")
def graph():
    cfg = presets.tiny(vocab=40)
    m = make_model(cfg, seed=3)
    src = torch.tensor([[5, 6, 7, 8, cfg.eos_id]])
    tgt = torch.tensor([[cfg.start_id, 9, 10, 11]])
    return attribution_graph(m, src, tgt, position=2, token=12, src_tokens=list("abcd") + ["</s>"],
                             tgt_tokens=["<s>", "x", "y", "z"])


def test_graph_data_keeps_pruned_nodes_and_their_strongest_edges(graph):
    keep = graph.prune(0.8)
    nodes, edges = graph_data(graph, keep, src_tokens=list("abcd") + ["</s>"], tgt_tokens=["<s>", "x", "y", "z"],
                              max_edges=25)
    assert nodes["index"] == keep.tolist() and nodes["kind"][-1] == "logit"
    assert 0 < len(edges["weight"]) <= 25
    assert set(edges["source"]) | set(edges["target"]) <= set(keep.tolist())
    weights = [abs(w) for w in edges["weight"]]
    assert weights == sorted(weights, reverse=True)
    heads = [k for k, kind in enumerate(nodes["kind"]) if kind == "head"]
    assert heads and all(nodes["attention"][k] for k in heads)  # a head shows the keys it read


def test_view_exports_offline(graph, tmp_path):
    path = save_html(attribution_graph_view(graph, graph.prune(0.8)), tmp_path / "graph.html")
    html = path.read_text(encoding="utf-8")
    assert "graph_detail" in html and external_references(html) == []


@pytest.mark.browser
def test_tapping_a_node_shows_its_context_attention_and_edges(graph, tmp_path):
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("needs Debian's chromium + chromium-driver (apt-get install chromium chromium-driver)")
    from workbench.charts.export import _chromium_driver

    keep = graph.prune(0.9)
    path = save_html(attribution_graph_view(graph, keep, src_tokens=list("abcd") + ["</s>"],
                                            tgt_tokens=["<s>", "x", "y", "z"]), tmp_path / "graph.html")
    drv = _chromium_driver()
    try:
        drv.get(path.as_uri())
        drv.set_script_timeout(20)
        drv.execute_async_script("""const done = arguments[0];
            const poll = () => (window.Bokeh && Bokeh.documents.length) ? done() : setTimeout(poll, 50); poll();""")
        assert [e for e in drv.get_log("browser") if e["level"] == "SEVERE"] == []
        i = next(k for k, n in enumerate(keep.tolist()) if graph.nodes[n]["kind"] == "head")
        drv.execute_script(f"Bokeh.documents[0].get_model_by_name('graph_nodes').selected.indices = [{i}];")
        text = drv.execute_async_script("""const done = arguments[0];
            const d = Bokeh.documents[0].get_model_by_name('graph_detail');
            const poll = () => d.text.includes("strongest edges in") ? done(d.text) : setTimeout(poll, 50); poll();""")
        assert graph.nodes[keep[i]]["label"] in text and "edges drawn" in text
        selected = drv.execute_script("return Bokeh.documents[0].get_model_by_name('graph_edges').selected.indices;")
        assert selected  # the node's edges are highlighted
        drv.save_screenshot(str(tmp_path / "graph.png"))
    finally:
        drv.quit()


@pytest.mark.browser
def test_a_node_selected_before_the_graph_reaches_the_page_has_its_panel(graph, tmp_path):
    # a link's node: the server selects it as the figure arrives, and on a busy machine both come in one message, so
    # the browser sees no selection change; the panel is filled once the figure is laid out
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("needs Debian's chromium + chromium-driver (apt-get install chromium chromium-driver)")
    from workbench.charts.export import _chromium_driver

    keep = graph.prune(0.9)
    view = attribution_graph_view(graph, keep, src_tokens=list("abcd") + ["</s>"], tgt_tokens=["<s>", "x", "y", "z"])
    i = next(k for k, n in enumerate(keep.tolist()) if graph.nodes[n]["kind"] == "head")
    view.select_one({"name": "graph_nodes"}).selected.indices = [i]  # selected before it is drawn
    path = save_html(view, tmp_path / "selected.html")
    drv = _chromium_driver()
    try:
        drv.get(path.as_uri())
        drv.set_script_timeout(20)
        text = drv.execute_async_script("""const done = arguments[0];
            const poll = () => {
                const doc = window.Bokeh && Bokeh.documents.length && Bokeh.documents[0];
                const d = doc && doc.get_model_by_name('graph_detail');
                d && d.text.includes("edges drawn") ? done(d.text) : setTimeout(poll, 50); };
            poll();""")  # "Tap a node" stays on the old code: the script times out
        assert graph.nodes[keep[i]]["label"] in text
    finally:
        drv.quit()


def test_a_feature_graph_draws_every_node_in_its_own_place(tmp_path):
    """A feature-level graph (SAEs on hook_memory and a cross-attention output, a transcoder): every kept node gets
    a distinct place, features on their block's row (hook_memory's half a row above the encoder's last FFN), their
    own colour; the view builds and exports offline."""
    from dictionary_helpers import tiny_dictionaries
    from model_helpers import graph_model, one_sentence

    from workbench.analysis.attribution.feature_graph import feature_graph

    m = graph_model(norm_first=False)
    src, tgt = one_sentence(m.cfg)
    g = feature_graph(m, tiny_dictionaries(m), src, tgt, position=4)
    keep = g.prune(0.95)
    nodes, _ = graph_data(g, keep)
    places = list(zip(nodes["x"], nodes["y"]))
    assert len(set(places)) == len(places)
    kinds = dict(zip(nodes["index"], nodes["kind"]))
    assert "feature" in kinds.values()
    enc_depth = len(m.enc)
    for i, y, color in zip(nodes["index"], nodes["y"], nodes["color"]):
        n = g.nodes[i]
        if n["kind"] == "feature":
            assert color == "#2980b9"
            assert y == (3 * enc_depth + 0.5 if n["site"] == "hook_memory" else
                         3 * n["layer"] + {"self_attn": 1, "cross_attn": 2, "ffn": 3}[n["block"]])
    save_html(attribution_graph_view(g, keep), tmp_path / "features.html")
    assert (tmp_path / "features.html").stat().st_size > 0

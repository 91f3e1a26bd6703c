"""An attribution graph (workbench.analysis.attribution.graph) as an interactive Bokeh view: data in, Bokeh layout out.

    keep = graph.prune(0.8)
    view = attribution_graph_view(graph, keep, src_tokens=src_pieces, tgt_tokens=["<s>", *out_pieces])
    save_html(view, "graph.html")            # offline: the tap interaction is client-side JavaScript

Layout: layered by layer, one row per sub-layer (embeddings at the bottom; then per layer its self-attention,
cross-attention (decoder only) and FFN rows; the logit on top), the encoder on the left (x = source position),
the decoder on the right (x = decoder input position), the heads of one block side by side within their
position; the axes name the rows and the pieces. Node size and opacity by influence on the logit, colour by kind;
edges between kept nodes, width by |weight|, red raises the target node's attribution, blue lowers it. Hover: the
node's label, context, attribution and influence. Tapping a node shows, in the panel beside the graph, what the
node is: its label, context token, attribution and influence, its strongest edges in and out (over the whole
graph, not only the kept nodes) and, for a head, its attention row at that query position over the keys, drawn as
bars labelled with the pieces, and, given corpus contexts (`analysis.graph.component_contexts`), the sentences
of a corpus where its head or FFN writes most; its kept edges are highlighted. The panel's data are
`node_detail`'s (testable without a browser: `selected_detail` reads what a selection shows).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import torch
from bokeh.layouts import column, row
from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    Div,
    FixedTicker,
    HoverTool,
    LabelSet,
    Range1d,
    TapTool,
)
from bokeh.plotting import figure

POSITIVE, NEGATIVE = "#c0392b", "#2c6fbb"
KIND_COLORS = {"embed": "#7f8c8d", "bias": "#bdc3c7", "error": "#95a5a6", "ffn": "#27ae60", "logit": "#000000",
               "self_attn": "#8e44ad", "cross_attn": "#d35400", "feature": "#2980b9"}
GAP = 3  # empty columns between the encoder's positions and the decoder's
ATTENTION_BARS = 24  # keys drawn in a head's attention panel (the strongest ones, in key order)
TOP_EDGES = 6  # edges in and out listed for a tapped node
LABELLED_COLUMNS = 60  # up to this many positions every piece is on the x axis; above, those holding drawn nodes


def _depth(graph, stack: str) -> int:
    return max((n["layer"] for n in graph.nodes if n["stack"] == stack and n["layer"] is not None), default=-1) + 1


def _row(n, enc_depth: int = 0) -> float:
    """A node's row: 0 embeddings; layer i: 3i+1 self-attention, 3i+2 cross-attention, 3i+3 FFN. A dictionary's
    feature or error node takes its block's row; the encoder output's dictionary (hook_memory: no layer) sits half a
    row above the encoder's last FFN."""
    if n["kind"] == "embed":
        return 0
    offset = {"self_attn": 1, "cross_attn": 2, "ffn": 3}
    if n["kind"] in ("feature", "error") and n.get("layer") is None:
        return 3 * enc_depth + 0.5
    if n["kind"] == "error" and n.get("block") is None:
        return 3 * n["layer"] + 3 - 0.5  # the layer's rounding error: between its last attention row and its FFN
    return 3 * n["layer"] + offset[n["block"]]


def row_labels(graph) -> dict[int, str]:
    """The y axis: row -> name (embeddings, L0 self-attn, L0 cross-attn, L0 FFN, ..., logit)."""
    depth = max(_depth(graph, "enc"), _depth(graph, "dec"))
    labels = {0: "embeddings"}
    for i in range(depth):
        labels.update({3 * i + 1: f"L{i} self-attn", 3 * i + 2: f"L{i} cross-attn", 3 * i + 3: f"L{i} FFN"})
    labels[3 * depth + 1] = "logit"
    return labels


def _key_labels(n, src_tokens, tgt_tokens) -> list[str]:
    keys = src_tokens if n["block"] == "cross_attn" or n["stack"] == "enc" else tgt_tokens
    weights = n.get("attention", [])
    return [str(keys[k]) if keys is not None and k < len(keys) else str(k) for k in range(len(weights))]


def _context(n, src_tokens, tgt_tokens) -> str:
    toks = src_tokens if n["stack"] == "enc" else tgt_tokens
    pos = n["position"]
    if n["kind"] == "logit":
        return str(tgt_tokens[pos + 1]) if tgt_tokens is not None and pos + 1 < len(tgt_tokens) else str(n["token"])
    if toks is not None and pos is not None and pos < len(toks):
        return str(toks[pos])
    return str(n.get("token") or "")


def component_key(n) -> tuple | None:
    """The key of a node's component in `analysis.graph.component_contexts` (None for embeddings, bias, errors)."""
    if n["kind"] == "head":
        return (n["stack"], n["layer"], n["block"], n["head"])
    if n["kind"] == "ffn":
        return (n["stack"], n["layer"], "ffn", None)
    return None


def _context_lines(entries) -> list[str]:
    return [e["text"] + (f"  → {e['key']} {e['weight']:.2f}" if "key" in e else "") + f"  (norm {e['score']:.2f})"
            for e in entries]


def node_detail(graph, i: int, *, src_tokens: Sequence[str] | None = None, tgt_tokens: Sequence[str] | None = None,
                top: int = TOP_EDGES, contexts: dict | None = None) -> dict:
    """What tapping node `i` shows: label, kind, context token, attribution, influence, the `top` strongest edges
    in and out over the whole graph ((label, weight), by |weight|), for a head its attention row (`keys`,
    `weights`: the pattern at its query position, one weight per key, as the clean run computed it) and, given
    `contexts` (`analysis.graph.component_contexts`), the corpus contexts where its head or FFN writes most."""
    n = graph.nodes[i]
    a = graph.adjacency

    def strongest(values: torch.Tensor) -> list[tuple[str, float]]:
        order = values.abs().argsort(descending=True)[:top].tolist()
        return [(graph.nodes[j]["label"], float(values[j])) for j in order if float(values[j]) != 0.0]

    weights = [float(w) for w in n.get("attention", [])] if n["kind"] == "head" else []
    return {"index": i, "label": n["label"], "kind": n["kind"], "context": _context(n, src_tokens, tgt_tokens),
            "attribution": float(graph.attribution[i]), "influence": float(graph.influence[i]),
            "edges_in": strongest(a[i]), "edges_out": strongest(a[:, i]),
            "keys": _key_labels(n, src_tokens, tgt_tokens) if weights else [], "weights": weights,
            "contexts": _context_lines((contexts or {}).get(component_key(n), []))}


def _feature_offsets(graph, keep: list[int], enc_depth: int) -> dict[int, float]:
    """A feature graph's nodes: several features at one (row, position) spread across the column, by feature id;
    each kept feature node's x offset."""
    spread: dict[tuple, list[int]] = {}
    for i in keep:
        n = graph.nodes[i]
        if n["kind"] == "feature":
            spread.setdefault((n["stack"], n["position"], _row(n, enc_depth)), []).append(i)
    return {i: ((k + 0.5) / len(ids) - 0.5) * 0.8 for ids in spread.values()
            for k, i in enumerate(sorted(ids, key=lambda j: graph.nodes[j]["feature"]))}


def _place(n: dict, S: int, top_row: int, heads: int, enc_depth: int, feature_offset: float | None
           ) -> tuple[float, float]:
    """A node's (x, y): the logit top right, the bias bottom left, the others at their position's column (a
    head, feature or error node offset within it) and their layer's row."""
    kind = n["kind"]
    if kind == "logit":
        return S + GAP + n["position"], top_row
    if kind == "bias":
        return -2, 0
    base = n["position"] if n["stack"] == "enc" else S + GAP + n["position"]
    off = ((n["head"] + 0.5) / heads - 0.5) * 0.8 if kind == "head" else (
        feature_offset if kind == "feature" else 0.4 if kind == "error" else 0.0)
    return base + off, _row(n, enc_depth)


def _edge_data(graph, keep: list[int], where: dict[int, tuple], max_edges: int) -> dict[str, list]:
    """Column data for the `max_edges` strongest edges among the kept nodes, drawn between their places."""
    idx = torch.tensor(keep)
    sub = graph.adjacency[idx][:, idx]
    flat = sub.abs().flatten()
    order = flat.argsort(descending=True)[: max_edges]
    order = order[flat[order] > 0]
    peak = float(flat[order[0]]) if len(order) else 1.0
    edges: dict[str, list] = {k: [] for k in ("xs", "ys", "color", "width", "weight", "source", "target")}
    for o in order.tolist():
        t, s = divmod(o, len(keep))
        w = float(sub[t, s])
        (x0, y0), (x1, y1) = where[keep[s]], where[keep[t]]
        edges["xs"].append([x0, x1])
        edges["ys"].append([y0, y1])
        edges["color"].append(POSITIVE if w > 0 else NEGATIVE)
        edges["width"].append(0.6 + 5.4 * abs(w) / peak)
        edges["weight"].append(w)
        edges["source"].append(keep[s])
        edges["target"].append(keep[t])
    return edges


def graph_data(graph, keep: Sequence[int] | torch.Tensor | None = None, *, src_tokens: Sequence[str] | None = None,
               tgt_tokens: Sequence[str] | None = None, max_edges: int = 400,
               contexts: dict | None = None) -> tuple[dict, dict]:
    """Column data for the kept nodes (with each node's `node_detail`) and the strongest edges among them
    (testable without a browser)."""
    keep = list(range(len(graph.nodes))) if keep is None else [int(i) for i in keep]
    S = graph.meta.get("src_len", 0)
    top_row = max(row_labels(graph))
    heads = max((n["head"] for n in graph.nodes if n["head"] is not None), default=0) + 1
    enc_depth = _depth(graph, "enc")
    feature_offset = _feature_offsets(graph, keep, enc_depth)
    cols = ("x", "y", "label", "kind", "color", "attribution", "influence", "context", "attention", "size", "alpha",
            "index", "keys", "weights", "edges_in", "edges_out", "tag", "contexts")
    nodes: dict[str, list] = {k: [] for k in cols}
    where = {}
    peak_influence = max(float(graph.influence[:-1].max()), 1e-12) if len(graph.nodes) > 1 else 1.0
    for i in keep:
        n = graph.nodes[i]
        kind = n["kind"]
        x, y = _place(n, S, top_row, heads, enc_depth, feature_offset.get(i))
        where[i] = (x, y)
        d = node_detail(graph, i, src_tokens=src_tokens, tgt_tokens=tgt_tokens, contexts=contexts)
        order = sorted(range(len(d["weights"])), key=lambda k: -d["weights"][k])[:5]
        rel = 1.0 if kind == "logit" else min(1.0, d["influence"] / peak_influence)
        nodes["x"].append(x)
        nodes["y"].append(y)
        nodes["label"].append(d["label"])
        nodes["kind"].append(kind)
        nodes["color"].append(KIND_COLORS.get(n["block"] if kind == "head" else kind, "#555555"))
        nodes["attribution"].append(d["attribution"])
        nodes["influence"].append(d["influence"])
        nodes["context"].append(d["context"])
        nodes["attention"].append(", ".join(f"{d['keys'][k]} {d['weights'][k]:.2f}" for k in order))
        nodes["size"].append(9 + 21 * rel)
        nodes["alpha"].append(0.35 + 0.65 * rel)
        nodes["index"].append(i)
        nodes["keys"].append(d["keys"])
        nodes["weights"].append(d["weights"])
        nodes["edges_in"].append([f"{lab} {w:+.3f}" for lab, w in d["edges_in"]])
        nodes["edges_out"].append([f"{lab} {w:+.3f}" for lab, w in d["edges_out"]])
        nodes["tag"].append(d["context"] if kind == "logit" else "")
        nodes["contexts"].append(d["contexts"])
    edges = _edge_data(graph, keep, where, max_edges)
    return nodes, edges


TAP_JS = """
const i = nodes.selected.indices[0];
if (i === undefined) { return; }
const d = nodes.data, e = edges.data, me = d.index[i];
const sel = [];
for (let k = 0; k < e.source.length; k++) { if (e.source[k] == me || e.target[k] == me) sel.push(k); }
edges.selected.indices = sel;
const esc = (s) => String(s).replace(/[&<>"']/g,
    (c) => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c]));
const list = (xs) => xs.length ? '<ol style="margin:2px 0 6px 18px;padding:0">'
    + xs.map((x) => `<li>${esc(x)}</li>`).join('') + '</ol>' : '<div style="margin:2px 0 6px">none</div>';
let html = `<div class="graph-node-title" style="font-size:14px"><b>${esc(d.label[i])}</b> (${esc(d.kind[i])})</div>`
    + `context: <b>${esc(d.context[i])}</b><br>attribution ${d.attribution[i].toFixed(3)}`
    + ` &middot; influence ${d.influence[i].toFixed(3)}`
    + `<div style="margin-top:6px"><b>strongest edges in</b> (from &rarr; this)</div>` + list(d.edges_in[i])
    + `<div><b>strongest edges out</b> (this &rarr; to)</div>` + list(d.edges_out[i])
    + `<div>${sel.length} of its edges drawn (highlighted)</div>`
    + (d.contexts[i].length ? `<div style="margin-top:6px"><b>corpus contexts</b> (where it writes most, `
       + `${esc(corpus)})</div>` + list(d.contexts[i]) : '');
detail.text = html;
const keys = d.keys[i], w = d.weights[i];
if (!w.length) {
    bars.data = {y: [], w: [], text: []};
    att.visible = false;
    return;
}
let pick = [...Array(w.length).keys()];
if (pick.length > limit) {
    pick = pick.sort((a, b) => w[b] - w[a]).slice(0, limit).sort((a, b) => a - b);
}
const n = pick.length;
bars.data = {y: pick.map((k, j) => n - 1 - j), w: pick.map((k) => w[k]),
             text: pick.map((k) => `${keys[k]} ${w[k].toFixed(2)}`)};
att.height = Math.max(180, 80 + 18 * n);  // about 18 px a bar
att.y_range.start = -0.6;
att.y_range.end = n - 0.4;
att.title.text = `${d.label[i]}: attention` + (w.length > n ? ` (top ${n} of ${w.length} keys)` : ' over the keys');
att.visible = true;
"""


def _label_axes(fig, graph, drawn_index: list[int], src_tokens: Sequence[str] | None,
                tgt_tokens: Sequence[str] | None) -> None:
    """Name the rows (layered by layer) and the columns (the pieces at each position: every piece when they fit;
    on long sentences only the positions that hold a drawn node, `drawn_index`, and the ends); set the ranges."""
    rows = row_labels(graph)
    fig.yaxis.ticker = FixedTicker(ticks=sorted(rows))
    fig.yaxis.major_label_overrides = {k: v for k, v in rows.items()}
    fig.yaxis.major_label_text_font_size = "10px"
    S = graph.meta.get("src_len", 0)
    T = graph.position + 1
    shown = {"enc": set(range(S)), "dec": set(range(T))}
    if S + T > LABELLED_COLUMNS:
        drawn = [graph.nodes[i] for i in drawn_index]
        shown = {stack: {n["position"] for n in drawn if n["stack"] == stack and n["position"] is not None}
                 | {0, length - 1} for stack, length in (("enc", S), ("dec", T))}
    ticks = {q: str(src_tokens[q]) if src_tokens is not None and q < len(src_tokens) else f"s{q}"
             for q in sorted(shown["enc"]) if q < S}
    ticks.update({S + GAP + q: str(tgt_tokens[q]) if tgt_tokens is not None and q < len(tgt_tokens) else f"t{q}"
                  for q in sorted(shown["dec"]) if q < T})
    fig.xaxis.ticker = FixedTicker(ticks=sorted(ticks))
    fig.xaxis.major_label_overrides = ticks
    fig.xaxis.major_label_orientation = 0.9
    fig.xaxis.major_label_text_font_size = "9px" if len(ticks) > 40 else "10px"
    fig.xaxis.axis_label = "source pieces (encoder)  |  decoder input pieces (the target prefix)"
    fig.x_range = Range1d(-3, S + GAP + T + 0.5)
    fig.y_range = Range1d(-0.7, max(rows) + 0.8)
    fig.grid.visible = False
    fig.ygrid.visible = True
    fig.ygrid.grid_line_alpha = 0.25


def _tap_panel(node_src: ColumnDataSource, edge_src: ColumnDataSource, side_width: int, corpus: str, fig):
    """The side panel a tap fills: the node's detail and, for a head, a bar chart of its attention over the
    keys. Filled in the browser when the selection changes, and once when the graph `fig` is laid out: a node
    selected before the figure reached the page (a link's node, set by the server as the figure arrives, on a busy
    machine in the same message) changes nothing there, and its panel had stayed on "Tap a node"."""
    detail = Div(text="<i>Tap a node: what it is, its strongest edges in and out, and for a head its attention "
                      "over the keys.</i>", width=side_width, name="graph_detail",
                 styles={"font-size": "12px", "line-height": "1.35"})
    bars = ColumnDataSource({"y": [], "w": [], "text": []}, name="graph_node_attention_data")
    att = figure(width=side_width, height=360, x_range=Range1d(0, 1.45), y_range=Range1d(-0.6, 0.4), tools="",
                 toolbar_location=None, title="attention over the keys", name="graph_node_attention", visible=False)
    att.hbar(y="y", right="w", height=0.75, source=bars, fill_color=KIND_COLORS["cross_attn"], line_color=None)
    att.text(x="w", y="y", text="text", source=bars, x_offset=4, text_baseline="middle", text_font_size="10px")
    att.yaxis.visible = False
    att.xaxis.axis_label = "attention weight"
    att.grid.visible = False
    att.title.text_font_size = "12px"
    args = {"nodes": node_src, "edges": edge_src, "detail": detail, "bars": bars, "att": att,
            "limit": ATTENTION_BARS, "corpus": corpus or "a corpus"}
    node_src.selected.js_on_change("indices", CustomJS(args=args, code=TAP_JS))
    fig.js_on_change("inner_width", CustomJS(args=args, code=TAP_JS))  # laid out (and resized): the same panel
    return column(detail, att, width=side_width + 10, name="graph_side")  # + the Div's own 5 px margins


def attribution_graph_parts(graph, keep: Sequence[int] | torch.Tensor | None = None, *,
                            src_tokens: Sequence[str] | None = None, tgt_tokens: Sequence[str] | None = None,
                            title: str = "", width: int = 1000, height: int = 640, max_edges: int = 400,
                            side_width: int = 360, contexts: dict | None = None, corpus: str = "",
                            data: tuple[dict, dict] | None = None):
    """(graph figure, side panel, legend) of the view: the page lays them out (side by side where it fits).
    `contexts` (`analysis.graph.component_contexts`, measured on `corpus`) adds each head's and FFN's corpus
    contexts to its tap panel. `data`: `graph_data(graph, keep, ...)` computed already, with the same arguments
    (the app's worker computes it, off the server's event loop)."""
    nodes, edges = data if data is not None else graph_data(graph, keep, src_tokens=src_tokens, tgt_tokens=tgt_tokens,
                                                            max_edges=max_edges, contexts=contexts)
    node_src = ColumnDataSource(nodes, name="graph_nodes")
    edge_src = ColumnDataSource(edges, name="graph_edges")
    n_kept = len(nodes["x"])
    word = _context(graph.nodes[-1], src_tokens, tgt_tokens)
    fig = figure(width=width, height=height, tools="pan,wheel_zoom,reset,save", toolbar_location="right",
                 title=title or f"why {word!r} (output {graph.position}): logit {graph.logit:.2f}, "
                                f"{n_kept} of {len(graph.nodes)} nodes",
                 name="attribution_graph")
    lines = fig.multi_line(xs="xs", ys="ys", line_color="color", line_width="width", line_alpha=0.35,
                           source=edge_src)
    lines.selection_glyph = lines.glyph.clone(line_alpha=0.9)
    lines.nonselection_glyph = lines.glyph.clone(line_alpha=0.06)
    dots = fig.scatter(x="x", y="y", size="size", fill_color="color", fill_alpha="alpha", line_color="#222222",
                       source=node_src, name="graph_dots")
    dots.selection_glyph = dots.glyph.clone(line_color="#000000", line_width=3, fill_alpha=1.0)
    dots.nonselection_glyph = dots.glyph.clone(fill_alpha=0.25, line_alpha=0.4)
    fig.add_tools(HoverTool(renderers=[dots], tooltips=[("node", "@label"), ("context", "@context"),
                                                        ("attribution", "@attribution{0.000}"),
                                                        ("influence", "@influence{0.000}"),
                                                        ("attends to", "@attention")]))
    fig.add_tools(TapTool(renderers=[dots]))
    # the logit node names its word; the other nodes' pieces are on the x axis (hover or tap a node for its name)
    fig.add_layout(LabelSet(x="x", y="y", text="tag", source=node_src, text_font_size="11px", y_offset=14,
                            text_align="center", text_color="#000000", text_font_style="bold"))
    _label_axes(fig, graph, nodes["index"], src_tokens, tgt_tokens)
    fig.title.text_font_size = "13px"

    side = _tap_panel(node_src, edge_src, side_width, corpus, fig)
    legend = Div(text="&nbsp;&nbsp;".join(f'<span style="color:{c}">&#9679;</span>&nbsp;{k}'
                                          for k, c in KIND_COLORS.items())
                 + f'&nbsp;&nbsp; edges: <span style="color:{POSITIVE}">raise</span> / '
                   f'<span style="color:{NEGATIVE}">lower</span> the target node; size: influence',
                 name="graph_legend", styles={"font-size": "12px"})
    return fig, side, legend


def attribution_graph_view(graph, keep: Sequence[int] | torch.Tensor | None = None, *,
                           src_tokens: Sequence[str] | None = None, tgt_tokens: Sequence[str] | None = None,
                           title: str = "", width: int = 1000, height: int = 640, max_edges: int = 400,
                           contexts: dict | None = None, corpus: str = ""):
    """The interactive graph (see the module docstring): one Bokeh layout, the figure with its tap panel beside
    it and the legend under it."""
    fig, side, legend = attribution_graph_parts(graph, keep, src_tokens=src_tokens, tgt_tokens=tgt_tokens,
                                                title=title, width=width, height=height, max_edges=max_edges,
                                                contexts=contexts, corpus=corpus)
    return column(row(fig, side), legend, name="attribution_graph_view")


def selected_detail(layout) -> dict | None:
    """What the tap panel of a view (any layout holding its `graph_nodes` source) shows for its current
    selection: that node's fields from the node data the panel reads; None when nothing is selected."""
    src = layout.select_one({"name": "graph_nodes"})
    if src is None or not src.selected.indices:
        return None
    i = src.selected.indices[0]
    return {k: v[i] for k, v in src.data.items()}


def graph_json(graph, keep=None, **kw) -> str:
    """The view's data as JSON (nodes and edges), for other front ends."""
    nodes, edges = graph_data(graph, keep, **kw)
    return json.dumps({"nodes": nodes, "edges": edges, "logit": graph.logit, "position": graph.position,
                       "token": graph.token})

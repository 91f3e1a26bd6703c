"""An attribution graph (workbench.analysis.graph) as an interactive Bokeh view: data in, Bokeh layout out.

    keep = graph.prune(0.8)
    view = attribution_graph_view(graph, keep, src_tokens=src_words, tgt_tokens=tgt_words)
    save_html(view, "graph.html")            # offline: the tap interaction is client-side JavaScript

Layout: the encoder on the left (x = source position), the decoder on the right (x = target position), one row per
sub-layer from the embeddings up (heads of one block side by side within their position), the logit on top. Edges
between kept nodes, width by |weight|, red raises the target node's attribution, blue lowers it. Tapping a node
shows its label, attribution and influence, its context (the token at its position) and, for a head, its
attention row over the keys it read; its edges are highlighted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import torch
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, CustomJS, Div, HoverTool, LabelSet, TapTool
from bokeh.plotting import figure

POSITIVE, NEGATIVE = "#c0392b", "#2c6fbb"
KIND_COLORS = {"embed": "#7f8c8d", "bias": "#bdc3c7", "error": "#95a5a6", "ffn": "#27ae60", "logit": "#000000",
               "self_attn": "#8e44ad", "cross_attn": "#d35400"}


def _rows(graph) -> dict[tuple, int]:
    """(stack, layer, block) -> row index from the bottom."""
    rows: dict[tuple, int] = {}
    n_enc = max((n["layer"] for n in graph.nodes if n["stack"] == "enc" and n["layer"] is not None), default=-1) + 1
    rows["enc", None, "embed"] = 0
    for i in range(n_enc):
        rows["enc", i, "self_attn"] = 1 + 2 * i
        rows["enc", i, "ffn"] = 2 + 2 * i
    n_dec = max((n["layer"] for n in graph.nodes if n["stack"] == "dec" and n["layer"] is not None), default=-1) + 1
    rows["dec", None, "embed"] = 0
    for i in range(n_dec):
        for j, b in enumerate(("self_attn", "cross_attn", "ffn")):
            rows["dec", i, b] = 1 + 3 * i + j
    return rows


def graph_data(graph, keep: Sequence[int] | torch.Tensor | None = None, *, src_tokens: Sequence[str] | None = None,
               tgt_tokens: Sequence[str] | None = None, max_edges: int = 400) -> tuple[dict, dict]:
    """Column data for the kept nodes and the strongest edges among them (testable without a browser)."""
    keep = list(range(len(graph.nodes))) if keep is None else [int(i) for i in keep]
    rows = _rows(graph)
    S = graph.meta.get("src_len", 0)
    gap = 2
    top_row = max(rows.values()) + 1
    heads = max((n["head"] for n in graph.nodes if n["head"] is not None), default=0) + 1
    nodes: dict[str, list] = {k: [] for k in ("x", "y", "label", "kind", "color", "attribution", "influence",
                                              "context", "attention", "size", "index")}
    where = {}
    for i in keep:
        n = graph.nodes[i]
        kind = n["kind"]
        if kind == "logit":
            x, y = S + gap + n["position"], top_row
        elif kind == "bias":
            x, y = -2, 0
        else:
            base = n["position"] if n["stack"] == "enc" else S + gap + n["position"]
            if kind == "error":
                x, y = base + 0.4, rows.get((n["stack"], n["layer"], "ffn"), 0) - 0.5
            elif kind == "embed":
                x, y = base, 0
            else:
                off = ((n["head"] + 0.5) / heads - 0.5) * 0.8 if kind == "head" else 0.0
                x, y = base + off, rows[n["stack"], n["layer"], n["block"]]
        where[i] = (x, y)
        toks = src_tokens if n["stack"] == "enc" else tgt_tokens
        pos = n["position"]
        context = toks[pos] if toks is not None and pos is not None and pos < len(toks) else (n.get("token") or "")
        att = ""
        if kind == "head":
            keys = src_tokens if n["block"] == "cross_attn" or n["stack"] == "enc" else tgt_tokens
            weights = n.get("attention", [])
            order = sorted(range(len(weights)), key=lambda k: -weights[k])[:5]
            att = ", ".join(f"{keys[k] if keys is not None and k < len(keys) else k} {weights[k]:.2f}"
                            for k in order)
        nodes["x"].append(x)
        nodes["y"].append(y)
        nodes["label"].append(n["label"])
        nodes["kind"].append(kind)
        nodes["color"].append(KIND_COLORS.get(n["block"] if kind == "head" else kind, "#555555"))
        nodes["attribution"].append(float(graph.attribution[i]))
        nodes["influence"].append(float(graph.influence[i]))
        nodes["context"].append(str(context))
        nodes["attention"].append(att)
        nodes["size"].append(8 + 22 * min(1.0, float(graph.influence[i]) / max(float(graph.influence[:-1].max()),
                                                                                  1e-12)))
        nodes["index"].append(i)
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
        edges["width"].append(0.5 + 5 * abs(w) / peak)
        edges["weight"].append(w)
        edges["source"].append(keep[s])
        edges["target"].append(keep[t])
    return nodes, edges


def attribution_graph_view(graph, keep: Sequence[int] | torch.Tensor | None = None, *,
                           src_tokens: Sequence[str] | None = None, tgt_tokens: Sequence[str] | None = None,
                           title: str = "", width: int = 1000, height: int = 640, max_edges: int = 400):
    """The interactive graph (see the module docstring): a Bokeh column of the figure and a detail panel."""
    nodes, edges = graph_data(graph, keep, src_tokens=src_tokens, tgt_tokens=tgt_tokens, max_edges=max_edges)
    node_src = ColumnDataSource(nodes, name="graph_nodes")
    edge_src = ColumnDataSource(edges, name="graph_edges")
    word = tgt_tokens[graph.position + 1] if tgt_tokens is not None and graph.position + 1 < len(tgt_tokens) else ""
    fig = figure(width=width, height=height, tools="pan,wheel_zoom,reset,save", toolbar_location="above",
                 title=title or f"attribution graph of the logit at output position {graph.position} {word} "
                                f"(logit {graph.logit:.3f}; {len(nodes['x'])} nodes)", name="attribution_graph")
    lines = fig.multi_line(xs="xs", ys="ys", line_color="color", line_width="width", line_alpha=0.35, source=edge_src)
    lines.selection_glyph = lines.glyph.clone(line_alpha=0.9)
    lines.nonselection_glyph = lines.glyph.clone(line_alpha=0.06)
    dots = fig.scatter(x="x", y="y", size="size", fill_color="color", line_color="#222222", source=node_src)
    fig.add_tools(HoverTool(renderers=[dots], tooltips=[("node", "@label"), ("context", "@context"),
                                                        ("attribution", "@attribution{0.000}"),
                                                        ("influence", "@influence{0.000}"),
                                                        ("attends to", "@attention")]))
    fig.add_tools(TapTool(renderers=[dots]))
    labels = LabelSet(x="x", y="y", text="context", source=node_src, text_font_size="8px", y_offset=8,
                      text_align="center")
    fig.add_layout(labels)
    fig.xaxis.visible = False
    fig.yaxis.axis_label = "sub-layer (embeddings at the bottom, logit on top)"
    fig.grid.visible = False
    detail = Div(text="<i>tap a node: its context, its attention, its edges</i>", width=width, name="graph_detail")
    args = {"nodes": node_src, "edges": edge_src, "detail": detail}
    node_src.selected.js_on_change("indices", CustomJS(args=args, code="""
        const i = nodes.selected.indices[0];
        if (i === undefined) { return; }
        const d = nodes.data, e = edges.data, me = d.index[i];
        const sel = [];
        for (let k = 0; k < e.source.length; k++) { if (e.source[k] == me || e.target[k] == me) sel.push(k); }
        edges.selected.indices = sel;
        const esc = (s) => String(s).replace(/[&<>]/g, (c) => ({'&': '&amp;', '<': '&lt;', '>': '&gt;'}[c]));
        let html = `<b>${esc(d.label[i])}</b> (${esc(d.kind[i])}) &middot; context: <b>${esc(d.context[i])}</b>`
                 + ` &middot; attribution ${d.attribution[i].toFixed(3)}`
                 + ` &middot; influence ${d.influence[i].toFixed(3)}`;
        if (d.attention[i]) { html += `<br>attends to: ${esc(d.attention[i])}`; }
        html += `<br>${sel.length} edges shown`;
        detail.text = html;
    """))
    legend = Div(text=" ".join(f'<span style="color:{c}">&#9679;</span> {k}' for k, c in KIND_COLORS.items()),
                 width=width)
    return column(fig, row(legend), detail, name="attribution_graph_view")


def graph_json(graph, keep=None, **kw) -> str:
    """The view's data as JSON (nodes and edges), for other front ends."""
    nodes, edges = graph_data(graph, keep, **kw)
    return json.dumps({"nodes": nodes, "edges": edges, "logit": graph.logit, "position": graph.position,
                       "token": graph.token})

"""The "Graph" tab: the attribution graph of one output token of the current translation
(`analysis.graph.attribution_graph`, drawn by `charts.graph`), pruned by influence, with a tap panel and an offline
export.

- Pick an output token (buttons for short outputs, a list for long ones: the picker follows the output length), the
  influence threshold (default 0.8: the fewest nodes holding 80 % of the influence on the logit) and a node cap.
- The graph: layered by layer, encoder left, decoder right; node size and opacity by influence, edge width by
  weight; hover names a node. Tapping a node shows beside the graph what it is: its context token, attribution and
  influence, its strongest edges in and out and, for a head, its attention row at that query position over the keys
  (bars labelled with the pieces) and, with *Corpus contexts* on, the test sentences where its head or FFN writes
  most (`analysis.graph.component_contexts` on 60 Multi30k test2016 sentences of the model's language pair,
  measured once per model: about 2 s on one core for the shipped de→en model). The tap is client-side, so the
  exported file behaves the same offline.
- Export: one self-contained HTML file (Bokeh INLINE, no CDN), `<checkpoint>_graph_tok<i>-thr<t>-cap<n>.html`,
  captioned with the sentence, the translation, the checkpoint and the token.

The graph is heavy work (the page's heavy lane): `graph_answer`, in a worker process when the server has a pool
(`workers.py`; it gets a `work.Snapshot` of the result, never the page's model). Its cost grows with the square of
its node count (the dense adjacency): about 0.03 s + 5e-8 s × nodes² on one idle core here (shipped
multi30k-de-en, last output token: 1,681 nodes at 36 source pieces 0.15 s, 3,457 nodes at 89 pieces 0.54 s, 4,930
at 143 pieces 1.6 s), said before it is built; its progress is reported per sub-layer and a newer request stops it
between sub-layers. Graphs above MAX_GRAPH_NODES nodes are refused with a message saying why (the matrix alone takes
nodes² × 8 bytes). The page keeps its last graph and sends it with a job that only changes the threshold or the cap,
so that job only prunes again.

*Dictionary features* builds the graph over the checkpoint's SAE and transcoder features instead
(`analysis.feature_graph`: features replace the heads and FFNs their dictionaries cover, one error node per site and
position; a tapped feature's panel names its site and id, its Features-tab dashboard shows what it does).

The token, threshold, cap, corpus-contexts and features switches and the tapped node are in the URL (`?gtok=&gthr=
&gcap=&gctx=&gfeat=&gnode=`, see `link.py`); a link's value the tab cannot use is named in the page's message and
dropped from the URL.
Added by `Workbench(extra_tabs=[TAB])`.
"""

from __future__ import annotations

import json
import os
import re
import time
from io import StringIO

import panel as pn
import param
import torch
from bokeh.layouts import row

from ..analysis.attribution.feature_graph import feature_details, feature_graph, feature_graph_size
from ..analysis.attribution.graph import attribution_graph, component_contexts, graph_size
from ..analysis.attribution.graph_export import circuit_tracer_graph, token_probability
from ..analysis.attribution.graph_trust import graph_trust
from ..analysis.attribution.qk_attribution import feature_piece, qk_attribution, qk_dictionaries
from ..charts.export import to_html
from ..charts.features import feature_node_html
from ..charts.graph import attribution_graph_parts, attribution_graph_view, graph_data, row_labels
from ..charts.qk import qk_caption, qk_pairs_table
from ..core.batching import decoder_input
from ..corpus.data import dataset_files
from . import loader, workers
from .features_view import feature_data, sites_of
from .learn import link_terms
from .link import MESSAGE
from .requests import PROGRESS_EVERY
from .views import LazyTab, _md_escape
from .work import Offloaded, Snapshot

MAX_BUTTONS = 20  # up to this many output tokens are picked with buttons; longer outputs get a list
MAX_GRAPH_NODES = 5000  # larger graphs are refused: a 5,000-node adjacency is 200 MB of float64
SECONDS, SECONDS_PER_NODE2 = 0.03, 5e-8  # measured: graph construction plus pruning, one idle core of this machine
GRAPHS_IN_WORKERS = os.environ.get("WORKBENCH_APP_GRAPHS_IN_WORKERS", "1") != "0"  # see GraphView.compute
CONTEXT_SENTENCES = 60  # test sentences the corpus contexts are measured on (about 2 s on one core, once per model)


def _corpus(src_lang: str, tgt_lang: str) -> tuple[list[str], list[str], str] | None:
    try:
        src, ref = dataset_files("multi30k", "test", src_lang, tgt_lang, download=False)
        s = src.read_text(encoding="utf-8").splitlines()[:CONTEXT_SENTENCES]
        r = ref.read_text(encoding="utf-8").splitlines()[:CONTEXT_SENTENCES]
    except (FileNotFoundError, OSError, ValueError):
        return None
    return s, r, f"{len(s)} Multi30k test2016 sentences, teacher-forced on their references"


def model_contexts(tm, check=None) -> tuple[dict, str] | None:
    """(`component_contexts` of a TranslationModel on the test set of its language pair, where they were
    measured), once per model and process; None when no such test set is here."""
    def measure():
        corpus = _corpus(tm.meta.get("src_lang", ""), tm.meta.get("tgt_lang", ""))
        if corpus is None:
            return None
        return component_contexts(tm, corpus[0], corpus[1], check=check), corpus[2]

    return loader.load_derived("contexts", tm, measure)  # `loader.CACHE`, with the model's checkpoint


def estimate(nodes: int) -> tuple[float, float]:
    """(seconds, megabytes) a graph of `nodes` nodes takes to build here (one core) and to hold."""
    return SECONDS + SECONDS_PER_NODE2 * nodes**2, 8 * nodes**2 / 1e6


def sentence_tensors(tm, src_ids, out_ids, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The source and the decoder input up to `position` as (1, L) tensors on the model's device."""
    cfg = tm.model.cfg
    src = torch.tensor([list(src_ids)], device=tm.device)
    tgt = torch.tensor([decoder_input(list(out_ids)[: position + 1], cfg.start_id)], device=tm.device)
    return src, tgt


TRUSTED_TOP = 10  # the computed nodes whose predicted effect is shown beside a real removal


def trust_md(trust) -> str:
    """The trust panel: each top node's predicted effect (frozen model) beside removing it in the real model."""
    rows = [f"| {_md_escape(label)} | {pred:+.3f} | {real:+.3f} |"
            for label, kind, pred, real in zip(trust.labels, trust.kinds, trust.predicted, trust.real)
            if kind != "embed"]
    embeds = [(p, r) for k, p, r in zip(trust.kinds, trust.predicted, trust.real) if k == "embed"]
    emb = ""
    if embeds:
        pred = sum(abs(p) for p, _ in embeds) / len(embeds)
        real = sum(abs(r) for _, r in embeds) / len(embeds)
        emb = (f" Embeddings, apart: {len(embeds)} nodes, mean |predicted| {pred:.3f} against mean |real| "
               f"{real:.3f}.")
    rho = "n/a" if trust.spearman != trust.spearman else f"{trust.spearman:.2f}"
    return (f"**How far to trust it.** *Predicted*: a node's attribution, what removing it changes the logit by "
            f"with attention patterns and norms frozen. *Real*: the logit change when the model itself runs without "
            f"that node. Rank correlation over the top {len(rows)} computed nodes: **ρ = {rho}**.{emb}\n\n"
            "| node | predicted | real |\n|---|---|---|\n" + "\n".join(rows))


def checkpoint_dictionaries(tm) -> list:
    """The dictionaries the checkpoint ships (its features/ folder), loaded once per model (`feature_data`)."""
    return [feature_data(tm, d).d for d in sites_of(tm)]


def build_graph(tm, src_ids, out_ids, src_pieces, out_pieces, position: int, progress=None, features: bool = False):
    """The attribution graph of output token `position` of a translation (its logit, the token the model chose),
    nodes labelled with the pieces; with `features`, over the checkpoint's dictionary features
    (`analysis.feature_graph`: its SAE and transcoder features replace the heads and FFNs they cover)."""
    src, tgt = sentence_tensors(tm, src_ids, out_ids, position)
    labels = {"src_tokens": list(src_pieces), "tgt_tokens": ["<s>", *out_pieces[:position]], "progress": progress}
    if features:
        return feature_graph(tm.model, checkpoint_dictionaries(tm), src, tgt, position=position,
                             token=int(out_ids[position]), **labels)
    return attribution_graph(tm.model, src, tgt, position=position, token=int(out_ids[position]), **labels)


def graph_answer(r, key: tuple, position: int, threshold: float, max_nodes: int, with_contexts: bool = False,
                 features: bool = False, kept: tuple | None = None, ticket=None) -> dict:
    """The tab's work for result `r` (a `work.Snapshot` in a worker process): the graph of output token `position`
    (or `kept`, the page's (graph, trust) of the same `key`: then only the pruning runs again), its trust panel, the
    pruning, the corpus contexts (once per model and process) and the token's probability. Progress per sub-layer
    through `ticket`, which also stops it between sub-layers."""
    tm, src_ids, out_ids = r.model, r.src_ids, r.out_ids
    seconds, (graph, trust) = 0.0, kept or (None, None)
    if graph is None:
        def progress(done: int, total: int, what: str = "") -> None:
            if ticket is not None:
                ticket.check()  # a newer token or sentence supersedes this graph: stop between sub-layers
                ticket.report(done, total)

        start = time.perf_counter()
        graph = build_graph(tm, src_ids, out_ids, r.src_pieces, r.out_pieces, position, progress, features)
        seconds = time.perf_counter() - start
    if trust is None:  # one batched forward of the real model: each top node removed alone
        trust = graph_trust(tm.model, *sentence_tensors(tm, src_ids, out_ids, position), graph, top=TRUSTED_TOP)
    keep = graph.prune(threshold, max_nodes)
    contexts, corpus = None, ""
    if with_contexts:
        if ticket is not None:
            ticket.report(0, 0, "Measuring where each head and FFN writes most in a test corpus (once per model)")
        found = model_contexts(tm, check=None if ticket is None else ticket.check)
        contexts, corpus = found if found is not None else (None, "no test set of this language pair here")
    if ticket is not None:
        ticket.check()
    src_tokens, tgt_tokens = list(r.src_pieces), ["<s>", *r.out_pieces]
    # the drawing's node and edge columns, here (in the worker) rather than on the server's event loop
    drawn = graph_data(graph, keep, src_tokens=src_tokens, tgt_tokens=tgt_tokens, contexts=contexts)
    return {"graph": graph, "keep": keep, "position": position, "threshold": threshold, "max_nodes": max_nodes,
            "src_tokens": src_tokens, "tgt_tokens": tgt_tokens, "drawn": drawn, "seconds": seconds,
            "piece": r.out_pieces[position], "contexts": contexts, "corpus": corpus, "trust": trust, "key": key,
            "token_prob": token_probability(tm.model, *sentence_tensors(tm, src_ids, out_ids, position), graph)}


FEATURE_CONTEXTS, FEATURE_EFFECTS = 5, 8  # a tapped feature node's top contexts and output tokens


def feature_node(tm, node: dict) -> dict:
    """A tapped feature node's dashboard content (`analysis.feature_graph.feature_details`: top contexts and output
    effects) from the checkpoint's dictionaries (the Features tab's, by site name)."""
    return feature_details(tm, {p.name: p for p in sites_of(tm)}, node, contexts=FEATURE_CONTEXTS,
                           effects=FEATURE_EFFECTS)


QK_TOP = 12  # query x key pairs listed for a tapped cross-attention head


def edge_qk(tm, src_ids, out_ids, src_pieces, out_pieces, position: int, layer: int, head: int, t: int, s: int,
            features: bool = True, kind: str = "cross") -> dict:
    """Why head (layer, head) of the `kind` attention ("cross", "enc_self", "dec_self") at query position t attends
    to key s, in the graph's sentence: `analysis.qk_attribution` (with the checkpoint's dictionaries when `features`
    and it ships any), its top pairs as a table, each feature named by the piece its top corpus contexts fall on
    most."""
    src, tgt = sentence_tensors(tm, src_ids, out_ids, position)
    fds = [feature_data(tm, d) for d in sites_of(tm)] if features else []
    dicts = qk_dictionaries(tm.model, [fd.d for fd in fds])
    start = time.perf_counter()
    qk = qk_attribution(tm.model, src, tgt, layer=layer, head=head, t=t, s=s, kind=kind, dictionaries=dicts)
    seconds = time.perf_counter() - start
    names = {}
    stats = {fd.site.name: fd for fd in fds if fd.d in dicts and fd.stats is not None}
    top = qk.frame(k=QK_TOP)
    for site, f in [(i.get("site"), i.get("feature")) for i in (*qk.query_info, *qk.key_info)
                    if i["kind"] == "feature"]:
        if site in stats and (site, f) not in names and f in set(top["query_feature"]) | set(top["key_feature"]):
            fd = stats[site]
            piece, share = feature_piece(fd.stats, f, fd.site.side)
            tok = tm.src_tokenizer if fd.site.side == "src" else tm.tgt_tokenizer
            names[site, f] = "" if piece is None else f"{tok.pieces([piece])[0]} {share:.0%}"
    tgt_tokens = ["<s>", *out_pieces[:position]]
    return {"qk": qk, "seconds": seconds, "caption": qk_caption(qk, list(src_pieces), tgt_tokens),
            "table": qk_pairs_table(qk, src_tokens=list(src_pieces), tgt_tokens=tgt_tokens, k=QK_TOP,
                                    feature_names=names),
            "dictionaries": qk.meta["dictionaries"]}


class GraphView(LazyTab):
    """The attribution graph of the chosen output token of the session's current sentence and model."""

    position = param.Selector(default=0, objects={"0": 0}, doc=("The output word to explain: the graph shows which "
                                                                "parts of the model pushed it up or down."))
    threshold = param.Number(default=0.8, bounds=(0.05, 1.0), step=0.05,
                             doc=("Keep the fewest nodes that together carry this share of the influence on the word "
                                  "(0.8 = 80 %)."))
    max_nodes = param.Integer(default=100, bounds=(5, 400), doc=("Draw at most this many nodes, the most influential "
                                                                 "first."))
    contexts = param.Boolean(default=True, doc=("When a node is tapped, also show the test sentences where that head "
                                                "or feed-forward layer writes most."))
    node = param.Integer(default=-1, bounds=(-1, None), doc=("The node tapped in the graph: its detail, its strongest "
                                                             "edges and (a head) its attention show beside it."))
    qk_key = param.Integer(default=-1, bounds=(-1, None), doc=("The source token at which a tapped head's attention "
                                                               "score is explained (at first, the one it attends to "
                                                               "most)."))
    qk_features = param.Boolean(default=True, doc=("Explain the score with the checkpoint's dictionary features "
                                                   "(when it ships any) instead of whole heads and FFNs."))
    features = param.Boolean(default=False, doc=("Build the graph over the checkpoint's dictionary features (sparse "
                                                 "features replace the heads and feed-forward layers they cover); "
                                                 "only for a checkpoint that ships dictionaries."))

    title = "Graph"
    follows = ("version",)
    redraws = ("position", "threshold", "max_nodes", "contexts", "features")
    heavy = True  # analysis work: the page's heavy lane, one heavy job at a time
    url = {"position": "gtok", "threshold": "gthr", "max_nodes": "gcap", "contexts": "gctx", "node": "gnode",
           "qk_key": "gqk", "qk_features": "gqkf", "features": "gfeat"}
    url_late = ("position", "node", "qk_key")

    def __init__(self, **params):
        super().__init__(**params)
        self._link_node: int | None = None  # a link's node, checked when its graph is drawn
        self._drawn: tuple = (None, [])  # (the drawn graph's node source, the graph indices of its nodes)
        self._answer: dict | None = None
        self._shown: tuple = (None, None)  # (result, checkpoint label) the shown graph is of
        self._cost = ""
        self._picker = pn.Column(sizing_mode="stretch_width")
        # why a tapped head attends where it does (QK attribution): a light lane of its own
        self._qk_lane = self.session.lane(f"GraphQK-{id(self)}")
        self._qk_box = pn.Column(sizing_mode="stretch_width", css_classes=["graph-qk"])
        self._qk_node = -1  # the node the shown attribution is of
        self._qk_link = True  # until the first head is explained, `qk_key` may be a link's, for the link's node
        # a tapped feature node (feature graphs): its dashboard link, top contexts and output effects; a light lane
        self._feature_lane = self.session.lane(f"GraphFeature-{id(self)}")
        self._feature_box = pn.Column(sizing_mode="stretch_width", css_classes=["graph-feature"])
        self._page_link = None  # the page's link (`bind_link`): a feature's dashboard link is this page on it
        self._picker_many: bool | None = None
        self._bar = pn.indicators.Progress(value=0, max=1, width=240, css_classes=["graph-progress-bar"])
        # one progress line, its text changed in place: a new pane per report cost the server's event loop a tenth
        # of its time while a graph was built beside six clicking pages (py-spy, bench_app --contention --browser)
        self._progress_line = pn.pane.Markdown("", css_classes=["graph-progress"])
        self._progress_at = 0.0  # when the last sub-layer report was shown
        self._export = pn.widgets.FileDownload(callback=self.export_html, filename="graph.html",
                                               label="Export graph (offline HTML)", color="light",
                                               css_classes=["graph-export"], width=230, disabled=True)
        self._export_ct = pn.widgets.FileDownload(callback=self.export_circuit_tracer, filename="graph.json",
                                                  label="circuit-tracer JSON", color="light", width=170,
                                                  css_classes=["graph-export-ct"], disabled=True)
        self._controls = pn.FlexBox(  # wraps: at 1000 px the switches and the two downloads do not fit one line
            pn.widgets.FloatSlider.from_param(self.param.threshold, name="Influence threshold", width=200,
                                              css_classes=["graph-threshold"]),
            pn.widgets.IntInput.from_param(self.param.max_nodes, name="Node cap", width=110,
                                           css_classes=["graph-cap"]),
            pn.widgets.Checkbox.from_param(self.param.contexts, name="Corpus contexts", align="end",
                                           css_classes=["graph-contexts"], margin=(5, 10, 12, 10)),
            pn.widgets.Checkbox.from_param(self.param.features, name="Dictionary features", align="end",
                                           css_classes=["graph-features"], margin=(5, 10, 12, 10)),
            self._export, self._export_ct, align_items="flex-end", sizing_mode="stretch_width")
        self.session.param.watch(self._follow, "result")
        self._follow()

    def bind_link(self, link) -> None:
        """As `LazyTab`'s; a link's node is kept until its graph is drawn, then selected (its panel opens) or, when
        that graph does not draw it, named in the page's message and dropped."""
        self._page_link = link
        for name, key in self.url.items():
            check = self._link_node_check if name == "node" else None
            link.bind(key, self, name, late=name in self.url_late, check=check)

    def _link_node_check(self, node: int) -> tuple[int, list[str]]:
        self._link_node = node if node >= 0 else None
        return node, []

    # -- following the page -------------------------------------------------------------------------
    def _follow(self, *_) -> None:
        """A new result: the token picker follows the output (a token past its end falls back to the first)."""
        r = self.session.result
        if r is None:
            return
        if self.session.requests.background:
            workers.warm(str(r.request.path))  # the worker processes load this checkpoint before the first graph
        n = len(r.out_pieces)
        # The choices first, then the value, each event on its own (in one batch a widget can get the value before
        # the options it is among: issue 28); with events, so the picker and the URL show the graph's token.
        self.param.position.objects = {f"{i}: {p}": i for i, p in enumerate(r.out_pieces)} or {"0": 0}
        if self.position >= n:
            self.position = 0
        many = n > MAX_BUTTONS
        if many != self._picker_many:
            self._picker_many = many
            self._picker.objects = [
                pn.widgets.Select.from_param(self.param.position, name="Output token", width=260,
                                             css_classes=["graph-token-list"]) if many else
                pn.widgets.RadioButtonGroup.from_param(self.param.position, name="", css_classes=["graph-tokens"])]

    # -- the work -----------------------------------------------------------------------------------
    def inputs(self):
        r = self.session.result
        if r is None:
            return "*Nothing to explain yet: translate a sentence.*"
        if not r.out_ids:
            return "*The output is empty: no token to explain.*"
        position = min(self.position, len(r.out_ids) - 1)
        tm = r.model
        features = bool(self.features)
        if features and not sites_of(tm):
            return ("*This checkpoint ships no dictionaries (its features/ folder is empty or missing): untick "
                    "*Dictionary features* for the graph over heads and feed-forward layers.*")
        nodes = (feature_graph_size(tm.model, checkpoint_dictionaries(tm), *sentence_tensors(tm, r.src_ids, r.out_ids,
                                                                                             position), position)
                 if features else graph_size(tm.model, len(r.src_ids), position))
        seconds, mb = estimate(nodes)
        if nodes > MAX_GRAPH_NODES:
            return (f"*The graph of output token {position} would have {nodes:,} nodes ({len(r.src_ids)} source "
                    f"tokens, {position + 1} decoder positions): its {nodes:,} × {nodes:,} matrix takes {mb:,.0f} MB, "
                    f"above this page's limit of {MAX_GRAPH_NODES:,} nodes. Pick an earlier output token or a shorter "
                    "sentence; in a notebook `workbench.analysis.attribution_graph` builds any size.*")
        # the time estimate is measured for head graphs; a feature graph's nodes cost more (a few times as long)
        built = "over dictionary features" if features else f"about {max(seconds, 0.1):.1f} s to build on an idle core"
        self._cost = (f"{len(r.src_ids)} source tokens, {position + 1} decoder positions: {nodes:,} nodes, "
                      f"{built}, {mb:,.0f} MB")
        key = (r.request.translate_key, position, features)
        # a graph of this key any page built travels with the job (loader.CACHE): only the pruning runs again
        kept = loader.CACHE.peek("graph", r.request.path, *key)
        return (Snapshot.of(r), key, position, float(self.threshold), int(self.max_nodes), bool(self.contexts),
                features, kept)

    # Heavy: in a worker process when the server has a pool (`workers.py`); WORKBENCH_APP_GRAPHS_IN_WORKERS=0 keeps
    # graphs in the server's heavy threads instead (nice 10).
    compute = Offloaded(graph_answer) if GRAPHS_IN_WORKERS else staticmethod(graph_answer)

    @staticmethod
    def _keep(answer: dict) -> None:
        """Keep the answer's graph and trust checks for its key, for a re-pruning job of any page (`loader.CACHE`,
        the one checkpoint cache: a few graphs in all, each up to 200 MB)."""
        key = answer["key"]
        loader.CACHE.put("graph", key[0][0], (answer["graph"], answer["trust"]), *key)

    def progress(self, done: int, total: int, what: str = "") -> None:
        """A job's report: a stage (`what`) or sub-layer `done` of `total`; sub-layers shown at most 4 times a second
        (the first and the last always), each by changing the shown line and bar, not by new panes."""
        self._box.loading = False  # the text (and the bar) say it is working
        if what:
            self._progress_line.object = f"*{_md_escape(what)}…*"
            self._show_progress([self._progress_line])
            self._progress_at = 0.0  # the next sub-layer report replaces the stage at once
            return
        now = time.monotonic()
        if 0 < done < total and now - self._progress_at < PROGRESS_EVERY:
            return
        self._progress_at = now
        self._bar.max = max(total, 1)
        self._bar.value = min(done, total)
        self._progress_line.object = f"*Building the graph ({_md_escape(self._cost)}): sub-layer {done} of {total}…*"
        self._show_progress([self._progress_line, self._bar])

    def _show_progress(self, parts: list) -> None:
        if len(self._box.objects) != len(parts) or any(a is not b for a, b in zip(self._box.objects, parts)):
            self._box.objects = parts

    def figure(self, answer: dict, *, width: int = 1000):
        """(figure, side panel, legend) of an answer."""
        return attribution_graph_parts(answer["graph"], answer["keep"], src_tokens=answer["src_tokens"],
                                       tgt_tokens=answer["tgt_tokens"], width=width,
                                       height=max(420, min(720, 40 * (len(row_labels(answer["graph"])) + 1))),
                                       contexts=answer["contexts"], corpus=answer["corpus"],
                                       data=answer.get("drawn"))

    def _settings(self) -> tuple | None:
        """What decides a drawing's nodes, as the page asks now: the sentence, the output token, the pruning and
        the node kind (`inputs`' reading of them); None before a result."""
        r = self.session.result
        if r is None or not r.out_ids:
            return None
        return (r.request.translate_key, min(self.position, len(r.out_ids) - 1), float(self.threshold),
                int(self.max_nodes), bool(self.features))

    @staticmethod
    def _settings_of(answer: dict) -> tuple:
        translate_key, _, features = answer["key"]
        return (translate_key, answer["position"], float(answer["threshold"]), int(answer["max_nodes"]),
                bool(features))

    def _drawn_current(self) -> bool:
        """Whether the drawing shown is of the settings the page asks for now. It is not while a newer one is
        being built: a link's token and node are applied after the first answer (`url_late`), so the node can
        arrive while the graph of the default token is shown; it then waits for its own graph (the copied link's
        panel that never opened on fresh clones, stops 47 and 49)."""
        return self._answer is not None and self._settings_of(self._answer) == self._settings()

    def _done(self, answer) -> None:
        """As `LazyTab`'s; an answer for settings the page no longer asks for is not drawn (the newer job that
        the change started brings the page's own; until then the box keeps its state)."""
        if isinstance(answer, dict) and "key" in answer and self._settings_of(answer) != self._settings():
            return
        super()._done(answer)

    def render(self, answer) -> list:
        self._keep(answer)
        self._answer = answer
        self._shown = (self.session.result, self.session.checkpoint)  # what the export's caption names
        fig, side, legend = self.figure(answer)
        fig.sizing_mode, fig.min_width = "stretch_width", 300
        g, keep = answer["graph"], answer["keep"]
        kept = len(keep) - 1
        covered = float(g.influence[keep[:-1]].sum() / g.influence[:-1].sum()) if kept else 0.0
        built = (f" Built in {answer['seconds']:.2f} s ({self._cost})." if answer["seconds"]
                 else f" ({self._cost}; the graph was kept, only the pruning ran again.)")
        note = (f"Why **{_md_escape(answer['piece'])}** at output position {answer['position']}: logit "
                f"{g.logit:.3f}; the edges into it sum to it within "
                f"{abs(float(g.adjacency[-1].sum()) - g.logit):.1e}. "
                f"{kept + 1} of {len(g.nodes):,} nodes drawn (the logit's included), holding {covered:.0%} of the "
                f"other nodes' influence (threshold "
                f"{answer['threshold']:g}, cap {answer['max_nodes']}).{_md_escape(built)}"
                + (f" Corpus contexts: {_md_escape(answer['corpus'])}." if answer["corpus"] else ""))
        self._export.filename = self.export_name()
        self._export.disabled = False
        self._export_ct.filename, self._export_ct.disabled = self.export_name()[:-5] + ".json", False
        self._qk_box.objects, self._qk_node = [], -1
        self._select_node(fig)
        self._qk_refresh()
        self._feature_refresh()
        objs = [pn.pane.Markdown(link_terms(note), css_classes=["graph-note"], sizing_mode="stretch_width"),
                # no margin of its own: the stretched row already spans the tab (a margin pushed it 5 px past the page)
                pn.pane.Bokeh(row(fig, side, sizing_mode="stretch_width"), sizing_mode="stretch_width",
                              css_classes=["graph-figure"], margin=0),
                self._qk_box,
                self._feature_box,
                pn.pane.Bokeh(legend),
                pn.Card(pn.pane.Markdown(trust_md(answer["trust"]), css_classes=["graph-trust"],
                                         sizing_mode="stretch_width"),
                        title="How far to trust this graph: predicted vs real removals", collapsed=False,
                        sizing_mode="stretch_width")]
        return objs

    def _select_node(self, fig) -> None:
        """Tie the drawn graph's selection to `node` both ways: a tap sets it (and so the URL), and the node it
        names is selected in each new drawing that has it, so its panel opens."""
        source = fig.select_one({"name": "graph_nodes"})
        if source is None:
            return
        drawn = [int(i) for i in source.data["index"]]
        source.selected.on_change("indices", lambda _attr, _old, new: self._tapped(drawn, new))
        self._drawn = (source, drawn)
        self._show_node()

    @param.depends("node", watch=True)
    def _show_node(self) -> None:
        """Select `node` in the drawn graph (the side panel is the figure's own JavaScript, run on a selection
        change and once the figure is laid out): in a new drawing's first state, in a shown one on the next tick.
        A node the graph does not draw is dropped; a link's is also named, like any refused value of a link."""
        source, drawn = self._drawn
        if source is None or not self._drawn_current():
            return  # the drawing of the page's settings selects it when it comes (`_select_node`)
        link_node, self._link_node = self._link_node, None
        if self.node < 0:
            return
        if self.node not in drawn:
            if link_node == self.node:
                self.session.notes = [*self.session.notes, f"{MESSAGE}gnode={self.node} (not drawn in this graph)"]
            self.node = -1
            return
        indices = [drawn.index(self.node)]
        if list(source.selected.indices) == indices:
            return
        doc = pn.state.curdoc
        if source.document is None or doc is None or doc.session_context is None:
            # A drawing not on the page yet (from `render`): its first state carries the selection, and the
            # figure's own JavaScript opens the panel once it is laid out (`charts.graph`, on `inner_width`). A
            # change event instead could reach the browser before the figure did ("reference … isn't known" there,
            # and the panel of a copied link's node never opened).
            source.selected.indices = indices
            return
        doc.add_next_tick_callback(lambda: setattr(source.selected, "indices", indices))

    def _tapped(self, drawn: list[int], indices) -> None:
        self.node = drawn[indices[0]] if len(indices) else -1

    # -- a tapped feature node ---------------------------------------------------------------------------
    @param.depends("node", watch=True)
    def _feature_refresh(self) -> None:
        """A tapped feature node: the link to its dashboard (this page on the Features tab at its site and feature,
        checkpoint and sentence kept) at once, then its top contexts and output effects from the feature's
        dashboard data (`feature_node`); any other node (or none) clears the box."""
        if self._answer is not None and not self._drawn_current():
            return  # a newer drawing is coming; its `render` refreshes this for its own nodes
        a, r = self._answer, self._shown[0]
        nodes = [] if a is None else a["graph"].nodes
        n = nodes[self.node] if 0 <= self.node < len(nodes) else None
        self._feature_lane.cancel()
        if n is None or r is None or n["kind"] != "feature":
            self._feature_box.loading, self._feature_box.objects = False, []
            return
        site, feature = n["site"], int(n["feature"])
        href = (n["link"] if self._page_link is None
                else self._page_link.href(tab="features", site=site, feature=feature))
        shown = {"site": site, "feature": feature}  # the link at once; the contexts and effects when read
        self._feature_box.objects = [pn.pane.HTML(feature_node_html(shown, href), sizing_mode="stretch_width")]
        self._feature_box.loading = True

        def done(answer) -> None:
            self._feature_box.loading = False
            if isinstance(answer, Exception):
                text = f"*Its contexts and output effects could not be read: {_md_escape(str(answer))}*"
                self._feature_box.objects = [*self._feature_box.objects[:1], pn.pane.Markdown(text)]
                return
            self._feature_box.objects = [pn.pane.HTML(feature_node_html(answer, href), sizing_mode="stretch_width")]

        self._feature_lane.submit(feature_node, r.model, dict(n), done=done, failed=done)

    # -- why a tapped head attends where it does -----------------------------------------------------
    @param.depends("node", "qk_key", "qk_features", watch=True)
    def _qk_refresh(self) -> None:
        """A tapped head: its score at the key it attends most (or `qk_key`), split into query x key pairs, computed
        in the tab's QK lane; any other node (or none) clears the table."""
        if self._answer is not None and not self._drawn_current():
            return  # a newer drawing is coming (a link's node and key wait for it: `_drawn_current`)
        a, r = self._answer, self._shown[0]
        nodes = [] if a is None else a["graph"].nodes
        n = nodes[self.node] if 0 <= self.node < len(nodes) else None
        if n is None or r is None or n["kind"] != "head":
            self._qk_lane.cancel()
            self._qk_box.loading, self._qk_box.objects, self._qk_node = False, [], -1
            return
        kind = "cross" if n["block"] == "cross_attn" else f"{n['stack']}_self"
        row = [float(w) for w in n["attention"]]
        if kind == "dec_self":  # causal: the keys up to the query
            row = row[: n["position"] + 1]
        if self.node != self._qk_node:  # a newly tapped head starts at the key it attends most
            first, self._qk_node = self._qk_node == -1 and self._qk_link, self.node
            if self.qk_key != -1 and not first:  # (a link's key is kept for the head it came with)
                self.qk_key = -1  # the watcher runs this again, with the new key
                return
        self._qk_link = False
        if self.qk_key >= len(row):  # a link's key this head does not have: named, and the head's own used
            self.session.notes = [*self.session.notes, f"{MESSAGE}gqk={self.qk_key} (not a key of this head)"]
            self.qk_key = -1
            return
        s = self.qk_key if self.qk_key >= 0 else max(range(len(row)), key=row.__getitem__)
        self._qk_box.loading = True
        self._qk_lane.submit(edge_qk, r.model, r.src_ids, r.out_ids, r.src_pieces, r.out_pieces, a["position"],
                             n["layer"], n["head"], n["position"], s, bool(self.qk_features), kind,
                             done=lambda answer: self._qk_done(answer, row, s), failed=self._qk_done)

    def _qk_done(self, answer, row=None, s=None) -> None:
        self._qk_box.loading = False
        if isinstance(answer, Exception):
            self._qk_box.objects = [pn.pane.Markdown(f"*Why this head attends: failed ({_md_escape(str(answer))})*",
                                                     css_classes=["graph-qk-error"])]
            return
        r, kind = self._shown[0], answer["qk"].meta["kind"]
        pieces = ["<s>", *r.out_pieces] if kind == "dec_self" else list(r.src_pieces)
        keys = pn.widgets.Select(label="Explain its score at key", width=280, css_classes=["graph-qk-key"],
                                 options={f"{k}: {pieces[k] if k < len(pieces) else k} ({w:.2f})": k
                                          for k, w in enumerate(row)}, value=s)
        keys.param.watch(lambda e: setattr(self, "qk_key", int(e.new)), "value")
        feats = pn.widgets.Checkbox.from_param(self.param.qk_features, name="Dictionary features", align="end",
                                               css_classes=["graph-qk-features"], margin=(5, 10, 12, 10))
        used = ", ".join(answer["dictionaries"]) or "none (whole heads and FFNs)"
        self._qk_box.objects = [
            pn.pane.Markdown(link_terms(f"**Why this head attends here** (QK attribution): "
                                        f"{_md_escape(answer['caption'])}. Query part × key part terms, largest "
                                        f"first; a head's part is what it moved from the piece after ←. "
                                        f"Dictionaries: {_md_escape(used)}. Computed in {answer['seconds']:.2f} s."),
                             css_classes=["graph-qk-note"], sizing_mode="stretch_width"),
            pn.Row(keys, feats),
            pn.pane.DataFrame(answer["table"], index=False, css_classes=["graph-qk-table"],
                              sizing_mode="stretch_width")]

    # -- export -------------------------------------------------------------------------------------
    def export_name(self) -> str:
        """`<checkpoint>_graph_tok<i>-thr<t>-cap<n>.html` of the graph shown."""
        a = self._answer
        ckpt = re.sub(r"[^A-Za-z0-9._-]+", "-", self._shown[1] or self.session.checkpoint or "none").strip("-")
        if a is None:
            return f"{ckpt}_graph.html"
        return f"{ckpt}_graph_tok{a['position']}-thr{a['threshold']:g}-cap{a['max_nodes']}.html"

    def export_html(self) -> StringIO:
        """The graph shown, as one offline HTML file with a caption: a fresh layout, not the page's."""
        a, (r, checkpoint) = self._answer, self._shown
        if a is None or r is None:
            return StringIO("<p>nothing to export</p>")
        caption = (f"Sentence: {r.request.sentence}\n{'Target (teacher-forced)' if r.forced else 'Translation'}: "
                   f"{r.text}\nCheckpoint: {checkpoint}\nAttribution graph of output token "
                   f"{a['position']} ({a['piece']}): threshold {a['threshold']:g}, at most {a['max_nodes']} nodes")
        view = attribution_graph_view(a["graph"], a["keep"], src_tokens=a["src_tokens"], tgt_tokens=a["tgt_tokens"],
                                      width=1000, contexts=a["contexts"], corpus=a["corpus"])
        return StringIO(to_html(view, title=self.export_name()[:-5], caption=caption))

    def export_circuit_tracer(self) -> StringIO:
        """The graph shown as circuit-tracer's graph file (its viewer's JSON; pruned as circuit-tracer prunes, not by
        this tab's threshold and cap): docs/analysis.md, "Graphs as files other tools read"."""
        a, (r, _) = self._answer, self._shown
        if a is None or r is None:
            return StringIO("{}")
        data = circuit_tracer_graph(a["graph"], slug=self.export_name()[:-5], token_prob=a["token_prob"],
                                    token_str=a["piece"], prompt=f"{r.request.sentence} → {r.text} [{a['piece']}]")
        return StringIO(json.dumps(data, ensure_ascii=False))

    def __panel__(self):
        return pn.Column(pn.pane.Markdown(link_terms("Pick an output token: the attribution graph of the components "
                                                     "that wrote its logit. Tap a node to see what it is.")),
                         self._picker, self._controls, self._box, sizing_mode="stretch_width")


TAB = ("Graph", lambda session: GraphView(session=session))
"""The tab as `Workbench(extra_tabs=[TAB])` takes it."""

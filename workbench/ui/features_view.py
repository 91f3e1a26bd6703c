"""The "Features" tab: sparse-dictionary features of the checkpoint (`CHECKPOINT/features/<site>/`), on the
current sentence and one at a time.

- The features active on each token of the current sentence (source tokens for encoder-side dictionaries, decoder
  positions with the model's own output for decoder-side ones); each feature id is a link to its dashboard.
- One feature's dashboard (`charts.features.feature_dashboard`): how often it fires, its top-activating corpus
  contexts with the aligned output word, its activation histogram, the output tokens it raises and through which
  cross-attention heads.
- Search by token: the features whose top contexts fire on it.
- "Why this word": pick an output token (the list follows the output's length); the features that drive it most
  (`features.attribution.feature_attribution`: activation x the decoder direction's gradient of its
  log-probability), each with the source piece (or decoder position) it fires on and a button that opens its
  dashboard, next to the dictionary's error and bias terms.

- Steering: a value for the shown feature ("5" clamps it at every position, "+5" / "-2" add to it) gives the
  sentence's translation with the feature steered beside the plain one (`translate(steer=...)` with the dictionary
  spliced in for the request: `features.splice`; the shared model's outputs stay unchanged for other sessions).

The dictionary, the feature, the search, the "why this word" token and the steering value are in the page's URL
(`?site=NAME&feature=ID&fq=&fout=&steer=`, see `link.py`), so a link opens on them. Work on the
page's request path (`LazyTab`): heavy work (`explore`, in a worker process when the server has a pool, `workers.py`;
it gets a `work.Snapshot` of the page's result, never its model). Added by `Workbench(extra_tabs=[TAB])`.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import panel as pn
import param
from panel.custom import JSComponent

from ..charts.features import feature_dashboard, sentence_features_html
from ..core.splice import FeatureEdit
from ..features.attribution import feature_attribution
from ..features.dashboard import FeatureData
from ..features.evaluate import baseline_table, card_spread
from ..features.sites import splice
from . import loader
from .learn import link_terms
from .link import MESSAGE
from .views import LazyTab, _md_escape
from .work import Offloaded, Snapshot

DICTIONARY_TERMS = link_terms(
    "Each dictionary (an SAE, or a transcoder for a feed-forward layer) is named by its site, architecture (topk: "
    "exactly k features active per token; skip transcoder: a transcoder with a linear bypass) and width, and by its "
    "card's L0 (features active per token) and FVU (what it fails to reconstruct).")
CARD_TERMS = link_terms(
    "Read its row against the baselines at the same L0: PCA (as many principal components) and a random dictionary. "
    "A dictionary worth its features reconstructs better (lower FVU) and keeps more of the loss (CE recovered); ΔCE "
    "and KL are in nats.")
WHY_TOP = 8  # features listed under "Why this word"
DASHBOARD_CONTEXTS = 12  # top contexts a dashboard lists (`feature_dashboard`'s default)
STEER_PATTERN = r"^(|[+-]?\d+(\.\d+)?|=-?\d+(\.\d+)?)$"  # "", "5", "+5", "-2.5", "=-2": FeatureEdit.parse's


def dictionaries_in(checkpoint: str | Path) -> list[Path]:
    """The dictionary directories shipped in a checkpoint directory (cfg.json + weights under features/)."""
    root = Path(checkpoint) / "features"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / "cfg.json").is_file() and (p / "sae_weights.safetensors").is_file())


def sites_of(tm) -> list[Path]:
    """The dictionary directories shipped with a loaded checkpoint (`dictionaries_in` its directory)."""
    return dictionaries_in(tm.meta.get("path", ""))


def site_label(directory: Path) -> str:
    """A dictionary as the picker names it: site, architecture and width, and its card's L0 and FVU."""
    try:
        cfg = json.loads((directory / "cfg.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return directory.name
    arch = str(cfg.get("architecture", "?")).replace("_", " ")  # SAELens's name: "topk", "topk skip transcoder"
    label = f"{directory.name} — {arch} {cfg.get('d_sae', '?')}"
    try:
        card = json.loads((directory / "eval.json").read_text(encoding="utf-8"))
        label += f", L0 {card['l0']:.0f}, FVU {card['fvu']:.3f}"
    except (OSError, ValueError, KeyError, TypeError):
        label += " (no card)"
    return label


def card_markdown(directory: Path) -> str | None:
    """The dictionary's card figures for the tab (from its eval.json, as `features eval --card` wrote them): the
    dictionary beside PCA and a random dictionary at its L0 (and a transcoder's FFN neurons), and its spread over
    seeds. None without a card, or with one written before the baselines."""
    try:
        e = json.loads((directory / "eval.json").read_text(encoding="utf-8"))
        lines = [f"Held out, teacher-forced: {e['split']} ({e['tokens']:,} tokens); dead and dense features counted on "
                 f"{e['density_tokens']:,} tokens of {e['density_split']}, where the baselines were fit.", "",
                 *baseline_table(e)]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    seeds = e.get("seeds") or {}
    if seeds.get("spread"):
        lines += ["", f"Over {seeds['count']} seeds of its recipe ({', '.join(map(str, seeds['values']))}):", "",
                  *card_spread(seeds, e)]
    else:
        lines += ["", "One trained seed: this card has no spread over seeds."]
    return "\n".join(lines)


def feature_data(tm, directory: Path) -> FeatureData:
    """One FeatureData per (checkpoint, dictionary) while cached (`loader.CACHE`, evicted with its model): loading
    reads a few MB once."""
    return loader.load_features(tm, directory, lambda: FeatureData.load(tm, directory))


def why_this_word(r, fd: FeatureData, output: int, *, top: int = WHY_TOP) -> dict:
    """The features that drive output token `output` of result `r` most, with the dictionary's error and bias."""
    output = min(max(int(output), 0), len(r.out_ids) - 1)
    fa = feature_attribution(r.model, fd.d, list(r.src_ids), list(r.out_ids[:-1]), output)
    per_position = [(piece, float(v)) for piece, v in zip(fa.pieces, fa.by_position())]
    return {"position": output, "piece": fa.piece, "side": fa.side, "value": fa.value, "rows": fa.top(top),
            "per_position": per_position,
            "active": int(fa.features.numel()), "features": float(fa.attributions.sum()),
            "error": float(fa.error.sum()), "bias": float(fa.bias.sum()), "total": float(fa.total.sum())}


def steer_sentence(r, fd: FeatureData, site: str, feature: int, text: str) -> dict:
    """Result `r`'s sentence translated (its beam and alpha) plainly and with `feature` steered by `text` ("5" clamps,
    "+5" adds), the dictionary spliced in for the two calls only."""
    edit = FeatureEdit.parse(text)
    tm, options = r.model, {"beam": r.request.beam, "alpha": r.request.alpha}
    with splice(tm.model, fd.d):
        plain = tm.translate([r.request.sentence], **options)[0]
        steered = tm.translate([r.request.sentence], steer={site: {feature: edit}}, **options)[0]
    return {"feature": feature, "edit": edit, "plain": plain, "steered": steered}


@dataclass(frozen=True)
class Dashboard:
    """What `charts.features.feature_dashboard` reads of a FeatureData for one feature (its summary, top contexts,
    histogram and output effects: forward passes over corpus contexts), measured where the work runs (a worker
    process); the page draws the dashboard from it as from the FeatureData itself, with the same figure."""

    feature: int
    summary_: dict
    contexts_: list
    histogram_: tuple
    effects: dict

    @classmethod
    def of(cls, fd: FeatureData, feature: int, contexts: int = DASHBOARD_CONTEXTS) -> Dashboard:
        return cls(feature, fd.summary(feature), fd.contexts(feature, contexts), fd.histogram(feature),
                   fd.output_effects(feature))

    def _same(self, feature: int) -> None:
        if feature != self.feature:
            raise ValueError(f"this dashboard is of feature {self.feature}, not {feature}")

    def summary(self, feature: int) -> dict:
        self._same(feature)
        return self.summary_

    def contexts(self, feature: int, limit: int | None = None) -> list:
        self._same(feature)
        return self.contexts_[:limit]

    def histogram(self, feature: int) -> tuple:
        self._same(feature)
        return self.histogram_

    def output_effects(self, feature: int) -> dict:
        self._same(feature)
        return self.effects


def explore(r, site: str, feature: int, query: str, output: int = 0, href: str = "?site={site}&feature={feature}",
            steer: str = "", ticket=None) -> dict:
    """The tab's answer for result `r` (a `work.Snapshot` in a worker process): sentence features, why output token
    `output` came out, the dashboard of `feature` (a `Dashboard`: `feature_dashboard` draws it), search hits, the
    sentence steered by `steer`. `href`: a feature's link, with `{site}` and `{feature}` to fill in. `ticket` stops it
    between those parts."""

    def check() -> None:
        if ticket is not None:
            ticket.check()  # a newer feature, search or sentence supersedes this answer

    tm = r.model
    dirs = {p.name: p for p in sites_of(tm)}
    if not dirs:
        return {"message": "No dictionaries ship with this checkpoint (its features/ folder is empty or missing): "
                           "train one with `workbench features train`."}  # no server path: it reaches the page
    name = site if site in dirs else next(iter(dirs))
    fd = feature_data(tm, dirs[name])
    out: dict = {"sites": list(dirs), "site": name, "n": fd.n_features,
                 "site_labels": {site_label(path): site for site, path in dirs.items()}}
    card = card_markdown(dirs[name])
    if card is not None:
        out["card"] = card
    target = None if fd.site.side == "src" else tm.tgt_tokenizer.decode(list(r.out_ids[:-1]))
    out["sentence"] = sentence_features_html(fd.sentence(r.request.sentence, target),
                                             link=href.replace("{site}", quote(name)))
    out["href"] = href.replace("{site}", quote(name))
    check()
    out["why"] = why_this_word(r, fd, output)
    check()
    if steer.strip():
        out["steer"] = steer_sentence(r, fd, name, min(max(int(feature), 0), fd.n_features - 1), steer)
        check()
    if fd.stats is None:
        out["note"] = "This dictionary has no corpus statistics (stats.safetensors): dashboards need them."
        return out
    feature = min(max(int(feature), 0), fd.n_features - 1)
    out["feature"] = feature
    out["dashboard"] = Dashboard.of(fd, feature)
    if query.strip():
        check()
        out["hits"] = search_all(tm, dirs, query, check=check)
        out["href_template"] = href
    return out


def _hit_html(hit: dict, template: str) -> str:
    """One search hit: its dictionary and feature as a link to that feature's dashboard, and how it matched."""
    href = html.escape(template.format(site=quote(hit["site"]), feature=hit["feature"]))
    side = "source" if hit["side"] == "src" else "output"
    return (f"<li><a href='{href}' data-feature='{hit['feature']}' data-site='{html.escape(hit['site'])}'>"
            f"{html.escape(hit['site'])} #{hit['feature']}</a> ({side} side): {hit['matches']} of its {hit['of']} "
            f"top contexts, mean {hit['mean']:.3f}</li>")


def search_all(tm, dirs: dict[str, Path], query: str, limit: int = 20, check=None) -> list[dict]:
    """Features of every dictionary of the checkpoint whose top contexts fire on `query`: encoder-side
    dictionaries match it among source pieces, decoder-side ones among output pieces, so a source word ("Hund")
    and a target word ("dog") both find theirs; ranked by the share of contexts that match, then the mean."""
    hits = []
    for name, path in dirs.items():
        if check is not None:
            check()
        fd = feature_data(tm, path)
        if fd.stats is None:
            continue
        hits += [{**h, "site": name, "side": fd.site.side} for h in fd.search(query, limit=limit)]
    hits.sort(key=lambda h: (-h["matches"] / h["of"], -h["mean"]))
    return hits[:limit]


class FeatureLinks(JSComponent):
    """HTML whose feature links open their feature in this page: a plain click on an `a[data-feature]` sets
    `clicked` ({"feature", "site", "n"}; site '' = the dictionary shown) instead of loading the link, so the page
    keeps its checkpoint, sentence, tab and every other setting without a reload. The link itself stays a real link
    to that state (a middle click, or one with a modifier key, opens it in a new tab as links do)."""

    html = param.String(default="", doc="The text shown, with a link to each feature it names.")
    clicked = param.Dict(default={}, doc="The feature link clicked last: its feature and dictionary.")

    _esm = """
    export function render({ model }) {
      const box = document.createElement("div");
      box.innerHTML = model.html;
      model.on("html", () => { box.innerHTML = model.html; });
      box.addEventListener("click", (event) => {
        const a = event.target.closest("a[data-feature]");
        if (!a || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) return;
        event.preventDefault();
        model.clicked = {feature: Number(a.dataset.feature), site: a.dataset.site || "", n: Date.now()};
      });
      return box;
    }
    """


def _without_feature_notes(notes: list[str]) -> list[str]:
    """The page's notes less an earlier refused feature id's: the newest refusal replaces it, never piles up."""
    return [n for n in notes if not (n.startswith("Feature ") and " does not exist" in n)]


class FeaturesView(LazyTab):
    site = param.String(default="", doc=("The sparse dictionary to read: which activation of the model it splits into "
                                         "features."))
    feature = param.Integer(default=0, bounds=(0, None), doc=("A feature's number: its dashboard shows where it fires "
                                                              "and which output words it raises."))
    query = param.String(default="", doc=("Find the features that fire on a word, in the source (e.g. Hund) or the "
                                          "output (e.g. dog)."))
    output = param.Selector(default=0, objects={"0": 0}, doc=("The output word to explain by the features that drive "
                                                              "it most."))
    steer = param.String(default="", regex=STEER_PATTERN, doc=(
        "Translate the sentence with the shown feature steered: 5 holds it at 5 on every word, +5 or -2 adds to "
        "it; empty turns steering off."))

    title = "Features"
    heavy = True  # dashboards and search read corpus statistics and run the model on corpus contexts
    follows = ("version",)
    redraws = ("site", "feature", "query", "output", "steer")
    url = {"site": "site", "feature": "feature", "query": "fq", "output": "fout", "steer": "steer"}
    url_late = ("site", "output")

    def __init__(self, **params):
        super().__init__(**params)
        self._link = None  # the page's link (`bind_link`): a feature's link is this page on that feature
        self._link_feature: int | None = None  # a link's feature, checked when the tab first shows a dashboard
        self._site_picker = pn.widgets.Select(name="Dictionary", options={}, width=380, css_classes=["features-site"],
                                              description=self.param.site.doc)  # its "?", as from_param gives
        self._syncing = False  # the picker is being set from an answer, not by the user
        # No bounds on the box: a negative id is refused aloud here (`_typed_feature`; a bounded box had kept its
        # last value without a word), and the end is checked when the dictionary is known (`render`)
        self._feature_box = pn.widgets.IntInput(name="Feature", value=self.feature, width=120,
                                                css_classes=["features-id"], description=self.param.feature.doc)
        self._feature_box.param.watch(self._typed_feature, "value")
        self.param.watch(lambda _e: self._show_feature(self.feature), "feature")  # the current one: an answer may
        # have replaced the value this event carries (an id past the end) before this watcher runs
        self._site_picker.param.watch(self._picked_site, "value")
        self._controls = pn.Row(
            self._site_picker,
            self._feature_box,
            pn.widgets.TextInput.from_param(self.param.query, name="Search by token", width=220,
                                            placeholder="e.g. Hund", css_classes=["features-search"]),
            pn.widgets.TextInput.from_param(self.param.steer, name="Steer this feature", width=160,
                                            placeholder="5 holds, +5 adds", css_classes=["features-steer-value"]))
        self._picker = pn.widgets.Select.from_param(self.param.output, name="Why this word: output token",
                                                    width=260, css_classes=["features-output"])
        self._sentence = None
        self.session.param.watch(self._follow, "result")
        self._follow()

    def _follow(self, *_) -> None:
        """A new result: the output-token list follows the output; a new sentence starts at its first token; a
        dictionary the result's checkpoint does not ship gives way to its first ('', what the tab then shows), so the
        URL (written at the answer's `version`) never names one a link to this page would refuse."""
        r = self.session.result
        if r is None:
            return
        with param.parameterized.batch_call_watchers(self):
            self.param.output.objects = {f"{i}: {p}": i for i, p in enumerate(r.out_pieces)}
            if self.output >= len(r.out_pieces) or r.request.sentence != self._sentence:
                with param.parameterized.discard_events(self):
                    self.output = 0
            if self.site and self.site not in [p.name for p in sites_of(r.model)]:
                with param.parameterized.discard_events(self):
                    self.site = ""
        self._sentence = r.request.sentence

    def bind_link(self, link) -> None:
        """As `LazyTab`'s, and a link's dictionary must be one the first result's checkpoint ships ('' = the first);
        its feature must be one of that dictionary's (checked when the tab computes: loading it is heavy)."""
        self._link = link
        for name, key in self.url.items():
            if name == "site":
                link.bind(key, self, name, late=True, check=self._site_check, empty_unset=True)
            elif name == "feature":
                link.bind(key, self, name, check=self._feature_check)
            else:
                link.bind(key, self, name, late=name in self.url_late)

    def _linked(self, text: str, css_class: str) -> FeatureLinks:
        """`text` with its feature links opening their feature here (`FeatureLinks`)."""
        links = FeatureLinks(html=text, css_classes=[css_class], sizing_mode="stretch_width")
        links.param.watch(self._clicked_link, "clicked")
        return links

    def _clicked_link(self, event) -> None:
        """A feature link clicked in the page: that dictionary (a search hit's) and feature, set in place."""
        feature, site = event.new.get("feature"), event.new.get("site") or self.site
        if not isinstance(feature, int | float) or feature < 0:
            return
        self.param.update(site=site, feature=int(feature))

    def _typed_feature(self, event) -> None:
        if self._syncing or event.new is None or event.new == self.feature:
            return
        if event.new < 0:  # said, like an id past the end, and the box shows the feature shown
            self.session.notes = [*_without_feature_notes(self.session.notes),
                                  f"Feature {event.new} does not exist: feature numbers start at 0; showing "
                                  f"{self.feature}."]
            self._show_feature(self.feature)
            return
        self.feature = event.new

    def _show_feature(self, feature: int) -> None:
        """The box shows the feature (a link's, a clicked one, or the one shown instead of an id past the end)."""
        self._syncing = True
        try:
            self._feature_box.value = feature
        finally:
            self._syncing = False

    def _picked_site(self, event) -> None:
        """A dictionary chosen in the picker: its first feature (ids differ between dictionaries). The picker's
        own updates from an answer (`render`) are not choices."""
        if self._syncing or not event.new or event.new == self.site:
            return
        self.param.update(site=event.new, feature=0)

    def _feature_check(self, feature: int) -> tuple[int, list[str]]:
        self._link_feature = feature  # checked against the dictionary when the tab shows it
        return feature, []

    def _site_check(self, site: str) -> tuple[str, list[str]]:
        r = self.session.result
        if r is None or site not in [p.name for p in sites_of(r.model)]:
            raise ValueError(site)
        return site, []

    def inputs(self):
        r = self.session.result
        if r is None:
            return "*No sentence yet.*"
        return (Snapshot.of(r), self.site, self.feature, self.query, min(self.output, len(r.out_ids) - 1),
                self._href(), self.steer)

    def _href(self) -> str:
        """A feature's link: this whole page (`link.Link.href`) on this tab, with `{site}` and `{feature}` to fill
        in; the placeholders go in as plain words (urlencode would escape braces) and come out as fields."""
        if self._link is None:
            return "?site={site}&feature={feature}"
        return (self._link.href(tab="features", site="SITEPLACEHOLDER", feature="FEATUREPLACEHOLDER")
                .replace("SITEPLACEHOLDER", "{site}").replace("FEATUREPLACEHOLDER", "{feature}"))

    compute = Offloaded(explore)  # heavy: in a worker process when the server has a pool (`workers.py`)

    def _open(self, feature: int) -> None:
        self.feature = feature

    def _why(self, why: dict, shown: int | None) -> pn.Column:
        where = "source" if why["side"] == "src" else "decoder position"
        rows = []
        for row in why["rows"]:
            button = pn.widgets.Button(label=f"#{row['feature']}", width=80, margin=(2, 5),
                                       color="primary" if row["feature"] == shown else "default",
                                       css_classes=["features-why-link"])
            button.on_click(lambda _e, f=row["feature"]: self._open(f))
            rows.append(pn.Row(button, pn.pane.HTML(
                f"<span class='features-why-row' data-feature='{row['feature']}'>{row['attribution']:+.4f} "
                f"on {where} {row['position']} <b>{html.escape(_shown(row['piece']))}</b> "
                f"<small>(activation {row['activation']:.3f})</small></span>", margin=(6, 5))))
        if not rows:
            rows.append(pn.pane.Markdown("*No feature is active on this sentence.*"))
        head = (f"**Why this word: {_md_escape(_shown(why['piece']))}** (output token {why['position']}, log p = "
                f"{why['value']:.3f}). " + link_terms(  # its terms linked, never the word's own text
                    "Each active feature's attribution is its activation times the gradient of log p along its decoder "
                    f"direction (first order, at the clean point). All {why['active']} active features give "
                    f"{why['features']:+.4f}, the dictionary's error {why['error']:+.4f} and bias {why['bias']:+.4f}: "
                    f"together {why['total']:+.4f}, the site's input × gradient. The top ones (a button opens the "
                    "feature's dashboard):"))
        cells = " ".join(f"<span title='{v:+.4f}' style='background:{_shade(v, why['per_position'])};"
                         f"padding:0 3px;margin:0 1px'>{html.escape(_shown(piece))}</span>"
                         for piece, v in why["per_position"])
        per_position = pn.pane.HTML(
            f"<div class='features-why-positions'>By {where} (features + error + bias: the site's input × gradient "
            f"there, red raises the word, blue lowers it): {cells}</div>", sizing_mode="stretch_width")
        return pn.Column(self._picker, pn.pane.Markdown(head, sizing_mode="stretch_width"), per_position, *rows,
                         css_classes=["features-why"], sizing_mode="stretch_width")

    def _elsewhere(self) -> list:
        """For a checkpoint without dictionaries: a button for each listed checkpoint that ships some (at most
        three: those of this checkpoint's language pair first, then the most dictionaries), which switches to it
        as the picker does, this tab kept."""
        pair = self.session.languages(self.session.checkpoint)
        shipping = [(e.label, len(dictionaries_in(e.path))) for e in self.session.entries
                    if e.label != self.session.checkpoint]
        shipping = sorted(((label, n) for label, n in shipping if n),
                          key=lambda item: (self.session.languages(item[0]) != pair, -item[1]))
        buttons = []
        for label, n in shipping[:3]:
            button = pn.widgets.Button(name=f"Open {label} ({n} dictionar{'y' if n == 1 else 'ies'})",
                                       css_classes=["features-open-other"], button_type="light")
            button.on_click(lambda _event, label=label: setattr(self.session, "checkpoint", label))
            buttons.append(button)
        return [pn.Row(*buttons)] if buttons else []

    def render(self, answer) -> list:
        link_feature, self._link_feature = self._link_feature, None
        if "feature" in answer and link_feature is not None and answer["feature"] != link_feature:
            # A link's feature past the dictionary's end: named like any refused value; the URL shows the one shown.
            self.session.notes = [*self.session.notes, f"{MESSAGE}feature={link_feature} (the dictionary has "
                                                       f"{answer['n']} features)"]
            with param.parameterized.discard_events(self):  # the answer already shows it: no second computation
                self.feature = answer["feature"]
            self._show_feature(answer["feature"])
            if self._link is not None:
                self._link.write()
        elif "feature" in answer and answer["feature"] != self.feature:
            # a feature typed past the dictionary's end: said, and the box and the URL show the one shown
            self.session.notes = [*_without_feature_notes(self.session.notes),
                                  f"Feature {self.feature} does not exist: this dictionary has features "
                                  f"0–{answer['n'] - 1}; showing {answer['feature']}."]
            with param.parameterized.discard_events(self):
                self.feature = answer["feature"]
            self._show_feature(answer["feature"])
            if self._link is not None:
                self._link.write()
        self._syncing = True
        try:  # the picker lists this answer's dictionaries (none: a checkpoint that ships none)
            labels = answer.get("site_labels", {})
            if self._site_picker.options != labels:
                self._site_picker.options = labels
            if "site" in answer and self._site_picker.value != answer["site"]:
                self._site_picker.value = answer["site"]
        finally:
            self._syncing = False
        if "message" in answer:
            return [self._controls, pn.pane.Markdown(_md_escape(answer["message"]), css_classes=["features-note"]),
                    *self._elsewhere()]
        objs = [self._controls,
                pn.pane.Markdown(DICTIONARY_TERMS, css_classes=["features-terms"], sizing_mode="stretch_width"),
                pn.pane.Markdown(f"**{answer['site']}** ({answer['n']} features; dictionaries here: "
                                 f"{', '.join(answer['sites'])}). Features active on each token of the sentence:",
                                 sizing_mode="stretch_width"),
                self._linked(answer["sentence"], "features-sentence")]
        if "card" in answer:
            objs.append(pn.Card(pn.pane.Markdown(answer["card"], sizing_mode="stretch_width"),
                                pn.pane.Markdown(CARD_TERMS, css_classes=["features-card-terms"],
                                                 sizing_mode="stretch_width"),
                                title="Its card: beside PCA and a random dictionary at its L0, over seeds",
                                collapsed=True, css_classes=["features-card"], sizing_mode="stretch_width"))
        if "steer" in answer:
            objs.append(_steered(answer["steer"]))
        if "note" in answer:
            objs.append(pn.pane.Markdown(_md_escape(answer["note"])))
        if "hits" in answer:
            rows = "".join(_hit_html(h, answer["href_template"]) for h in answer["hits"]) \
                or "<li>no feature of any dictionary fires on it</li>"
            objs.append(self._linked(f"<ul class='features-hits'>{rows}</ul>", "features-hits-box"))
        if "why" in answer:
            objs.append(self._why(answer["why"], answer.get("feature")))
        if "dashboard" in answer:
            objs.append(pn.pane.Bokeh(feature_dashboard(answer["dashboard"], answer["feature"]),
                                      css_classes=["features-dashboard"], sizing_mode="stretch_width"))
        return objs


def _steered(steer: dict) -> pn.pane.HTML:
    """The plain translation beside the steered one."""
    edit = steer["edit"]
    how = f"{edit.value:+g} added" if edit.add else f"held at {edit.value:g}"
    same = " (unchanged)" if steer["steered"] == steer["plain"] else ""
    return pn.pane.HTML(
        f"<div class='features-steer'><b>Steering feature #{steer['feature']}</b> ({how} on every word):"
        f"<table><tr><td>plain</td><td class='features-steer-plain'>{html.escape(steer['plain'])}</td></tr>"
        f"<tr><td>steered</td><td class='features-steer-steered'>{html.escape(steer['steered'])}{same}</td></tr>"
        "</table></div>", sizing_mode="stretch_width")


def _shade(v: float, values: list[tuple[str, float]]) -> str:
    top = max((abs(x) for _, x in values), default=0.0) or 1.0
    alpha = 0.85 * abs(v) / top
    return f"rgba(192,57,43,{alpha:.2f})" if v > 0 else f"rgba(41,98,255,{alpha:.2f})"


def _shown(piece: str) -> str:
    text = piece.replace("\u2581", " ").strip()
    return text or "\u2423"


TAB = ("Features", lambda session: FeaturesView(session=session))

"""The "Features" tab: sparse-dictionary features of the checkpoint (`CHECKPOINT/features/<site>/`), on the
current sentence and one at a time.

- The features active on each token of the current sentence (source tokens for encoder-side dictionaries, decoder
  positions with the model's own output for decoder-side ones); each feature id is a link to its dashboard.
- One feature's dashboard (`charts.features.feature_dashboard`): how often it fires, its top-activating corpus
  contexts with the aligned output word, its activation histogram, the output tokens it raises and through which
  cross-attention heads.
- Search by token: the features whose top contexts fire on it.

The feature shown is in the page's URL (`?feature=ID&site=NAME`), so a link opens on it. Interactive work on the
page's request path (`LazyTab`). Added by `Workbench(extra_tabs=[TAB])`.
"""

from __future__ import annotations

import html
import threading
from pathlib import Path
from urllib.parse import parse_qsl

import panel as pn
import param

from ..charts.features import feature_dashboard, sentence_features_html
from ..features.dashboard import FeatureData
from .views import LazyTab, _md_escape

_CACHE: dict[tuple[int, str], FeatureData] = {}
_LOCK = threading.Lock()


def sites_of(tm) -> list[Path]:
    """The dictionary directories shipped with a checkpoint (cfg.json + weights under features/)."""
    root = Path(tm.meta.get("path", "")) / "features"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / "cfg.json").is_file() and (p / "sae_weights.safetensors").is_file())


def feature_data(tm, directory: Path) -> FeatureData:
    """One FeatureData per (model, dictionary) for the process: loading reads a few MB once."""
    key = (id(tm), str(directory))
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = FeatureData.load(tm, directory)
        return _CACHE[key]


def explore(r, site: str, feature: int, query: str) -> dict:
    """The tab's answer for result `r`: sentence features, the dashboard of `feature`, search hits (figures)."""
    tm = r.model
    dirs = {p.name: p for p in sites_of(tm)}
    if not dirs:
        return {"message": f"No dictionaries ship with this checkpoint ({html.escape(str(tm.meta.get('path', '')))}"
                           "/features/ is empty): train one with `workbench features train`."}
    name = site if site in dirs else next(iter(dirs))
    fd = feature_data(tm, dirs[name])
    out: dict = {"sites": list(dirs), "site": name, "n": fd.n_features}
    target = None if fd.site.side == "src" else tm.tgt_tokenizer.decode(list(r.out_ids[:-1]))
    out["sentence"] = sentence_features_html(fd.sentence(r.request.sentence, target),
                                             link=f"?site={name}&feature={{feature}}")
    if fd.stats is None:
        out["note"] = "This dictionary has no corpus statistics (stats.safetensors): dashboards need them."
        return out
    feature = min(max(int(feature), 0), fd.n_features - 1)
    out["feature"] = feature
    out["dashboard"] = feature_dashboard(fd, feature)
    if query.strip():
        hits = fd.search(query)
        out["hits"] = hits
    return out


class FeaturesView(LazyTab):
    site = param.String(default="", doc="The dictionary (a folder under CHECKPOINT/features/)")
    feature = param.Integer(default=0, bounds=(0, None), doc="The feature whose dashboard is shown")
    query = param.String(default="", doc="Search features by the token they fire on")

    title = "Features"
    follows = ("version",)
    redraws = ("site", "feature", "query")

    def __init__(self, **params):
        link = _link()
        if "feature" in link and link["feature"].isdigit():
            params.setdefault("feature", int(link["feature"]))
        if "site" in link:
            params.setdefault("site", link["site"])
        super().__init__(**params)
        self.param.watch(self._to_url, ["site", "feature"])
        self._controls = pn.Row(
            pn.widgets.IntInput.from_param(self.param.feature, name="Feature", width=120,
                                           css_classes=["features-id"]),
            pn.widgets.TextInput.from_param(self.param.query, name="Search by token", width=220,
                                            placeholder="e.g. Hund", css_classes=["features-search"]))

    def _to_url(self, *_events) -> None:
        location = pn.state.location
        if location is not None and pn.state.curdoc is not None and pn.state.curdoc.session_context is not None:
            location.update_query(feature=self.feature, site=self.site)

    def inputs(self):
        r = self.session.result
        if r is None:
            return "*No sentence yet.*"
        return r, self.site, self.feature, self.query

    def compute(self, r, site, feature, query):
        return explore(r, site, feature, query)

    def render(self, answer) -> list:
        if "message" in answer:
            return [self._controls, pn.pane.Markdown(_md_escape(answer["message"]), css_classes=["features-note"])]
        objs = [self._controls,
                pn.pane.Markdown(f"**{answer['site']}** ({answer['n']} features; dictionaries here: "
                                 f"{', '.join(answer['sites'])}). Features active on each token of the sentence:",
                                 sizing_mode="stretch_width"),
                pn.pane.HTML(answer["sentence"], css_classes=["features-sentence"], sizing_mode="stretch_width")]
        if "note" in answer:
            objs.append(pn.pane.Markdown(_md_escape(answer["note"])))
        if "hits" in answer:
            rows = "".join(f"<li><a href='?site={answer['site']}&feature={h['feature']}' data-feature='{h['feature']}'>"
                           f"#{h['feature']}</a>: {h['matches']} of its {h['of']} top contexts, mean "
                           f"{h['mean']:.3f}</li>" for h in answer["hits"]) or "<li>no feature fires on it</li>"
            objs.append(pn.pane.HTML(f"<ul class='features-hits'>{rows}</ul>", sizing_mode="stretch_width"))
        if "dashboard" in answer:
            objs.append(pn.pane.Bokeh(answer["dashboard"], css_classes=["features-dashboard"]))
        return objs


def _link() -> dict[str, str]:
    location = pn.state.location
    if location is None or pn.state.curdoc is None or pn.state.curdoc.session_context is None:
        return {}
    return dict(parse_qsl((location.search or "").lstrip("?")))


TAB = ("Features", lambda session: FeaturesView(session=session))

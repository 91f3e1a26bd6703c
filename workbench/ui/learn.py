"""For a learner: a "Start here" tour through the Annotated Transformer's topics in order, and a glossary of the
app's terms of art, each a sentence a student can read (not a docstring).

The tour follows the texts this project teaches from (the Annotated Transformer and its companion posts on
positional encoding, masks and the schedule): embeddings and positions, masks, the three kinds of attention,
heads, the training schedule, label smoothing, decoding. Each step says what to look at and opens the place
that shows it (a tab, and where it matters an attention kind). `term("AER")` gives a term with its definition
as a hover title and a link to its glossary entry, for the views' own texts; a click on it opens the glossary at
that entry (`Glossary`).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass

import panel as pn
import param
from panel.custom import JSComponent

GLOSSARY: dict[str, str] = {
    "ablation": "Switching a part of the model off (e.g. multiplying one head's output by 0) to see what changes.",
    "activation patching": "Running the model on one sentence while copying one part's activation from another "
                           "sentence, to measure how much that part carries the difference.",
    "AER": "Alignment error rate: how far predicted word alignments are from a human's (0 % = perfect); lower is "
           "better. Computed against 'sure' and 'possible' gold links (Och & Ney 2003).",
    "ALTI+": "Aggregation of layer-wise token-to-token interactions (Ferrando et al. 2022): how much each source "
             "and target-prefix token contributes to a prediction, through every layer, summing to 1.",
    "attribution patching": "A fast linear estimate of activation patching from one gradient (Nanda 2023); it can "
                            "be far off when the change is large, so the app marks it as an estimate.",
    "beam search": "Decoding that keeps the k best partial translations at each step instead of only the best "
                   "word (greedy); k is the beam size.",
    "attribution graph": "The parts of the model (embeddings, heads, feed-forward layers or dictionary features) "
                         "that wrote one output word's logit, joined by how much each wrote into the next; the "
                         "edges into the logit add up to it.",
    "BLEU": "A translation score from 0 to 100 counting word n-grams shared with a reference translation "
            "(Papineni et al. 2002; computed with sacreBLEU).",
    "causal mask": "The decoder's mask: each output position may attend only to itself and earlier positions, so "
                   "in training it cannot peek at the word it must predict.",
    "CE recovered": "How much of the loss a dictionary keeps when it replaces the real activation: 100 % = as good "
                    "as the model, 0 % = as bad as removing the activation.",
    "cross-attention": "The decoder reading the encoder's output: each output position attends over the source "
                       "tokens. This is where the model 'looks at' the sentence it translates.",
    "dead feature": "A dictionary feature that never fires on the evaluation text.",
    "dictionary": "A sparse autoencoder (SAE) or transcoder trained on one activation of the model, its site: it "
                  "rewrites the activation as a few active features out of thousands, plus an error term.",
    "DLA": "Direct logit attribution: how much each component (head, layer, embedding) adds directly to the "
           "chosen word's logit, through the residual stream.",
    "EAP": "Edge attribution patching (Syed et al. 2023): attribution patching applied to every connection between "
           "components, to find a circuit.",
    "encoder self-attention": "Each source token attending to every other source token (no mask but padding).",
    "decoder self-attention": "Each output position attending to the output so far (the causal mask).",
    "FVU": "Fraction of variance unexplained: how much of an activation a dictionary fails to reconstruct "
           "(0 = perfect, 1 = no better than the mean).",
    "head": "One of the parallel attention computations of a layer; each has its own queries, keys and values and "
            "can attend to different things.",
    "L0": "How many dictionary features are active on a token, on average: the sparsity of a dictionary.",
    "label smoothing": "Training against a target that keeps 1 − ε on the reference word and spreads ε over the "
                       "vocabulary, so the model is not pushed to be certain (Szegedy et al. 2016).",
    "logit": "The model's raw score for a word before the softmax turns all the scores into probabilities: the "
             "higher the logit, the likelier the word.",
    "logit lens": "Reading an intermediate layer's state through the output layer, to see which word it already "
                  "points to.",
    "positional encoding": "A vector added to each token's embedding that says where it is in the sentence; "
                           "attention itself does not know order.",
    "QK attribution": "Why a head attends where it does: its attention score (query · key) split exactly into "
                      "terms, each a pair of a query-side and a key-side part of the model.",
    "rollout": "Attention rollout (Abnar & Zuidema 2020): attention multiplied through the layers, an estimate of "
               "how information flows from inputs to outputs.",
    "SAE": "Sparse autoencoder: a dictionary that rewrites an activation as a few active features out of many.",
    "teacher forcing": "Running the decoder on a given output (the reference, in training) instead of its own "
                       "previous words.",
    "transcoder": "A dictionary trained to imitate a feed-forward layer: sparse features in, the layer's output "
                  "out.",
    "warm-up": "The first training steps, in which the learning rate rises from 0 to its peak before it decays.",
    "argmax": "The position of the largest value: for an alignment, the one word on the other side that a word "
              "attends to most.",
    "EOS": "End of sentence: the token the model writes to stop. Heads with nothing to do often park their "
           "attention on it, so aligners usually leave it out.",
    "entropy": "How spread out a distribution is: 0 when all of a head's attention is on one token, ln n nats when "
               "it is spread evenly over n tokens.",
    "grow-diag": "A symmetrization rule (Koehn et al. 2003): start from the links both directions agree on, then add "
                 "links of either direction next to one already there (diagonals too) that align a word not yet "
                 "aligned.",
    "input × gradient": "An attribution: a token's embedding times the gradient of the output's log-probability "
                        "with respect to it, summed; a first-order guess of what removing the token would change.",
    "nats": "The unit of log-probabilities taken with the natural log: a change of 1 nat multiplies a probability "
            "by e (about 2.7), and 0.69 nats doubles it.",
    "PCA": "Principal component analysis: the directions along which an activation varies most. Kept to as many "
           "components as a dictionary has active features (its L0), it is the baseline a dictionary should beat.",
    "saliency": "An attribution: how much the output's log-probability reacts to each input token, read as the "
                "size of its gradient with respect to the token's embedding.",
    "scale ratio": "How the estimate's size compares with the exact measurement: the largest exact effect divided "
                   "by the largest estimated one (1 = the same scale, 10 = the estimate is 10 times too small).",
    "skip transcoder": "A transcoder with an extra linear path straight from the layer's input to its output, so its "
                       "sparse features only explain what that linear path misses.",
    "Spearman": "Spearman rank correlation: how alike two orderings are, from 1 (same order) through 0 (unrelated) "
                "to -1 (reversed), whatever the sizes of the values.",
    "symmetrization": "Combining the alignments read in the two directions (source to output and output to source) "
                      "into one set of links: intersect keeps the links both find, union those either finds.",
    "TopK": "A sparse autoencoder that keeps the k largest features on each token and sets the rest to 0, so "
            "exactly k are active (its L0 is k).",
}

ALIASES: dict[str, str] = {
    "symmetrized": "symmetrization",
    "topk": "TopK",
}
"""Other spellings of an entry that the views' texts use (a verb form, a library's lower-case name): linked to
that entry, showing the text's own spelling."""


def anchor(name: str) -> str:
    return "glossary-" + re.sub("-+", "-", "".join(ch if ch.isalnum() else "-" for ch in name.lower())).strip("-")


def term(name: str, shown: str | None = None) -> str:
    """HTML for a term of art in a view's text: its definition on hover, and a link to the glossary entry."""
    definition = GLOSSARY[name]
    return (f'<a class="term" href="#{anchor(name)}" title="{html.escape(definition, quote=True)}">'
            f"{html.escape(shown or name)}</a>")


_SPANS = re.compile(r"(`[^`]*`|<[^>]+>[^<]*</a>|<[^>]+>)")  # code spans, links with their text, other tags


def _pattern(name: str) -> re.Pattern:
    flags = 0 if any(c.isupper() for c in name) else re.IGNORECASE  # acronyms exactly; phrases in any case
    return re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w])", flags)


# (entry, spelling, its pattern), the longest spelling first
_PATTERNS = sorted(((ALIASES.get(spelling, spelling), spelling, _pattern(spelling))
                    for spelling in (*GLOSSARY, *ALIASES)), key=lambda t: -len(t[1]))


def link_terms(text: str) -> str:
    """A view's text (Markdown or HTML) with the first mention of each term of art linked to its glossary entry
    (`term`, keeping the text's own spelling, an `ALIASES` one too), outside code spans, links and tags; longer
    terms first, so "attribution patching" is one link, not "patching" inside it."""
    linked = set()
    for name, _spelling, pattern in _PATTERNS:
        if name in linked:  # by another of its spellings
            continue
        parts = _SPANS.split(text)  # again after each link: a shorter term must not match inside one
        for i in range(0, len(parts), 2):  # the even parts are plain text
            match = pattern.search(parts[i])
            if match is not None:
                parts[i] = parts[i][: match.start()] + term(name, match.group(0)) + parts[i][match.end():]
                text = "".join(parts)
                linked.add(name)
                break
    return text


def glossary_html() -> str:
    rows = "".join(f'<dt id="{anchor(name)}"><b>{html.escape(name)}</b></dt><dd>{html.escape(text)}</dd>'
                   for name, text in sorted(GLOSSARY.items(), key=lambda kv: kv[0].lower()))
    return f'<dl class="glossary">{rows}</dl>'


class Glossary(JSComponent):
    """The glossary's entries, and what makes every term of art in the page open it: a plain click on a `term`
    link anywhere (any tab, any view, inside their shadow DOM) expands the cards that hold the glossary, scrolls to
    the term's entry and highlights it, with no round trip to the server or the kernel.

    The views' texts are Markdown, HTML and Bokeh panes that know nothing of the glossary, and a `#anchor` link
    cannot reach an element in another shadow root (nor open a collapsed card). So, as `FeatureLinks` handles its
    own links in the browser, this component handles the terms' clicks there: one capturing listener on the
    document finds the `a.term` in the click's composed path. With two glossaries in one document (a notebook that
    shows two dashboards) the one in the clicked link's output opens; a term clicked where no glossary is shown
    keeps its hover title (the listener exists only once a glossary was drawn)."""

    html = param.String(default="", doc="The glossary's entries as HTML: each term of art and its definition.")

    _stylesheets = [""".glossary dt.glossary-hit, .glossary dt.glossary-hit + dd {
      background: #fff3bf; box-shadow: -6px 0 0 #f0c000; }
    .glossary dt.glossary-hit + dd { margin-left: 0; padding-left: 40px; }
    .glossary .glossary-back { font-weight: normal; margin-left: 1em; font-size: 0.9em; }"""]

    _esm = """
    export function render({ model, view }) {
      const box = document.createElement("div");
      box.innerHTML = model.html;
      model.on("html", () => { box.innerHTML = model.html; });
      const sameTerm = (from) => {
        const href = from.getAttribute("href"), words = from.textContent;
        const found = [];
        const walk = (root) => {
          for (const e of root.querySelectorAll("*")) {
            if (e.matches("a.term") && e.getAttribute("href") === href && e.textContent === words) found.push(e);
            if (e.shadowRoot) walk(e.shadowRoot);
          }
        };
        walk(document);
        return found.find((e) => e.getClientRects().length > 0) || null;  // the first one on show
      };
      // A scroll done now, after the next frame and again once opened cards or a redrawn text have laid out
      // (300 ms); a later show or back replaces the earlier one's scrolls still to come (a quick back had been
      // undone by the show's own late scroll).
      let turn = 0;
      const later = (scroll) => {
        const mine = ++turn, go = () => { if (mine === turn) scroll(); };
        go();
        requestAnimationFrame(() => requestAnimationFrame(go));
        setTimeout(go, 300);
      };
      const show = (id, from) => {
        const entry = box.querySelector(`dt[id="${CSS.escape(id)}"]`);
        if (!entry) return false;
        const y = window.scrollY;
        for (let v = view.parent; v != null; v = v.parent) {  // the cards around this glossary, opened
          if (v.model.collapsed === true) v.model.collapsed = false;
        }
        box.querySelectorAll(".glossary-hit").forEach((e) => e.classList.remove("glossary-hit"));
        box.querySelectorAll(".glossary-back").forEach((e) => e.remove());
        entry.classList.add("glossary-hit");
        const back = document.createElement("a");  // to the text the term was read in
        back.className = "glossary-back";
        back.href = "#";
        back.textContent = "↩ back to the text";
        back.addEventListener("click", (event) => {
          event.preventDefault();
          back.remove();
          // the text may have been drawn again since the click (a tab's answer arriving), or be drawn again in
          // the next moments: then the same term, by its anchor and words, where it is shown now, searched
          // through the page's shadow roots, now and again once a redraw under way has laid out
          let at = from;
          const home = () => {
            at = at.isConnected ? at : sameTerm(at) || at;
            if (at.isConnected) at.scrollIntoView({block: "center"});
            else window.scrollTo(0, y);
          };
          later(home);
        });
        entry.append(" ", back);
        later(() => entry.scrollIntoView({block: "center"}));
        return true;
      };
      const glossaries = (window.__workbenchGlossaries ||= new Map());
      glossaries.set(view, {show, root: view.root.el});
      model.on("remove", () => glossaries.delete(view));
      if (!window.__workbenchGlossaryClicks) {
        window.__workbenchGlossaryClicks = true;
        document.addEventListener("click", (event) => {
          if (event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) return;
          const path = event.composedPath();
          const a = path.find((e) => e instanceof Element && e.matches("a.term"));
          const id = a ? (a.getAttribute("href") || "").replace(/^#/, "") : "";
          if (!id) return;
          const all = [...window.__workbenchGlossaries.values()];
          const mine = all.filter((g) => path.includes(g.root));
          for (const g of [...mine.reverse(), ...all.reverse()]) {  // the link's own dashboard first, then the latest
            if (g.show(id, a)) {
              event.preventDefault();
              return;
            }
          }
        }, true);
      }
      return box;
    }
    """


@dataclass(frozen=True)
class Step:
    """One stop of the tour: what it teaches, where to look, and the place it opens."""

    topic: str
    text: str
    tab: str
    kind: str | None = None


TOUR: tuple[Step, ...] = (
    Step("1. Embeddings and positions",
         "Each source word becomes a vector; a positional encoding is added so the model knows word order. See "
         "your sentence's embeddings, their positions and the sum the encoder reads, then the sinusoids and how "
         "alike nearby positions are.", "internals"),
    Step("2. Masks", "Padding is never attended to, and the decoder may not look ahead (the causal mask).",
         "internals"),
    Step("3a. Encoder self-attention", "Every source word looks at every other source word, layer by layer.",
         "attention", "enc_self"),
    Step("3b. Decoder self-attention", "Each output word looks at the words written before it — a triangle.",
         "attention", "dec_self"),
    Step("3c. Cross-attention", "Each output word looks at the source: the closest thing to 'what is it "
         "translating now'. Try the grid view to see every head at once.", "attention", "cross"),
    Step("4. Heads", "Heads of one layer attend differently. Pick one, then ablate it (right panel) and see whether "
         "the translation changes.", "attention", "cross"),
    Step("5. Training schedule", "The learning rate warms up, then decays; the curves show the loss the checkpoint "
         "was trained to.", "internals"),
    Step("6. Label smoothing", "The target keeps 1 − ε on the reference word; see where the trained model really "
         "puts its probability.", "internals"),
    Step("7. Decoding", "Greedy takes the best word each step; beam search keeps several candidates. Change the beam "
         "in the sentence panel and compare.", "attention"),
)


def start_here(open_step: Callable[[Step], None]) -> pn.Card:
    """A collapsed card: the tour's steps, each with a button that opens its place (`open_step`), and the
    glossary."""
    rows = []
    for step in TOUR:
        button = pn.widgets.Button(label="Show me", color="light", width=90, css_classes=["tour-open"])
        button.on_click(lambda _event, s=step: open_step(s))
        rows.append(pn.Row(button, pn.pane.HTML(f"<b>{html.escape(step.topic)}</b> — {html.escape(step.text)}",
                                                sizing_mode="stretch_width"), sizing_mode="stretch_width"))
    glossary = pn.Card(Glossary(html=glossary_html(), sizing_mode="stretch_width"), title="Glossary",
                       collapsed=True, sizing_mode="stretch_width", css_classes=["glossary-card"])
    return pn.Card(*rows, glossary, title="Start here: a tour of the Transformer, in the order the Annotated "
                   "Transformer teaches it", collapsed=True, sizing_mode="stretch_width", css_classes=["start-here"])

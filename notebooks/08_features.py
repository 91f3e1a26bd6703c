# %% [markdown]
# # Features of a translation model: number features in the encoder output and the English words they drive
#
# Heads and neurons are not the units a model thinks in; a *sparse dictionary* rewrites an activation as a short
# sum of directions (features) learned to be sparse. The workbench ships TopK sparse autoencoders for the shipped
# German→English model (`checkpoints/multi30k-de-en/features/`): one on `hook_memory`, the encoder output that
# every cross-attention head reads, one per cross-attention block output, and a skip transcoder of the second
# decoder FFN, each in SAELens's file layout with a card of its held-out figures.
#
# This notebook looks for one concept, **German number words** (*zwei*, *drei*, …), among the `hook_memory`
# features, then asks what the best such feature does: which English words it raises, through which
# cross-attention heads, and whether removing it from held-out sentences lowers the number word in the
# translation more than removing another feature of the same size. Every figure below is computed here and the
# conclusions are printed from them.

# %% tags=["parameters"]
import os

QUICK = os.environ.get("WORKBENCH_QUICK", "0") == "1"  # CI sets WORKBENCH_QUICK=1: seconds on one CPU core

# %%
import json

import torch

from workbench import load
from workbench.checkpoint.shipped import shipped
from workbench.corpus.data import load_dataset
from workbench.features.dashboard import FeatureData

if QUICK:
    torch.set_num_threads(1)
tm = load(shipped("multi30k-de-en"))
site_dir = shipped("multi30k-de-en") / "features" / "hook_memory"
fd = FeatureData.load(tm, site_dir)
card_file = site_dir / "eval.json"  # written by `workbench features eval --card`
card = json.loads(card_file.read_text()) if card_file.is_file() else {}
print(f"{fd.name}: {fd.n_features} features, k = {fd.d.cfg.k}")
if card:
    print(f"held-out FVU {card['fvu']:.3f}, L0 {card['l0']:.1f}, CE recovered {card['ce_recovered']:.1%}"
          + (f", test2016 BLEU {card['bleu_clean']:.2f} clean vs {card['bleu_spliced']:.2f} spliced"
             if "bleu_clean" in card else ""))
print(f"statistics over {fd.stats.tokens:,} source tokens of {fd.stats.meta['corpus']}")

# %% [markdown]
# ## 1. Which features fire on German number words?
#
# For every feature we have its top-activating source tokens on the corpus (`stats.safetensors`). A feature's
# *number purity* is the share of those contexts whose firing token is a German number word; we rank the
# features by purity, then by how often they fire.

# %%
NUMBERS_DE = {"zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn", "zwölf"}
NUMBERS_EN = {"two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "twelve"}


def firing_word(fd, sentence, position):
    pieces = tm.src_tokenizer.pieces(fd.stats.sentences_src[sentence] + [tm.model.cfg.eos_id])
    return pieces[position].replace("\u2581", "").lower() if position < len(pieces) else ""


rows = []
for f in range(fd.n_features):
    ctx = fd.stats.contexts(f)
    if len(ctx) < 4:
        continue
    words = [firing_word(fd, j, p) for _, j, p in ctx]
    purity = sum(w in NUMBERS_DE for w in words) / len(words)
    rows.append((purity, float(fd.stats.frequency[f]), f, words))
rows.sort(key=lambda r: (-r[0], -r[1]))
for purity, freq, f, words in rows[:5]:
    print(f"feature {f:5d}: purity {purity:.0%}, fires on {freq:.2%} of tokens; top contexts fire on {words[:8]}")
best_purity, _, feature, _ = rows[0]
number_features = [f for purity, _, f, _ in rows if purity >= 0.5]
print(f"\n{len(number_features)} features have at least half of their top contexts on number words; "
      f"the purest is feature {feature} ({best_purity:.0%})")

# %% [markdown]
# ## 2. Its dashboard: contexts, activations, the output words it raises
#
# Contexts show the source sentence around the firing token and the English word aligned to it (the target
# position whose mean cross-attention on that token is largest, with teacher forcing on the reference). The
# output effect removes the feature's part of the encoder output (its activation times its decoder direction)
# at the firing token, from all cross-attention values at once and from each head's values alone, and reads the
# mean drop in log-probability of every vocabulary item at the aligned position.

# %%
import panel as pn  # noqa: E402

from workbench.charts.features import feature_dashboard  # noqa: E402
from workbench.ui.notebook import offline_notebook  # noqa: E402

pn.extension(inline=True)  # everything inlined: renders with no internet
offline_notebook()
for c in fd.contexts(feature, 6):
    print(f"{c.value:6.3f}  {c.source}  ->  aligned output word {c.aligned!r}")
pn.pane.Bokeh(feature_dashboard(fd, feature, contexts=10))

# %%
effects = fd.output_effects(feature, contexts=4 if QUICK else 12, top=10)
raised = [t["token"].replace("\u2581", "").lower() for t in effects["tokens"]]
number_share = sum(w in NUMBERS_EN for w in raised) / len(raised)
top_head = effects["heads"][0]
print(f"tokens feature {feature} raises most: {raised}")
print(f"{number_share:.0%} of its top-{len(raised)} raised tokens are English number words")
print(f"the head that carries most of it: layer {top_head['layer']} head {top_head['head']} "
      f"(mean drop {top_head['on_top_tokens']:.3f} on those tokens through its values alone; "
      f"all heads together: {sum(t['drop'] for t in effects['tokens']) / len(effects['tokens']):.3f})")

# %% [markdown]
# ## 3. A causal check on held-out sentences
#
# On test2016 sentences that contain a German number word the model translates into the matching English
# number, we remove, at the number word, every number feature found above that is active there (a concept is
# often split over several features) and measure the drop in log p(number word) at the output position that
# produces it; as a control we remove as many other active features there, those whose activations are closest
# in size.

# %%
from workbench.features import capture_site, splice_hooks  # noqa: E402, F401

DE_EN = dict(zip(["zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn", "zwölf"],
                 ["two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "twelve"]))
src_text, ref_text = load_dataset("multi30k", "test2016", "de", "en")
cases = []
for s, r in zip(src_text, ref_text):
    words_de = [w.strip(".,").lower() for w in s.split()]
    hit = next((w for w in words_de if w in DE_EN and DE_EN[w] in r.lower().split()), None)
    if hit:
        cases.append((s, r, hit))
all_cases, cases = cases[:60], cases[: 8 if QUICK else 60]
d = fd.d
eos = tm.model.cfg.eos_id


def log_prob_drop(src_ids, tgt_ids, position, out_pos, word_id, delta):
    src = torch.tensor([src_ids])
    tgt_in = torch.tensor([[tm.model.cfg.start_id, *tgt_ids]])

    def remove(x, hook):
        x = x.clone()
        x[0, position] -= delta
        return x

    with torch.no_grad():
        clean = tm.model(src, tgt_in).log_softmax(-1)[0, out_pos, word_id]
        with tm.model.hooks([("hook_memory", remove)]):
            ablated = tm.model(src, tgt_in).log_softmax(-1)[0, out_pos, word_id]
    return float(clean - ablated)


drops, controls, fired = [], [], 0
for s, r, word in cases:
    src_ids = tm.src_tokenizer.encode(s) + [eos]
    tgt_ids = tm.tgt_tokenizer.encode(r)
    pieces = [p.replace("\u2581", "").lower() for p in tm.src_tokenizer.pieces(src_ids)]
    if word not in pieces:
        continue
    position = pieces.index(word)
    en_pieces = [p.replace("\u2581", "").lower() for p in tm.tgt_tokenizer.pieces(tgt_ids)]
    if DE_EN[word] not in en_pieces:
        continue
    out_pos = en_pieces.index(DE_EN[word])  # the decoder position that predicts the number word
    word_id = tgt_ids[out_pos]
    acts = capture_site(tm.model, torch.tensor([src_ids]), torch.tensor([[tm.model.cfg.start_id]]), fd.site)
    with torch.no_grad():
        feats = d.encode(acts["hook_memory"][0, position])
    group = [f for f in number_features if feats[f] > 0]
    if not group:
        continue
    fired += 1
    pool = sorted((float(v), j) for j, v in enumerate(feats.tolist()) if v > 0 and j not in number_features)
    control = [min(pool, key=lambda p, a=float(feats[f]): abs(p[0] - a))[1] for f in group]
    with torch.no_grad():
        delta = sum(feats[f] * d.W_dec[f] for f in group)
        control_delta = sum(feats[j] * d.W_dec[j] for j in set(control))
    drops.append(log_prob_drop(src_ids, tgt_ids, position, out_pos, word_id, delta))
    controls.append(log_prob_drop(src_ids, tgt_ids, position, out_pos, word_id, control_delta))
mean = lambda xs: sum(xs) / max(len(xs), 1)
print(f"{len(cases)} held-out sentences with a number word translated as such; number features fire on the "
      f"number word in {fired}")
print(f"removing the active number features there lowers log p(number word) by {mean(drops):.3f} on average; "
      f"removing as many same-sized other active features: {mean(controls):.3f}")

# %% [markdown]
# ## 4. From the output word back to the features
#
# The dashboard goes from a feature to the words it raises; `feature_attribution` goes the other way, for one
# output token of one sentence. The encoder output is rewritten as the dictionary's reconstruction plus its error,
# and the metric is attributed to each active (source position, feature) as its activation times the gradient of
# the metric along the feature's decoder direction (first order, at the clean point); the features, the error and
# the decoder bias add up to the input × gradient of the whole encoder output. Here the metric is the English
# plural against its singular, logit(*dogs*) − logit(*dog*), at the noun that follows the number word: which
# source words' features make the translation plural, the German noun's or the number word's? (A noun whose
# German form is the same in singular and plural, such as *Mädchen*, would have to leave the number to the number
# word.) The attributions are first order; ablating the top three features against three random active ones
# checks them.

# %%
from workbench.features.attribution import ablate_features, feature_attribution  # noqa: E402

example = ("Zwei Hunde spielen an einem Baum.", "Two dogs play at a tree.")
ex = feature_attribution(tm, d, example[0], example[1], 1, metric="dog")
print(f"{example[0]} -> {example[1]}: {ex.metric} at {ex.piece!r} = {ex.value:.3f}; features "
      f"{float(ex.attributions.sum()):+.3f}, error {float(ex.error.sum()):+.3f}, bias {float(ex.bias.sum()):+.3f}, "
      f"sum {float(ex.by_position().sum()):+.3f} = input x gradient {float(ex.total.sum()):+.3f}")
ex.frame().head(8)

# %%
g = torch.Generator().manual_seed(0)
plural_rows = []
for s, r, word in all_cases:  # the first 60; in QUICK mode the first three that qualify
    if QUICK and len(plural_rows) == 3:
        break
    src_ids = tm.src_tokenizer.encode(s) + [eos]
    tgt_ids = tm.tgt_tokenizer.encode(r)
    pieces = [p.replace("\u2581", "").lower() for p in tm.src_tokenizer.pieces(src_ids)]
    en = tm.tgt_tokenizer.pieces(tgt_ids)
    en_words = [p.replace("\u2581", "").lower() for p in en]
    if word not in pieces or DE_EN[word] not in en_words:
        continue
    number_at, noun_out = pieces.index(word), en_words.index(DE_EN[word]) + 1
    # a one-piece English noun ending in -s after the number word, whose singular is one piece too
    if noun_out >= len(en) or not (en[noun_out].startswith("\u2581") and en[noun_out].endswith("s")):
        continue
    if noun_out + 1 < len(en) and not en[noun_out + 1].startswith("\u2581") and en[noun_out + 1] not in ".,":
        continue
    singular = tm.tgt_tokenizer.encode(en[noun_out][1:-1])
    if len(singular) != 1 or number_at + 1 >= len(pieces):
        continue
    fa = feature_attribution(tm, d, src_ids, tgt_ids, noun_out, metric=singular[0])
    if fa.value <= 0:  # the model does not prefer the plural here
        continue
    top10 = fa.top(10)
    best = top10[0]
    top3 = [(t["position"], t["feature"]) for t in fa.top(3)]
    active = fa.features.numel()
    randoms = [[(int(fa.positions[i]), int(fa.features[i])) for i in torch.randperm(active, generator=g)[:3]]
               for _ in range(5)]
    values = ablate_features(tm, d, src_ids, tgt_ids, noun_out, [[], top3, *randoms], metric=singular[0])
    plural_rows.append({
        "source": s, "noun": en[noun_out].lstrip("\u2581"),
        "German noun": tm.src_tokenizer.pieces(src_ids)[number_at + 1], "contrast": fa.value,
        "top-10 on noun": sum(t["position"] == number_at + 1 for t in top10),
        "top-10 on number word": sum(t["position"] == number_at for t in top10),
        "top feature": best["feature"], "top fires on": best["piece"],
        "top on number word": best["position"] == number_at,
        "top is a number feature": best["feature"] in number_features,
        "top-3 predicted": sum(t["attribution"] for t in fa.top(3)), "top-3 ablated": float(values[0] - values[1]),
        "random-3 ablated": float((values[0] - values[2:]).mean()),
    })
import pandas as pd  # noqa: E402

plural = pd.DataFrame(plural_rows)
plural.round(3)

# %%
n_plural = len(plural)
if n_plural:
    top_on_number = plural[plural["top on number word"]]
    top_on_noun = int((~plural["top on number word"] & (plural["top fires on"] == plural["German noun"])).sum())
    noun_share = float(plural["top-10 on noun"].sum() / (10 * n_plural))
    number_share_plural = float(plural["top-10 on number word"].sum() / (10 * n_plural))
    print(f"{n_plural} held-out plural nouns after a number word: of the ten features that raise logit(plural) - "
          f"logit(singular) most in each, {noun_share:.0%} fire on the German noun and {number_share_plural:.0%} on "
          f"the number word; the top one fires on the noun in {top_on_noun} of {n_plural}")
    print(f"the top feature fires on the number word in {len(top_on_number)} of {n_plural}: "
          f"{', '.join(f'{a} -> {b}' for a, b in zip(top_on_number['German noun'], top_on_number['noun'])) or 'none'}")
    print(f"ablating the top-3 attributed features lowers the contrast by {plural['top-3 ablated'].mean():.3f} on "
          f"average (predicted {plural['top-3 predicted'].mean():.3f}); three random active features: "
          f"{plural['random-3 ablated'].mean():.3f}")
else:
    print("none of these sentences has a one-piece English plural noun after its number word")

# %% [markdown]
# ## 5. Steering: a "woman" feature, clamped while translating
#
# The dictionary spliced into the model (`features.splice`) makes its features hook points
# (`hook_memory.sae.hook_acts`), and `translate(..., steer={site: {feature: value}})` clamps a feature to a value at
# every position while decoding (`"+0.3"` would add instead), in greedy and beam search with the KV cache. We take
# the hook_memory feature most selective for *Frau*, *Frauen* and *Mädchen* on validation sentences
# (`selective_feature`), clamp it on every source token of test2016 sentences about men (*Mann*, *Männer*,
# *Junge*), and count the translations that move toward female words: more female words minus male words than
# the plain translation. The control clamps random features of the same decoder norm to the same value; the share
# of translations any such push changes is printed beside it.

# %%
import re  # noqa: E402

from workbench.features import splice  # noqa: E402
from workbench.features.steering import FEMALE, MALE, selective_feature, steering_effect  # noqa: E402

valid_src, _ = load_dataset("multi30k", "valid", "de", "en", limit=100 if QUICK else 300)
woman = selective_feature(tm, d, valid_src, {"frau", "frauen", "mädchen"})
male_sources = [s for s in src_text if re.search(r"\b(Mann|Männer|Junge)\b", s)][: 24 if QUICK else 200]
steering = [steering_effect(tm, d, woman, male_sources, value, toward=FEMALE, away=MALE,
                            controls=3 if QUICK else 8, examples=4)
            for value in ((0.3,) if QUICK else (0.2, 0.3, 0.5))]
for r in steering:
    print(r.summary())
best_steer = max(steering, key=lambda r: r.toward - r.control_toward_mean)
print(f"\nsentences the clamp to {best_steer.edit} moved toward female words:")
for source, plain, steered in best_steer.examples:
    print(f"{source}\n   plain:   {plain}\n   steered: {steered}")
with splice(tm.model, d):  # the same steer, by hand: the dictionary spliced in, then translate(steer=...)
    s = "Ein Mann mit Hut liest ein Buch im Park."
    print(f"\n{s}\n   plain:   {tm.translate([s])[0]}\n   steered: "
          f"{tm.translate([s], steer={'hook_memory': {woman: best_steer.edit}})[0]}")

# %% [markdown]
# ## What the numbers say

# %%
print(f"- Feature {feature} of the hook_memory dictionary is a number-word feature: {best_purity:.0%} of its top "
      f"contexts on the corpus fire on a German number word, and {len(number_features)} features in all have a "
      "majority of such contexts.")
drives = number_share >= 0.3
print(f"- {'It drives' if drives else 'Alone, it does not drive'} English number words: {number_share:.0%} of the ten "
      f"tokens whose probability drops most without it are English number words "
      f"({', '.join(w for w in raised if w in NUMBERS_EN) or 'none'}), carried most by cross-attention head "
      f"{top_head['layer']}.{top_head['head']}"
      + ("." if drives else f"; the concept is spread over {len(number_features)} features, which the next check "
         "removes together."))
print(f"- Causally, on {fired} held-out sentences, removing the number features active at the number word lowers the "
      f"log-probability of the English number word by {mean(drops):.3f}, against {mean(controls):.3f} for as many "
      "other active features of the same sizes." if fired else
      "- No number feature fired on the held-out number words found here.")
if n_plural:
    mainly = noun_share > number_share_plural and 2 * top_on_noun > n_plural
    print(f"- Back from the output: for {n_plural} English plural nouns after a number word, what makes the noun "
          f"plural rather than singular (logit(plural) - logit(singular)) comes "
          f"{'mainly' if mainly else 'not mainly'} from hook_memory features on the German noun itself: "
          f"{noun_share:.0%} of the ten largest attributions per case fire there, {number_share_plural:.0%} on the "
          f"number word, and the top feature fires on the noun in {top_on_noun} of them and on the number word in "
          f"{len(top_on_number)}"
          + (f" ({', '.join(top_on_number['German noun'].str.lstrip(chr(0x2581)))})" if len(top_on_number) else "")
          + f". Ablating the top-3 attributed features lowers the contrast by {plural['top-3 ablated'].mean():.3f} "
          f"(first-order prediction {plural['top-3 predicted'].mean():.3f}), three random active features by "
          f"{plural['random-3 ablated'].mean():.3f}.")
print(f"- Steering: clamping feature {woman} (the hook_memory feature most selective for Frau/Frauen/Mädchen) to "
      f"{best_steer.edit} on every source token moves {best_steer.toward:.0%} of {best_steer.sentences} translations "
      f"of sentences about men toward female words ({best_steer.changed:.0%} change at all); random features of the "
      f"same norm, clamped the same way, move {best_steer.control_toward_mean:.0%} "
      f"({best_steer.control_changed_mean:.0%} change): "
      + ("the feature, not the size of the push, moves them." if best_steer.toward > 2 * best_steer.control_toward_mean
         else "no clearer than a random push."))

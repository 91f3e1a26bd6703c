# %% [markdown]
# # Features of a translation model: a number feature in the encoder output and the English words it drives
#
# Heads and neurons are not the units a model thinks in; a *sparse dictionary* rewrites an activation as a short
# sum of directions (features) learned to be sparse. The workbench ships TopK sparse autoencoders for the shipped
# German→English model (`checkpoints/multi30k-de-en/features/`): one on `hook_memory`, the encoder output that
# every cross-attention head reads, one per cross-attention block output, and a transcoder of a decoder FFN, each
# in SAELens's file layout with a card of its held-out figures.
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
card = json.loads((site_dir / "eval.json").read_text())
print(f"{fd.name}: {fd.n_features} features, k = {fd.d.cfg.k}; held-out FVU {card['fvu']:.3f}, "
      f"L0 {card['l0']:.1f}, CE recovered {card['ce_recovered']:.1%}, test2016 BLEU {card['bleu_clean']:.2f} "
      f"clean vs {card['bleu_spliced']:.2f} spliced")
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
# number, we remove the feature where it fires on the number word and measure the drop in log p(number word) at
# the aligned output position; as a control we remove, at the same token, the active feature whose activation is
# closest to it (a feature of the same size but another meaning).

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
cases = cases[: 8 if QUICK else 60]
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
    feats = d.encode(acts["hook_memory"][0, position])
    a = float(feats[feature])
    if a <= 0:
        continue
    fired += 1
    others = [(abs(float(v) - a), int(j)) for j, v in enumerate(feats) if v > 0 and j != feature]
    control = min(others)[1]
    drops.append(log_prob_drop(src_ids, tgt_ids, position, out_pos, word_id, a * d.W_dec[feature]))
    controls.append(log_prob_drop(src_ids, tgt_ids, position, out_pos, word_id,
                                  float(feats[control]) * d.W_dec[control]))
mean = lambda xs: sum(xs) / max(len(xs), 1)
print(f"{len(cases)} held-out sentences with a number word translated as such; feature {feature} fires on the "
      f"number word in {fired}")
print(f"removing feature {feature} there lowers log p(number word) by {mean(drops):.3f} on average; "
      f"removing a same-sized other active feature: {mean(controls):.3f}")

# %% [markdown]
# ## What the numbers say

# %%
ratio = mean(drops) / mean(controls) if mean(controls) > 0 else float("inf")
print(f"- Feature {feature} of the hook_memory dictionary is a number-word feature: {best_purity:.0%} of its top "
      f"contexts on the corpus fire on a German number word, and {len(number_features)} features in all have a "
      "majority of such contexts.")
print(f"- It drives English number words: {number_share:.0%} of the ten tokens whose probability drops most without "
      f"it are English number words ({', '.join(w for w in raised if w in NUMBERS_EN) or 'none'}), carried most by "
      f"cross-attention head {top_head['layer']}.{top_head['head']}.")
print(f"- Causally, on {fired} held-out sentences, removing it lowers the log-probability of the number word by "
      f"{mean(drops):.3f}, {ratio:.1f}x what removing a same-sized other feature does ({mean(controls):.3f})."
      if fired else "- It did not fire on the held-out number words found here.")

# %% [markdown]
# # Why, not only where: how a noun travels from the source into the translation
#
# Attention maps show *where* each output word looked. This notebook asks *why* an output word came out, on the
# shipped German→English model (`checkpoints/multi30k-de-en`, post-norm, 4+4 layers, 4 heads): we swap one
# German noun for another (*Mann* → *Frau*), find the first output word that changes (*man* → *woman*), and ask
# which components carry the noun's identity into that word — with three tools that answer differently:
#
# - **direct logit attribution** (DLA): the decoder's final state is a sum of components (embeddings, every
#   head's output, every FFN, norm biases); each one's dot product with the unembedding direction
#   *good − bad* is its direct share of the logit difference. Post-norm layer norms are applied with the scale
#   they had on this sentence (frozen), which makes the parts sum exactly but counts only direct paths;
# - **activation patching**: run the corrupted sentence and put one component back from the clean run
#   (denoising); how much of the clean logit difference returns is that component's causal effect;
# - **attention**: how much each cross-attention head looks at the swapped noun when it writes the word.
#
# Everything below is computed here; the conclusions are printed from the numbers.

# %% tags=["parameters"]
import os

QUICK = os.environ.get("WORKBENCH_QUICK", "0") == "1"  # CI sets WORKBENCH_QUICK=1: seconds on one CPU core

# %%
from pathlib import Path

import pandas as pd
import torch

from workbench import load
from workbench.analysis import direct_logit_attribution, logit_diff, patching_sweep, source_attribution, spearman
from workbench.analysis.circuits.contrast import noun_swaps
from workbench.checkpoint.shipped import shipped
from workbench.corpus.data import dataset_files

if QUICK:
    torch.set_num_threads(1)
tm = load(shipped("multi30k-de-en"))
model = tm.model.eval()
try:
    de, _ = dataset_files("multi30k", "test", "de", "en", download=False)
    sentences = Path(de).read_text(encoding="utf-8").splitlines()
except (FileNotFoundError, OSError, ValueError):  # no local Multi30k: a few sentences of its style
    sentences = ["Ein Mann spielt Gitarre auf der Straße.", "Eine Frau geht mit einem Hund am Strand entlang.",
                 "Ein Junge fährt Fahrrad vor einem Haus.", "Ein Mädchen wirft einen Ball ins Wasser."]
pairs = noun_swaps(tm, sentences[:40 if QUICK else 600], max_pairs=3 if QUICK else 40)
print(f"{len(pairs)} sentence pairs whose translation changes with the swapped noun")
p = pairs[0]
pieces = tm.tgt_tokenizer.pieces
print("clean:    ", p.text, "→", p.output)
print("corrupted:", p.corrupted_text, "→", p.corrupted_output)
print(f"first differing output position {p.position}: {pieces([p.good])[0]!r} vs {pieces([p.bad])[0]!r}")

# %% [markdown]
# ## 1. Decomposition: which components write *good − bad* directly
#
# The table lists the components with the largest direct contribution to the logit difference at that position
# (`dla.values` sums to the model's real logit difference; the check is printed).

# %%
dla = direct_logit_attribution(model, p.src, p.tgt, p.position, p.good, baseline_token=p.bad)
table = dla.frame()
print(f"sum of parts {table.value.sum():.4f} = real logit difference {dla.logit:.4f}")
table.reindex(table.value.abs().sort_values(ascending=False).index).head(10).round(3)

# %% [markdown]
# ## 2. Back to the source: which source tokens each cross-attention head moved into the word
#
# A head writes a weighted sum of its value vectors, one per source token, so its DLA splits exactly over the
# source positions (`source_attribution`, layer × head × source token).

# %%
per_src = source_attribution(model, p.src, p.tgt, p.position, p.good, baseline_token=p.bad)  # (L, H, S)
src_pieces = tm.src_tokenizer.pieces(p.src[0].tolist())
frame = pd.DataFrame(per_src.reshape(-1, per_src.size(-1)).numpy(), columns=src_pieces,
                     index=[f"cross:{layer}:{h}" for layer in range(per_src.size(0)) for h in range(per_src.size(1))])
noun_total = float(per_src[..., p.swapped].sum())
all_total = float(per_src.sum())
print(f"the cross-attention heads' direct contribution: {all_total:.3f}; of it, read from the swapped noun "
      f"{src_pieces[p.swapped]!r}: {noun_total:.3f}")
frame.round(2)

# %% [markdown]
# ## 3. Patching: where the noun's identity lives, and which heads carry it
#
# Denoising sweeps (corrupted run, one clean activation put back; 1 = the clean logit difference fully
# restored, 0 = none of it): the encoder stream per layer × source position, the decoder stream per layer ×
# target position, and every head of all three kinds per position. The clean and corrupted runs are captured
# once; the patched variants run as rows of one batch.

# %%
metric = logit_diff(p.position, p.good, p.bad)
kw = dict(corrupted_src=p.corrupted_src, metric=metric, direction="denoising")
enc = patching_sweep(model, p.src, p.tgt, sites="resid_enc", **kw)
dec = patching_sweep(model, p.src, p.tgt, sites="resid_dec", **kw)
heads = patching_sweep(model, p.src, p.tgt, sites="head", **kw)
enc_n, dec_n = enc.normalized(), dec.normalized()
others = [c for c in range(enc_n.size(1)) if c != p.swapped]
print("encoder stream, restored share at the noun position per layer:",
      [round(float(x), 2) for x in enc_n[:, p.swapped]])
print("encoder stream, largest |restored share| at any other position:",
      round(float(enc_n[:, others].abs().max()), 3))
print("decoder stream at the output position, per layer (embeddings first):",
      [round(float(x), 2) for x in dec_n[:, p.position]])
print(f"forward passes: {enc.forward_passes + dec.forward_passes + heads.forward_passes} for "
      f"{int((~enc.values.isnan()).sum() + (~dec.values.isnan()).sum() + (~heads.values.isnan()).sum())} sites")
pd.DataFrame(enc_n.numpy(), index=enc.rows, columns=src_pieces).round(2)

# %%
head_n = heads.normalized()
cross_rows = [i for i, r in enumerate(heads.rows) if r.startswith("cross")]
enc_rows = [i for i, r in enumerate(heads.rows) if r.startswith("enc_self")]
best_cross = max(cross_rows, key=lambda i: float(head_n[i, p.position]))
best_enc = max(enc_rows, key=lambda i: float(head_n[i, p.swapped]))
print(f"cross-attention head restoring most at the output position: {heads.rows[best_cross]} "
      f"({float(head_n[best_cross, p.position]):.2f} of the clean logit difference)")
print(f"encoder head restoring most at the noun position: {heads.rows[best_enc]} "
      f"({float(head_n[best_enc, p.swapped]):.2f})")
pd.DataFrame({"at output position": head_n[cross_rows, p.position].numpy()},
             index=[heads.rows[i] for i in cross_rows]).round(2).T

# %% [markdown]
# ## 4. Over many sentences: do decomposition, patching and attention name the same heads?
#
# For every pair and every cross-attention head: its DLA on the logit difference, the part of it read from the
# swapped noun, its denoising effect at the output position, and its attention from the output position to
# the noun. Averaged over the pairs, then compared by rank (Spearman) across the heads.

# %%
rows = []
for k, q in enumerate(pairs):
    m = logit_diff(q.position, q.good, q.bad)
    d = direct_logit_attribution(model, q.src, q.tgt, q.position, q.good, baseline_token=q.bad)
    ps = source_attribution(model, q.src, q.tgt, q.position, q.good, baseline_token=q.bad)
    sw = patching_sweep(model, q.src, q.tgt, corrupted_src=q.corrupted_src, sites="head_cross", metric=m,
                        direction="denoising")
    _, tr = model.run_with_cache(q.src, q.tgt, names="dec.*.cross_attn.hook_probs")
    att = tr.stack("dec.*.cross_attn.hook_probs")[:, 0, :, q.position, q.swapped]  # (L, H)
    sw_n = sw.normalized()
    for layer in range(per_src.size(0)):
        for h in range(per_src.size(1)):
            label = f"cross:{layer}:{h}"
            rows.append({"pair": k, "head": label,
                         "dla": float(d.values[d.labels.index(label)]),
                         "dla_from_noun": float(ps[layer, h, q.swapped]),
                         "patching": float(sw_n[sw.rows.index(label), q.position]),
                         "attention_to_noun": float(att[layer, h])})
per_head = pd.DataFrame(rows).groupby("head")[["dla", "dla_from_noun", "patching", "attention_to_noun"]].mean()
per_head = per_head.sort_values("patching", ascending=False)
per_head.round(3)


# %%
def rho(a, b):
    return float(spearman(per_head[a].to_numpy(), per_head[b].to_numpy()))

top = per_head.index[0]
share = per_head["dla_from_noun"].sum() / per_head["dla"].sum()
layers = per_head.groupby(per_head.index.str.split(":").str[1])["patching"].sum()
print(f"Over {len(pairs)} pairs, the cross-attention head whose restoration brings back most of the logit "
      f"difference is {top} (mean {per_head.loc[top, 'patching']:.2f}); its mean attention to the swapped noun "
      f"is {per_head.loc[top, 'attention_to_noun']:.2f} and its mean DLA {per_head.loc[top, 'dla']:.2f}.")
print(f"Summed over heads, {share:.0%} of the cross-attention heads' direct contribution is read from the "
      f"swapped noun's source position.")
print("Patching effect summed per decoder layer:", {f"layer {k}": round(float(v), 2) for k, v in layers.items()})
print(f"Rank agreement across the {len(per_head)} heads: patching vs DLA {rho('patching', 'dla'):.2f}, "
      f"patching vs attention {rho('patching', 'attention_to_noun'):.2f}, "
      f"DLA vs attention {rho('dla', 'attention_to_noun'):.2f}.")

# %% [markdown]
# Reading the printed numbers: DLA counts only what a head writes straight into the final state (through the
# frozen norms), patching counts everything downstream of it too, and attention counts where it looks, not
# what it writes. Where the three rank heads alike, attention is a fair guide for this question on this model;
# where they differ, the patching number is the causal one. `docs/analysis.md` §9 measures the same
# agreements, and attribution patching's, over a test set.

# %% [markdown]
# ## 4. The same, interactively: the app's Why view in the notebook
#
# The dashboard's *Why* tab is a Panel view of the same library calls; here it opens on the first pair's clean
# sentence, with the swapped sentence prefilled for patching. Tap an output token to see its direct logit
# attribution and what each cross-attention head read; edit the changed source to patch against another one.

# %%
import panel as pn

from workbench.ui import Workbench
from workbench.ui.notebook import offline_notebook
from workbench.ui.why_view import WhyView

pn.extension("vega", inline=True)  # everything inlined: renders with no internet
offline_notebook()
wb = Workbench(shipped("multi30k-de-en"), sentence=p.text)
why = WhyView(session=wb.session)
why.show()  # a tab computes only while shown; in a notebook, from here on
why

# %% [markdown]
# # A tour of the Attention Workbench
#
# Load a translation model, translate, capture a trace of every attention head, look at encoder, decoder and
# cross-attention with the views library, ablate heads and watch the translation change, and open the whole
# dashboard in this notebook.
#
# **Which model?** If `checkpoints/multi30k-de-en` ships (a trained German→English model), the tour uses it. Otherwise
# (and always in quick mode, `WORKBENCH_QUICK=1`, which CI uses) it trains a *tiny* German→English model on a slice of
# Multi30k for a few seconds into a temporary directory. That model translates badly, and the text below never
# pretends otherwise: every number you see is computed by the cells.

# %% tags=["parameters"]
import os

QUICK = os.environ.get("WORKBENCH_QUICK", "0") == "1"  # CI sets WORKBENCH_QUICK=1: seconds on one CPU core
TRAIN_STEPS = 40 if QUICK else 1500  # only used when no checkpoint ships

# %%
import panel as pn
import torch

import workbench
from workbench.ui.notebook import offline_notebook

pn.extension("vega", inline=True)  # Bokeh, Vega and Panel's JS inlined: renders with no internet
offline_notebook()  # ...and Panel's stylesheets too, also in the updates the dashboard gets from this kernel
if QUICK:
    torch.set_num_threads(1)

# %% [markdown]
# ## A model
#
# The trainer writes a workbench checkpoint (`config.json`, `model.safetensors`, tokenizers, training log);
# `workbench.load` turns any checkpoint into a `TranslationModel`.

# %%
from workbench.training.tutorial import tutorial_checkpoint

CHECKPOINT, how = tutorial_checkpoint(quick=QUICK, steps=TRAIN_STEPS)  # the notebooks read German Multi30k
print(how)

# %%
tm = workbench.load(CHECKPOINT, max_len_a=1.5, max_len_b=10)  # decoding defaults; each call may override them
tm

# %% [markdown]
# ## Translate

# %%
sentences = ["Ein Mann fährt mit dem Fahrrad.", "Zwei Hunde spielen im Schnee."]
tm.translate(sentences, beam=4)

# %% [markdown]
# ## Capture a trace
#
# `tm.trace(text)` decodes and records every attention probability over the whole generation: a `Trace` is a
# plain mapping from hook names to tensors, plus the token strings in `trace.meta`.

# %%
result = tm.trace(sentences[0])
trace = result.trace
print(result.text)
print(len(trace), "tensors, e.g.", trace.names("dec.*.cross_attn.hook_probs"))
trace[("cross", trace.layers("cross") - 1)].shape  # (batch, heads, target steps, source tokens)

# %% [markdown]
# ## Encoder, decoder and cross-attention
#
# Heatmaps (hover for tokens and weights), the BertViz-style head view (click a query token; toggle heads) and the
# model view (every layer × head; tap a tile to enlarge it).

# %%
from workbench.charts import attention_heatmap, head_view, model_view

last = trace.layers("cross") - 1
pn.Row(
    pn.panel(attention_heatmap(trace, "enc_self", layer=0)),
    pn.panel(attention_heatmap(trace, "cross", layer=last)),
)

# %%
pn.panel(head_view(trace, "dec_self"))

# %%
pn.panel(model_view(trace, ["enc_self", "cross"]))

# %% [markdown]
# ## Ablate a head and watch the translation change
#
# `ablate_heads` zeroes a head's output (at `hook_context`, before the output projection); `model.intervene` makes
# that edit for the calls inside the `with` block only. For each cross-attention head of the last layer we
# translate again and score the *original* output under the edited model (teacher forcing).

# %%
import pandas as pd

from workbench.core.interventions import ablate_heads


def log_prob(model, src_ids, out_ids):
    """Log-probability of `out_ids` (ending with EOS) given the source, teacher-forced."""
    src = torch.tensor([src_ids])
    tgt_in = torch.tensor([[model.cfg.start_id, *out_ids[:-1]]])
    with torch.no_grad():
        logp = model(src, tgt_in).log_softmax(-1)
    return logp[0, torch.arange(len(out_ids)), torch.tensor(out_ids)].sum().item()


base = tm.translate([sentences[0]], beam=1, return_tokens=True)[0]
rows = [{"ablated": "none", "translation": base.text,
         "log p(original output)": log_prob(tm.model, base.source_tokens, base.tokens)}]
for head in range(tm.model.cfg.n_heads):
    with tm.model.intervene(ablate_heads({("cross", last): [head]})):
        edited = tm.translate([sentences[0]], beam=1)[0]
        rows.append({"ablated": f"cross layer {last} head {head}", "translation": edited,
                     "log p(original output)": log_prob(tm.model, base.source_tokens, base.tokens)})
pd.DataFrame(rows)

# %% [markdown]
# Ablating *every* cross-attention head cuts the decoder off from the source entirely:

# %%
all_cross = {("cross", layer): list(range(tm.model.cfg.n_heads)) for layer in range(trace.layers("cross"))}
with tm.model.intervene(ablate_heads(all_cross)):
    print(tm.translate([sentences[0]], beam=1)[0])

# %% [markdown]
# ## The whole dashboard, inline
#
# The same app as `panel serve apps/attention.py`, driven from this kernel: change the sentence from code and the
# views follow.

# %%
from workbench.ui import Workbench

wb = Workbench(CHECKPOINT, sentence=sentences[1])
wb

# %%
wb.session.sentence = sentences[0]
wb.session.result.trace.names("*.cross_attn.hook_probs")

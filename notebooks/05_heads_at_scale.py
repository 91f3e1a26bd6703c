# %% [markdown]
# # Heads at scale
#
# Attention maps of one sentence are anecdotes. Here we compute per-head statistics over a whole test set
# (`workbench.analysis.corpus_head_stats`), find the sentences where a head behaves unusually, and measure each
# head's importance by ablating it and re-scoring BLEU. The model is the shipped checkpoint when `../checkpoints/`
# holds one (outside quick mode), else a tiny model trained in a few seconds, whose heads are far less
# specialised.

# %% tags=["parameters"]
import os

QUICK = os.environ.get("WORKBENCH_QUICK", "0") == "1"  # CI sets WORKBENCH_QUICK=1: seconds on one CPU core
TRAIN_STEPS = 40 if QUICK else 1500  # only used when no checkpoint ships
N_SENTENCES = 40 if QUICK else 1000  # Multi30k test2016 has 1000

# %%
import altair as alt
import torch
from bokeh.io import output_notebook, show
from bokeh.resources import INLINE

from workbench.charts.notebook import enable_altair

output_notebook(INLINE, hide_banner=True)  # BokehJS is inlined: the charts render with no internet
enable_altair()  # Altair charts as Vega specs, drawn by JupyterLab's own Vega renderer: offline, any number of them
if QUICK:
    torch.set_num_threads(1)  # tiny models on a busy 2-core CI box run faster on one thread

# %%
from workbench.training.tutorial import tutorial_checkpoint

CHECKPOINT, how = tutorial_checkpoint(quick=QUICK, steps=TRAIN_STEPS)  # the notebooks read German Multi30k
print(how)

# %%
import workbench
from workbench.analysis import STATS, corpus_head_stats, punctuation_ids
from workbench.corpus.data import load_dataset

tm = workbench.load(CHECKPOINT)
test_de, test_en = load_dataset("multi30k", "test", "de", "en", limit=N_SENTENCES)
eos = tm.model.cfg.eos_id
sources = [tm.encode_source(s)[0] for s in test_de]
targets = [tm.tgt_tokenizer.encode(t) + [eos] for t in test_en]
vocab = [tm.src_tokenizer.pieces([i])[0] for i in range(tm.src_tokenizer.vocab_size)]
stats = corpus_head_stats(tm.model, sources, targets, src_punct=punctuation_ids(vocab),
                          tgt_punct=punctuation_ids(vocab))
STATS

# %% [markdown]
# ## One row per head
#
# Corpus values (token-weighted means over every sentence):

# %%
summary = stats.summary()
summary.round(3)

# %%
long = summary.melt(id_vars=["head_id", "kind", "layer", "head_index"],
                    value_vars=["entropy_norm", "max", "eos", "prev"], var_name="stat")
alt.Chart(long).mark_rect().encode(
    x="head_index:O", y="layer:O", color=alt.Color("value:Q", scale=alt.Scale(scheme="viridis")),
    tooltip=["head_id", "stat", alt.Tooltip("value:Q", format=".3f")],
).properties(width=120, height=90).facet(row="stat:N", column="kind:N").resolve_scale(color="independent")

# %% [markdown]
# ## Where does a head behave unusually?
#
# Take the encoder head that attends most to the previous token over the corpus, and list the sentences where it
# does so least: its outliers. Then look at the most unusual one.

# %%
from workbench.core.heads import Head

top = stats.rank("prev", kind="enc_self").iloc[0]
head = Head.parse(top["head_id"])  # the one spelling of a head: "enc_self:layer:head"
print(f"encoder head {head}: previous-token weight {top['prev']:.3f} over the corpus")
odd = stats.sentences(head, "prev", top=5, largest=False)
odd.assign(text=[test_de[i] for i in odd["sentence"]])

# %%
from workbench.charts import attention_heatmap
from workbench.core.batching import decoder_input

i = int(odd["sentence"].iloc[0])
src = torch.tensor([sources[i]])
tgt_in = decoder_input(targets[i], tm.model.cfg.start_id)  # start + the reference without its EOS
_, trace = tm.model.run_with_cache(src, torch.tensor([tgt_in]))
trace.meta.update(src_pieces=tm.src_tokenizer.pieces(sources[i]), tgt_pieces=tm.tgt_tokenizer.pieces(tgt_in))
show(attention_heatmap(trace, "enc_self", layer=head.layer, heads=head.head))

# %% [markdown]
# ## Head importance by ablation on BLEU
#
# Ablate one head at a time (zero its output, `workbench.core.interventions.ablate_heads`), translate the test
# sentences again and compare BLEU with the intact model (Michel et al., 2019, *Are Sixteen Heads Really Better
# than One?*). In quick mode only the cross-attention heads of the last layer are tried, on a handful of
# sentences.

# %%
import pandas as pd

from workbench.core.interventions import ablate_heads
from workbench.decoding.evaluate import evaluate

n_eval = 20 if QUICK else 300
options = dict(beam=1, max_len_a=1.2, max_len_b=10)
baseline = evaluate(tm, test_de[:n_eval], [test_en[:n_eval]], **options).bleu
cfg = tm.model.cfg
blocks = [("cross", cfg.dec_layers - 1)] if QUICK else (
    [("enc_self", i) for i in range(cfg.enc_layers)]
    + [(kind, j) for kind in ("dec_self", "cross") for j in range(cfg.dec_layers)])
rows = []
for kind, layer in blocks:
    for head in range(cfg.n_heads):
        with tm.model.intervene(ablate_heads({(kind, layer): [head]})):
            bleu = evaluate(tm, test_de[:n_eval], [test_en[:n_eval]], **options).bleu
        rows.append({"kind": kind, "layer": layer, "head": head, "bleu": bleu, "delta": bleu - baseline})
importance = pd.DataFrame(rows).sort_values("delta")
print(f"intact model: BLEU {baseline:.2f} on {n_eval} sentences")
importance

# %%
alt.Chart(importance.assign(block=importance["kind"] + " " + importance["layer"].astype(str)),
          title="BLEU change when one head is ablated").mark_bar().encode(
    x="head:O", y="delta:Q", color="block:N", column="block:N", tooltip=["kind", "layer", "head", "bleu", "delta"])

# %% [markdown]
# # The Annotated Transformer, with the workbench's own modules
#
# Harvard NLP's *Annotated Transformer* rebuilds "Attention Is All You Need" line by line. This notebook walks the
# same path, but every piece is the workbench's real code (`workbench.core.model`, `embedding`, `masks`, `schedule`,
# `loss`, `train`), looked at through its hook points and views instead of being re-implemented: embeddings and
# positional encodings, masks, one encoder layer's hook points, the Noam schedule, label smoothing, weight tying,
# pre- vs post-norm, and finally the copy task trained in a few cells on CPU.

# %% tags=["parameters"]
import os

QUICK = os.environ.get("WORKBENCH_QUICK", "0") == "1"  # CI sets WORKBENCH_QUICK=1: seconds on one CPU core
COPY_STEPS = 60 if QUICK else 400

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

# %% [markdown]
# ## The model and its configuration
#
# `presets.base()` is the paper's base model (Table 3). A `ModelConfig` is a frozen dataclass saved with every
# checkpoint; below we use a tiny variant so everything runs instantly.

# %%
from workbench import Transformer, presets

paper = presets.base()
print(paper)
print(f"{Transformer(paper).num_parameters():,} parameters in the base model")

# %%
cfg = presets.tiny(vocab=20)
model = Transformer(cfg).eval()
model

# %% [markdown]
# ## Embeddings and positional encodings
#
# Tokens are embedded and multiplied by √d_model, then a positional encoding is added. The paper's encoding is
# `PE(pos, 2i) = sin(pos / 10000^(2i/d))`, `PE(pos, 2i+1) = cos(pos / 10000^(2i/d))`. The view shows the table,
# a few dimensions as curves (the Annotated Transformer's figure), and how similar positions are to each other,
# for this config's layout and the other sinusoidal layouts that published models use.

# %%
import math

from workbench.core.embedding import sinusoidal_positions

pe = sinusoidal_positions(50, 16)
pos, i = 7, 3  # check one sine and one cosine entry against the formula written out
print(pe[pos, 2 * i].item(), math.sin(pos / 10000 ** (2 * i / 16)))
print(pe[pos, 2 * i + 1].item(), math.cos(pos / 10000 ** (2 * i / 16)))

# %%
from workbench.charts import positional_encoding_view

show(positional_encoding_view(cfg, length=60))

# %% [markdown]
# ## Masks
#
# One convention everywhere (SDPA's): `True` = may attend. The encoder hides padding keys; the decoder also hides
# the future (causal mask). Below, a padded batch of three sentences.

# %%
from workbench.charts import mask_view
from workbench.core.masks import causal_mask

src = torch.tensor([[5, 6, 7, 8, 2], [5, 6, 2, 0, 0], [9, 2, 0, 0, 0]])  # EOS = 2, padding = 0
tgt = torch.tensor([[1, 5, 6, 7, 8], [1, 5, 6, 0, 0], [1, 9, 0, 0, 0]])  # starts with BOS = 1
print(causal_mask(4).int())
show(mask_view(src, tgt, pad_id=cfg.pad_id))

# %% [markdown]
# ## One encoder layer's hook points
#
# Every intermediate has a name, `{stack}.{layer}.{sublayer}.hook_{tensor}`; `run_with_cache` records the ones you
# ask for. Here is everything one encoder layer exposes, with shapes (B, heads, length, d_head for q/k/v).

# %%
import pandas as pd

logits, cache = model.run_with_cache(src, tgt, names="enc.0.*")
pd.DataFrame([(name, tuple(cache[name].shape)) for name in cache.names()], columns=["hook", "shape"])

# %% [markdown]
# The hook points read as the architecture. Attention rows sum to one; masked (padding) keys get exactly zero; and
# in this post-norm layer (the paper's) the residual stream after self-attention is `LayerNorm(x + sublayer(x))`,
# which we can recompute from the hooks and the layer's own norm module:

# %%
probs = cache["enc.0.self_attn.hook_probs"]
print("rows sum to 1:", torch.allclose(probs.sum(-1), torch.ones(())))
print("weight on padding keys of sentence 2:", probs[2, :, :, 2:].abs().max().item())
recomputed = model.enc[0].self_attn_norm(cache["enc.0.hook_resid_in"] + cache["enc.0.self_attn.hook_out"])
print("LayerNorm(x + attn(x)) == hook_resid_self_attn:",
      torch.allclose(recomputed, cache["enc.0.hook_resid_self_attn"], atol=1e-6))

# %%
from workbench.charts import attention_heatmap

show(attention_heatmap(cache, "enc_self", layer=0, heads=0, batch=1, select={"trim": False}))

# %% [markdown]
# ## The Noam schedule
#
# `lr = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)`: linear warm-up, then inverse square root.
# `workbench.training.schedule` holds it as a pure function of the step (step 0 gives 0); the chart draws it beside the
# other schedules the trainer offers.

# %%
from workbench.charts import lr_schedule_chart
from workbench.training.schedule import noam

peak = noam(4000, d_model=512, warmup=4000)
print(peak, 512 ** -0.5 * 4000 ** -0.5)  # the peak is at the end of warm-up
lr_schedule_chart(steps=20000)

# %% [markdown]
# ## Label smoothing
#
# The paper smooths the target with ε = 0.1. The left chart is the smoothed target for one token; the right one
# shows that with smoothing the loss is lowest *before* full confidence in the gold token, so the model is
# penalised for being over-confident. `label_smoothed_nll` equals PyTorch's `cross_entropy(label_smoothing=)`:

# %%
import torch.nn.functional as F

from workbench.charts import label_smoothing_chart
from workbench.training.loss import label_smoothed_nll

scores = torch.randn(6, cfg.tgt_vocab)
gold = torch.tensor([4, 5, 6, 7, 0, 0])  # two padding positions are ignored
loss_sum, nll_sum, n_tokens = label_smoothed_nll(scores, gold, smoothing=0.1, ignore_index=cfg.pad_id)
reference = F.cross_entropy(scores, gold, label_smoothing=0.1, ignore_index=cfg.pad_id)
print(float(loss_sum / n_tokens), reference.item())
label_smoothing_chart(vocab=10, smoothing=0.4)

# %% [markdown]
# ## Weight tying
#
# With a shared vocabulary the paper ties the source embedding, the target embedding and the output projection:
# one matrix, used three times.

# %%
import dataclasses

for tie in ("none", "decoder", "all"):
    m = Transformer(dataclasses.replace(cfg, tie_embeddings=tie))
    print(f"{tie:>8}: {m.num_parameters():6,} parameters; output = target embedding:",
          m.output_proj.weight is m.tgt_embed.weight, "; target = source embedding:", m.tgt_embed is m.src_embed)

# %% [markdown]
# ## Pre-norm vs post-norm
#
# The paper normalises *after* each residual add (post-norm); most later models normalise the sub-layer's input
# (pre-norm, `norm_first=True`), which trains deep stacks without warm-up tricks. The hooks show the difference:
# post-norm keeps the residual stream at unit scale after every sub-layer, pre-norm lets it grow layer by layer.

# %%
deep = presets.tiny(vocab=20, enc_layers=6, dec_layers=1, dropout=0.0)
rows = []
for norm_first in (False, True):
    torch.manual_seed(0)
    m = Transformer(dataclasses.replace(deep, norm_first=norm_first)).eval()
    _, t = m.run_with_cache(src, tgt, names="enc.*.hook_resid_ffn")
    for layer, resid in enumerate(t.stack("enc.*.hook_resid_ffn")):
        rms = resid[src != cfg.pad_id].pow(2).mean().sqrt().item()
        rows.append({"norm": "pre-norm" if norm_first else "post-norm (paper)", "layer": layer, "rms": rms})
alt.Chart(pd.DataFrame(rows), title="residual stream scale after each encoder layer").mark_line(point=True).encode(
    x="layer:O", y="rms:Q", color="norm:N")

# %% [markdown]
# ## The copy task, trained in a few cells
#
# The Annotated Transformer's first experiment: learn to copy random sequences of symbols. `Trainer` is the same
# object the command line uses (`workbench train configs/copy_task.toml`); in a notebook it draws a live progress
# view with loss and learning-rate charts.

# %%
import tempfile

from workbench.checkpoint.shipped import shipped_config
from workbench.training import Trainer
from workbench.training.config import TrainConfig

copy_cfg = TrainConfig.load(shipped_config("copy_task"))
copy_cfg = dataclasses.replace(copy_cfg, max_steps=COPY_STEPS, log_every=10, eval_every=0, copy_pairs=2000,
                               threads=1 if QUICK else 0, out_dir=tempfile.mkdtemp(prefix="copy-task-"))
trainer = Trainer(copy_cfg).fit()

# %%
from workbench.charts import training_curves_chart

training_curves_chart(trainer.log, ["loss", "lr", "grad_norm"])

# %% [markdown]
# Greedy decoding of a few held-out sequences, and the cross-attention of the last decoder layer: once the task
# is learned, each output step attends to the source position it copies, so the map becomes a diagonal
# (with `COPY_STEPS` small in quick mode it may not be there yet).

# %%
from workbench.corpus.data import copy_task
from workbench.decoding.search import greedy

copy_model = trainer.model.eval()
held_out = torch.tensor([seq + [copy_model.cfg.eos_id] for seq in copy_task(5, vocab=11, length=10, seed=123)])
generated = greedy(copy_model, held_out, max_len=12)
exact = sum(h.tokens == row.tolist() for h, row in zip(generated.best, held_out))
print(f"{exact} of {len(held_out)} held-out sequences copied exactly")
for hyp, row in zip(generated.best[:2], held_out):
    print("source:", row.tolist(), "\n output:", hyp.tokens)

# %%
out = torch.tensor([[copy_model.cfg.start_id, *generated.best[0].tokens[:-1]]])
_, copy_trace = copy_model.run_with_cache(held_out[:1], out)
show(attention_heatmap(copy_trace, "cross", layer=copy_model.cfg.dec_layers - 1))

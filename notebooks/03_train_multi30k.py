# %% [markdown]
# # Train a Multi30k German→English model from cells
#
# The data (Multi30k task 1: image captions, 29k training pairs) comes from the shared data folder beside the
# project (`../shared/data`, or `$WORKBENCH_DATA`), or is downloaded when missing and online. We train a joint
# sentencepiece vocabulary, run the trainer with its live progress view, evaluate with sacreBLEU, and end with a
# checkpoint the app opens.
#
# **Settings.** The parameter cell picks one of three: *quick* (CI: a slice of the data, a tiny model, seconds),
# *CPU* (the recipe of `configs/multi30k_de_en.toml` for a limited time) and *GPU* (the same recipe until it
# converges, bf16). BLEU after a quick run is close to zero; that is expected, not a bug.

# %% tags=["parameters"]
import os

QUICK = os.environ.get("WORKBENCH_QUICK", "0") == "1"  # CI sets WORKBENCH_QUICK=1: seconds on one CPU core
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SETTING = "quick" if QUICK else ("gpu" if DEVICE == "cuda" else "cpu")
CPU_MINUTES = 20.0  # the CPU setting's time budget (the config's full recipe: 31 minutes, cosine over the minutes)
OUT_DIR = "../runs/notebook_multi30k"  # quick mode writes to a temporary directory instead

# %%
import torch
from bokeh.io import output_notebook
from bokeh.resources import INLINE

from workbench.charts.notebook import enable_altair

output_notebook(INLINE, hide_banner=True)  # BokehJS is inlined: the charts render with no internet
enable_altair()  # Altair charts as Vega specs, drawn by JupyterLab's own Vega renderer: offline, any number of them
if QUICK:
    torch.set_num_threads(1)  # tiny models on a busy 2-core CI box run faster on one thread

# %% [markdown]
# ## The data

# %%
from workbench.corpus.data import default_data_root, load_dataset

print("data root:", default_data_root())
train_de, train_en = load_dataset("multi30k", "train", "de", "en", limit=2000 if QUICK else 0)
test_de, test_en = load_dataset("multi30k", "test", "de", "en")
print(len(train_de), "training pairs,", len(test_de), "test pairs (test2016)")
for de, en in list(zip(train_de, train_en))[:3]:
    print(de, "→", en)

# %% [markdown]
# ## Sentencepiece
#
# One BPE model for both languages (so source, target and output embeddings can be tied). It is trained in
# memory on every sentence, deterministically.

# %%
from workbench.checkpoint.tokenizer import SentencePieceTokenizer

VOCAB = 600 if QUICK else 8000
spm = SentencePieceTokenizer.train(sentences=train_de + train_en, vocab_size=VOCAB, model_type="bpe")
print(spm.vocab_size, "pieces")
print(spm.pieces(spm.encode(train_de[0])))

# %% [markdown]
# ## The trainer
#
# `TrainConfig.load` reads the same TOML file as `workbench train configs/multi30k_de_en.toml`; the setting adjusts
# its limits. The progress view below redraws in place: bar, latest numbers, loss, learning rate and validation
# curves. Interrupting the kernel saves a checkpoint; `trainer.fit()` again continues exactly.

# %%
import dataclasses
import tempfile

from workbench.checkpoint.shipped import shipped_config
from workbench.training import Trainer
from workbench.training.config import TrainConfig

recipe = TrainConfig.load(shipped_config("multi30k_de_en"))
if SETTING == "quick":
    cfg = dataclasses.replace(
        recipe, train_limit=2000, vocab_size=VOCAB, preset="tiny", model={"dropout": 0.1}, max_tokens=1500,
        warmup=20, lr=3e-3, max_minutes=0.0, max_steps=30, log_every=5, eval_every=0, save_every=0,
        valid_limit=20, average_last=0, threads=1, out_dir=tempfile.mkdtemp(prefix="multi30k-"))
elif SETTING == "cpu":
    cfg = dataclasses.replace(recipe, max_minutes=CPU_MINUTES, out_dir=OUT_DIR)
else:
    cfg = dataclasses.replace(recipe, device="cuda", amp="bf16", max_minutes=30.0, max_tokens=8192, out_dir=OUT_DIR)
trainer = Trainer(cfg, src_tokenizer=spm, tgt_tokenizer=spm)
trainer.fit()

# %%
from workbench.charts import training_curves_chart

training_curves_chart(trainer.log, ["loss", "lr", "grad_norm", "tokens_per_s"])

# %%
import pandas as pd

pd.DataFrame([r for r in trainer.log if r["kind"] == "valid"]).drop(
    columns=["bleu_signature", "chrf_signature"], errors="ignore")

# %% [markdown]
# ## Evaluate on test2016 with sacreBLEU
#
# The checkpoint the trainer wrote (averaged when the recipe averages) is loaded as a `TranslationModel`;
# `workbench.decoding.evaluate.evaluate` translates with beam search and scores with sacreBLEU, signature included. The
# same from the shell: `workbench evaluate --checkpoint DIR --src test_2016_flickr.de --ref test_2016_flickr.en`.

# %%
from pathlib import Path

import workbench
from workbench.decoding.evaluate import evaluate

averaged = Path(cfg.out_dir) / "average"
best = averaged if averaged.is_dir() else Path(cfg.out_dir)
tm = workbench.load(best, device=DEVICE)
n_test = 50 if QUICK else len(test_de)
scores = evaluate(tm, test_de[:n_test], [test_en[:n_test]], beam=1 if QUICK else 5, max_len_a=1.2, max_len_b=10)
print(f"{n_test} sentences: BLEU {scores.bleu:.2f}  chrF {scores.chrf:.2f}")
print(scores.bleu_signature)

# %%
for de, en, hyp in list(zip(test_de, test_en, scores.hypotheses))[:3]:
    print(f"source:    {de}\nreference: {en}\noutput:    {hyp}\n")

# %% [markdown]
# ## Open it in the app
#
# The run directory is a checkpoint the app lists: `panel serve apps/attention.py --args --checkpoints runs/`
# (or `Workbench(checkpoint)` in a notebook, see `01_tour.ipynb`). Its views read the training log too:

# %%
from workbench.checkpoint.format import is_checkpoint

print(cfg.out_dir, "is a checkpoint:", is_checkpoint(cfg.out_dir))
from workbench.charts import lr_schedule_chart

lr_schedule_chart({}, steps=trainer.step, log=trainer.log)

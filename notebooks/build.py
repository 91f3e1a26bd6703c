"""Write the tutorial notebooks from the cell sources below (so reviews read Python, not JSON).

    python notebooks/build.py            # rewrites notebooks/*.ipynb, without outputs

Each notebook starts with a parameter cell (tagged "parameters" for papermill): `QUICK` comes from
the environment variable WORKBENCH_QUICK=1, which CI sets so every notebook finishes in seconds on CPU.
Committed notebooks carry no outputs; `tests/test_notebooks.py` executes them headless and checks them.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

PARAMS = '''\
import os

QUICK = os.environ.get("WORKBENCH_QUICK", "0") == "1"  # CI sets WORKBENCH_QUICK=1: seconds on one CPU core'''

BOKEH_ALTAIR_SETUP = '''\
import altair as alt
import torch
from bokeh.io import output_notebook, show
from bokeh.resources import INLINE

from workbench.charts.notebook import enable_altair

output_notebook(INLINE, hide_banner=True)  # BokehJS is inlined: the charts render with no internet
enable_altair()  # Altair charts as Vega specs, drawn by JupyterLab's own Vega renderer: offline, any number of them
if QUICK:
    torch.set_num_threads(1)  # tiny models on a busy 2-core CI box run faster on one thread'''

# A small model for when no trained checkpoint ships under ../checkpoints (and always in quick mode).
TINY_MODEL = '''\
import tempfile
from pathlib import Path

from workbench.checkpoint.format import is_checkpoint
from workbench.training.config import TrainConfig
from workbench.training import Trainer

SHIPPED = Path("../checkpoints/multi30k-de-en")  # the notebooks read German Multi30k: the de→en model
if is_checkpoint(SHIPPED) and not QUICK:
    CHECKPOINT = SHIPPED
    print(f"using the shipped checkpoint {CHECKPOINT}")
else:
    tiny = TrainConfig(
        dataset="multi30k", src_lang="de", tgt_lang="en", train_limit=2000 if QUICK else 29000,
        vocab_size=600 if QUICK else 4000, preset="tiny", model={"dropout": 0.1},
        max_tokens=1500 if QUICK else 3000, schedule="inverse_sqrt", lr=3e-3, warmup=20 if QUICK else 400,
        max_steps=TRAIN_STEPS, log_every=10 if QUICK else 100, valid_limit=20 if QUICK else 200,
        threads=1 if QUICK else 0, out_dir=tempfile.mkdtemp(prefix="workbench-tour-"),
    )
    trainer = Trainer(tiny).fit()
    CHECKPOINT = trainer.out_dir
    print(f"no shipped checkpoint used: trained a tiny model for {trainer.step} steps into a temporary directory")'''


def nb(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    out = []
    for number, (kind, text) in enumerate(cells):
        if kind == "md":
            cell = new_markdown_cell(text)
        else:
            cell = new_code_cell(text)
            if kind == "params":
                cell.metadata["tags"] = ["parameters"]
        cell.id = f"cell-{number:02d}"  # stable ids: a rebuild changes only the cells whose text changed
        out.append(cell)
    book = new_notebook(cells=out)
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    book.metadata["language_info"] = {"name": "python"}
    return book


# ------------------------------------------------------------------------------------------ 01
TOUR = [
    ("md", """\
# A tour of the Attention Workbench

Load a translation model, translate, capture a trace of every attention head, look at encoder, decoder and
cross-attention with the views library, ablate heads and watch the translation change, and open the whole
dashboard in this notebook.

**Which model?** If `../checkpoints/multi30k-de-en` ships (a trained German→English model), the tour uses it. Otherwise (and always in
quick mode, `WORKBENCH_QUICK=1`, which CI uses) it trains a *tiny* German→English model on a slice of Multi30k
for a few seconds into a temporary directory. That model translates badly, and the text below never pretends
otherwise: every number you see is computed by the cells."""),
    ("params", PARAMS + '''
TRAIN_STEPS = 40 if QUICK else 1500  # only used when no checkpoint ships'''),
    ("code", '''\
import panel as pn
import torch

import workbench
from workbench.ui.notebook import offline_notebook

pn.extension("vega", inline=True)  # Bokeh, Vega and Panel's JS inlined: renders with no internet
offline_notebook()  # ...and Panel's stylesheets too, also in the updates the dashboard gets from this kernel
if QUICK:
    torch.set_num_threads(1)'''),
    ("md", "## A model\n\nThe trainer writes a workbench checkpoint (`config.json`, `model.safetensors`, "
           "tokenizers, training log); `workbench.load` turns any checkpoint into a `TranslationModel`."),
    ("code", TINY_MODEL),
    ("code", '''\
tm = workbench.load(CHECKPOINT, max_len_a=1.5, max_len_b=10)  # decoding defaults; each call may override them
tm'''),
    ("md", "## Translate"),
    ("code", '''\
sentences = ["Ein Mann fährt mit dem Fahrrad.", "Zwei Hunde spielen im Schnee."]
tm.translate(sentences, beam=4)'''),
    ("md", """\
## Capture a trace

`tm.trace(text)` decodes and records every attention probability over the whole generation: a `Trace` is a
plain mapping from hook names to tensors, plus the token strings in `trace.meta`."""),
    ("code", '''\
result = tm.trace(sentences[0])
trace = result.trace
print(result.text)
print(len(trace), "tensors, e.g.", trace.names("dec.*.cross_attn.hook_probs"))
trace[("cross", trace.layers("cross") - 1)].shape  # (batch, heads, target steps, source tokens)'''),
    ("md", """\
## Encoder, decoder and cross-attention

Heatmaps (hover for tokens and weights), the BertViz-style head view (click a query token; toggle heads) and the
model view (every layer × head; tap a tile to enlarge it)."""),
    ("code", '''\
from workbench.charts import attention_heatmap, head_view, model_view

last = trace.layers("cross") - 1
pn.Row(
    pn.panel(attention_heatmap(trace, "enc_self", layer=0)),
    pn.panel(attention_heatmap(trace, "cross", layer=last)),
)'''),
    ("code", 'pn.panel(head_view(trace, "dec_self"))'),
    ("code", 'pn.panel(model_view(trace, ["enc_self", "cross"]))'),
    ("md", """\
## Ablate a head and watch the translation change

`ablate_heads` zeroes a head's output (at `hook_context`, before the output projection); `model.intervene` makes
that edit for the calls inside the `with` block only. For each cross-attention head of the last layer we
translate again and score the *original* output under the edited model (teacher forcing)."""),
    ("code", '''\
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
pd.DataFrame(rows)'''),
    ("md", "Ablating *every* cross-attention head cuts the decoder off from the source entirely:"),
    ("code", '''\
all_cross = {("cross", layer): list(range(tm.model.cfg.n_heads)) for layer in range(trace.layers("cross"))}
with tm.model.intervene(ablate_heads(all_cross)):
    print(tm.translate([sentences[0]], beam=1)[0])'''),
    ("md", """\
## The whole dashboard, inline

The same app as `panel serve apps/attention.py`, driven from this kernel: change the sentence from code and the
views follow."""),
    ("code", '''\
from workbench.ui import Workbench

wb = Workbench(CHECKPOINT, sentence=sentences[1])
wb'''),
    ("code", '''\
wb.session.sentence = sentences[0]
wb.session.result.trace.names("*.cross_attn.hook_probs")'''),
]

# ------------------------------------------------------------------------------------------ 02
ANNOTATED = [
    ("md", """\
# The Annotated Transformer, with the workbench's own modules

Harvard NLP's *Annotated Transformer* rebuilds "Attention Is All You Need" line by line. This notebook walks the
same path, but every piece is the workbench's real code (`workbench.core.model`, `embedding`, `masks`, `schedule`,
`loss`, `train`), looked at through its hook points and views instead of being re-implemented: embeddings and
positional encodings, masks, one encoder layer's hook points, the Noam schedule, label smoothing, weight tying,
pre- vs post-norm, and finally the copy task trained in a few cells on CPU."""),
    ("params", PARAMS + '''
COPY_STEPS = 60 if QUICK else 400'''),
    ("code", BOKEH_ALTAIR_SETUP),
    ("md", """\
## The model and its configuration

`presets.base()` is the paper's base model (Table 3). A `ModelConfig` is a frozen dataclass saved with every
checkpoint; below we use a tiny variant so everything runs instantly."""),
    ("code", '''\
from workbench import Transformer, presets

paper = presets.base()
print(paper)
print(f"{Transformer(paper).num_parameters():,} parameters in the base model")'''),
    ("code", '''\
cfg = presets.tiny(vocab=20)
model = Transformer(cfg).eval()
model'''),
    ("md", """\
## Embeddings and positional encodings

Tokens are embedded and multiplied by √d_model, then a positional encoding is added. The paper's encoding is
`PE(pos, 2i) = sin(pos / 10000^(2i/d))`, `PE(pos, 2i+1) = cos(pos / 10000^(2i/d))`. The view shows the table,
a few dimensions as curves (the Annotated Transformer's figure), and how similar positions are to each other,
for this config's layout and the other sinusoidal layouts that published models use."""),
    ("code", '''\
import math

from workbench.core.embedding import sinusoidal_positions

pe = sinusoidal_positions(50, 16)
pos, i = 7, 3  # check one sine and one cosine entry against the formula written out
print(pe[pos, 2 * i].item(), math.sin(pos / 10000 ** (2 * i / 16)))
print(pe[pos, 2 * i + 1].item(), math.cos(pos / 10000 ** (2 * i / 16)))'''),
    ("code", '''\
from workbench.charts import positional_encoding_view

show(positional_encoding_view(cfg, length=60))'''),
    ("md", """\
## Masks

One convention everywhere (SDPA's): `True` = may attend. The encoder hides padding keys; the decoder also hides
the future (causal mask). Below, a padded batch of three sentences."""),
    ("code", '''\
from workbench.charts import mask_view
from workbench.core.masks import causal_mask

src = torch.tensor([[5, 6, 7, 8, 2], [5, 6, 2, 0, 0], [9, 2, 0, 0, 0]])  # EOS = 2, padding = 0
tgt = torch.tensor([[1, 5, 6, 7, 8], [1, 5, 6, 0, 0], [1, 9, 0, 0, 0]])  # starts with BOS = 1
print(causal_mask(4).int())
show(mask_view(src, tgt, pad_id=cfg.pad_id))'''),
    ("md", """\
## One encoder layer's hook points

Every intermediate has a name, `{stack}.{layer}.{sublayer}.hook_{tensor}`; `run_with_cache` records the ones you
ask for. Here is everything one encoder layer exposes, with shapes (B, heads, length, d_head for q/k/v)."""),
    ("code", '''\
import pandas as pd

logits, cache = model.run_with_cache(src, tgt, names="enc.0.*")
pd.DataFrame([(name, tuple(cache[name].shape)) for name in cache.names()], columns=["hook", "shape"])'''),
    ("md", """\
The hook points read as the architecture. Attention rows sum to one; masked (padding) keys get exactly zero; and
in this post-norm layer (the paper's) the residual stream after self-attention is `LayerNorm(x + sublayer(x))`,
which we can recompute from the hooks and the layer's own norm module:"""),
    ("code", '''\
probs = cache["enc.0.self_attn.hook_probs"]
print("rows sum to 1:", torch.allclose(probs.sum(-1), torch.ones(())))
print("weight on padding keys of sentence 2:", probs[2, :, :, 2:].abs().max().item())
recomputed = model.enc[0].self_attn_norm(cache["enc.0.hook_resid_in"] + cache["enc.0.self_attn.hook_out"])
print("LayerNorm(x + attn(x)) == hook_resid_self_attn:",
      torch.allclose(recomputed, cache["enc.0.hook_resid_self_attn"], atol=1e-6))'''),
    ("code", '''\
from workbench.charts import attention_heatmap

show(attention_heatmap(cache, "enc_self", layer=0, heads=0, batch=1, select={"trim": False}))'''),
    ("md", """\
## The Noam schedule

`lr = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)`: linear warm-up, then inverse square root.
`workbench.training.schedule` holds it as a pure function of the step (step 0 gives 0); the chart draws it beside the
other schedules the trainer offers."""),
    ("code", '''\
from workbench.charts import lr_schedule_chart
from workbench.training.schedule import noam

peak = noam(4000, d_model=512, warmup=4000)
print(peak, 512 ** -0.5 * 4000 ** -0.5)  # the peak is at the end of warm-up
lr_schedule_chart(steps=20000)'''),
    ("md", """\
## Label smoothing

The paper smooths the target with ε = 0.1. The left chart is the smoothed target for one token; the right one
shows that with smoothing the loss is lowest *before* full confidence in the gold token, so the model is
penalised for being over-confident. `label_smoothed_nll` equals PyTorch's `cross_entropy(label_smoothing=)`:"""),
    ("code", '''\
import torch.nn.functional as F

from workbench.charts import label_smoothing_chart
from workbench.training.loss import label_smoothed_nll

scores = torch.randn(6, cfg.tgt_vocab)
gold = torch.tensor([4, 5, 6, 7, 0, 0])  # two padding positions are ignored
loss_sum, nll_sum, n_tokens = label_smoothed_nll(scores, gold, smoothing=0.1, ignore_index=cfg.pad_id)
reference = F.cross_entropy(scores, gold, label_smoothing=0.1, ignore_index=cfg.pad_id)
print(float(loss_sum / n_tokens), reference.item())
label_smoothing_chart(vocab=10, smoothing=0.4)'''),
    ("md", """\
## Weight tying

With a shared vocabulary the paper ties the source embedding, the target embedding and the output projection:
one matrix, used three times."""),
    ("code", '''\
import dataclasses

for tie in ("none", "decoder", "all"):
    m = Transformer(dataclasses.replace(cfg, tie_embeddings=tie))
    print(f"{tie:>8}: {m.num_parameters():6,} parameters; output = target embedding:",
          m.output_proj.weight is m.tgt_embed.weight, "; target = source embedding:", m.tgt_embed is m.src_embed)'''),
    ("md", """\
## Pre-norm vs post-norm

The paper normalises *after* each residual add (post-norm); most later models normalise the sub-layer's input
(pre-norm, `norm_first=True`), which trains deep stacks without warm-up tricks. The hooks show the difference:
post-norm keeps the residual stream at unit scale after every sub-layer, pre-norm lets it grow layer by layer."""),
    ("code", '''\
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
    x="layer:O", y="rms:Q", color="norm:N")'''),
    ("md", """\
## The copy task, trained in a few cells

The Annotated Transformer's first experiment: learn to copy random sequences of symbols. `Trainer` is the same
object the command line uses (`workbench train configs/copy_task.toml`); in a notebook it draws a live progress
view with loss and learning-rate charts."""),
    ("code", '''\
import tempfile

from workbench.training.config import TrainConfig
from workbench.training import Trainer

copy_cfg = TrainConfig.load("../configs/copy_task.toml")
copy_cfg = dataclasses.replace(copy_cfg, max_steps=COPY_STEPS, log_every=10, eval_every=0, copy_pairs=2000,
                               threads=1 if QUICK else 0, out_dir=tempfile.mkdtemp(prefix="copy-task-"))
trainer = Trainer(copy_cfg).fit()'''),
    ("code", '''\
from workbench.charts import training_curves_chart

training_curves_chart(trainer.log, ["loss", "lr", "grad_norm"])'''),
    ("md", """\
Greedy decoding of a few held-out sequences, and the cross-attention of the last decoder layer: once the task
is learned, each output step attends to the source position it copies, so the map becomes a diagonal
(with `COPY_STEPS` small in quick mode it may not be there yet)."""),
    ("code", '''\
from workbench.corpus.data import copy_task
from workbench.decoding.search import greedy

copy_model = trainer.model.eval()
held_out = torch.tensor([seq + [copy_model.cfg.eos_id] for seq in copy_task(5, vocab=11, length=10, seed=123)])
generated = greedy(copy_model, held_out, max_len=12)
exact = sum(h.tokens == row.tolist() for h, row in zip(generated.best, held_out))
print(f"{exact} of {len(held_out)} held-out sequences copied exactly")
for hyp, row in zip(generated.best[:2], held_out):
    print("source:", row.tolist(), "\\n output:", hyp.tokens)'''),
    ("code", '''\
out = torch.tensor([[copy_model.cfg.start_id, *generated.best[0].tokens[:-1]]])
_, copy_trace = copy_model.run_with_cache(held_out[:1], out)
show(attention_heatmap(copy_trace, "cross", layer=copy_model.cfg.dec_layers - 1))'''),
]

# ------------------------------------------------------------------------------------------ 03
MULTI30K = [
    ("md", """\
# Train a Multi30k German→English model from cells

The data (Multi30k task 1: image captions, 29k training pairs) comes from the shared data folder beside the
project (`../shared/data`, or `$WORKBENCH_DATA`), or is downloaded when missing and online. We train a joint
sentencepiece vocabulary, run the trainer with its live progress view, evaluate with sacreBLEU, and end with a
checkpoint the app opens.

**Settings.** The parameter cell picks one of three: *quick* (CI: a slice of the data, a tiny model, seconds),
*CPU* (the recipe of `configs/multi30k_de_en.toml` for a limited time) and *GPU* (the same recipe until it
converges, bf16). BLEU after a quick run is close to zero; that is expected, not a bug."""),
    ("params", PARAMS + '''
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SETTING = "quick" if QUICK else ("gpu" if DEVICE == "cuda" else "cpu")
CPU_MINUTES = 20.0  # the CPU setting's time budget (the config's full recipe: 31 minutes, cosine over the minutes)
OUT_DIR = "../runs/notebook_multi30k"  # quick mode writes to a temporary directory instead'''),
    ("code", BOKEH_ALTAIR_SETUP),
    ("md", "## The data"),
    ("code", '''\
from workbench.corpus.data import dataset_files, default_data_root, load_dataset

print("data root:", default_data_root())
train_de, train_en = load_dataset("multi30k", "train", "de", "en", limit=2000 if QUICK else 0)
test_de, test_en = load_dataset("multi30k", "test", "de", "en")
print(len(train_de), "training pairs,", len(test_de), "test pairs (test2016)")
for de, en in list(zip(train_de, train_en))[:3]:
    print(de, "→", en)'''),
    ("md", """\
## Sentencepiece

One BPE model for both languages (so source, target and output embeddings can be tied). It is trained in
memory on every sentence, deterministically."""),
    ("code", '''\
from workbench.checkpoint.tokenizer import SentencePieceTokenizer

VOCAB = 600 if QUICK else 8000
spm = SentencePieceTokenizer.train(sentences=train_de + train_en, vocab_size=VOCAB, model_type="bpe")
print(spm.vocab_size, "pieces")
print(spm.pieces(spm.encode(train_de[0])))'''),
    ("md", """\
## The trainer

`TrainConfig.load` reads the same TOML file as `workbench train configs/multi30k_de_en.toml`; the setting adjusts
its limits. The progress view below redraws in place: bar, latest numbers, loss, learning rate and validation
curves. Interrupting the kernel saves a checkpoint; `trainer.fit()` again continues exactly."""),
    ("code", '''\
import dataclasses
import tempfile

from workbench.training.config import TrainConfig
from workbench.training import Trainer

recipe = TrainConfig.load("../configs/multi30k_de_en.toml")
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
trainer.fit()'''),
    ("code", '''\
from workbench.charts import training_curves_chart

training_curves_chart(trainer.log, ["loss", "lr", "grad_norm", "tokens_per_s"])'''),
    ("code", '''\
import pandas as pd

pd.DataFrame([r for r in trainer.log if r["kind"] == "valid"]).drop(
    columns=["bleu_signature", "chrf_signature"], errors="ignore")'''),
    ("md", """\
## Evaluate on test2016 with sacreBLEU

The checkpoint the trainer wrote (averaged when the recipe averages) is loaded as a `TranslationModel`;
`workbench.evaluate.evaluate` translates with beam search and scores with sacreBLEU, signature included. The
same from the shell: `workbench evaluate --checkpoint DIR --src test_2016_flickr.de --ref test_2016_flickr.en`."""),
    ("code", '''\
from pathlib import Path

import workbench
from workbench.decoding.evaluate import evaluate

averaged = Path(cfg.out_dir) / "average"
best = averaged if averaged.is_dir() else Path(cfg.out_dir)
tm = workbench.load(best, device=DEVICE)
n_test = 50 if QUICK else len(test_de)
scores = evaluate(tm, test_de[:n_test], [test_en[:n_test]], beam=1 if QUICK else 5, max_len_a=1.2, max_len_b=10)
print(f"{n_test} sentences: BLEU {scores.bleu:.2f}  chrF {scores.chrf:.2f}")
print(scores.bleu_signature)'''),
    ("code", '''\
for de, en, hyp in list(zip(test_de, test_en, scores.hypotheses))[:3]:
    print(f"source:    {de}\\nreference: {en}\\noutput:    {hyp}\\n")'''),
    ("md", """\
## Open it in the app

The run directory is a checkpoint the app lists: `panel serve apps/attention.py --args --checkpoints runs/`
(or `Workbench(checkpoint)` in a notebook, see `01_tour.ipynb`). Its views read the training log too:"""),
    ("code", '''\
from workbench.checkpoint.format import is_checkpoint

print(cfg.out_dir, "is a checkpoint:", is_checkpoint(cfg.out_dir))
from workbench.charts import lr_schedule_chart

lr_schedule_chart({}, steps=trainer.step, log=trainer.log)'''),
]

# ------------------------------------------------------------------------------------------ 04
WMT = [
    ("md", """\
# Published WMT checkpoints

Import a published WMT English→German model (opus-mt through Marian, fairseq's WMT16 transformer, OpenNMT-py's
WMT model), score newstest2014 with `workbench evaluate`, rank its cross-attention heads over the test set, and
compare its attention with the workbench's own model.

**Offline.** Importing needs the model hubs. When they cannot be reached (and always in quick mode), the
notebook says so and builds a *small random Marian model locally* with `transformers`, saved in opus-mt's own
directory layout, so every later cell still runs: the import, evaluation and analysis code paths are the same,
only the scores are meaningless."""),
    ("params", PARAMS + '''
MODEL = "marian"  # one of the entries of SOURCES below
N_TEST = 20 if QUICK else 3003  # newstest2014 has 3003 sentences
BEAM = 1 if QUICK else 4
TRAIN_STEPS = 40 if QUICK else 1500  # the workbench model to compare with, when no checkpoint ships'''),
    ("code", BOKEH_ALTAIR_SETUP),
    ("code", '''\
import tempfile
from pathlib import Path

from workbench.corpus.data import default_data_root

SOURCES = {  # format, source, decoding options of the published evaluation
    "marian": ("marian", "hf:Helsinki-NLP/opus-mt-en-de", []),
    "fairseq": ("fairseq", "https://dl.fbaipublicfiles.com/fairseq/models/wmt16.en-de.joined-dict.transformer.tar.bz2",
                ["--length-penalty", "average", "--alpha", "0.6"]),
    "opennmt": ("opennmt", "https://s3.amazonaws.com/opennmt-models/transformer-ende-wmt-pyOnmt.tar.gz",
                ["--length-penalty", "average", "--alpha", "1.0"]),
}
fmt, source, decode_flags = SOURCES[MODEL]
work = Path(tempfile.mkdtemp(prefix="wmt-"))
news = default_data_root() / "wmt-news"
src_lines = (news / "newstest2014.en").read_text(encoding="utf-8").splitlines()[:N_TEST]
ref_lines = (news / "newstest2014.de").read_text(encoding="utf-8").splitlines()[:N_TEST]
(work / "test.en").write_text("\\n".join(src_lines) + "\\n", encoding="utf-8")
(work / "test.de").write_text("\\n".join(ref_lines) + "\\n", encoding="utf-8")
print(len(src_lines), "newstest2014 sentences")'''),
    ("md", "## Import (online) or build a stand-in (offline)"),
    ("code", '''\
from workbench.cli import main as workbench_cli
from workbench.corpus.download import NetworkUnreachable

ONLINE = False
if not QUICK:
    try:
        ONLINE = workbench_cli(["import", fmt, source, "--out", str(work / "imported")]) == 0
    except NetworkUnreachable as exc:
        print(exc)
if not ONLINE:
    print(f"The network is unavailable{' (quick mode does not try)' if QUICK else ''}: building a small random "
          "Marian model locally instead of importing", source)'''),
    ("code", '''\
if not ONLINE:  # a random opus-mt-shaped model: sentencepiece + vocab.json + MarianMTModel.save_pretrained
    import io
    import json

    import sentencepiece
    from transformers import MarianConfig, MarianMTModel

    buf = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(src_lines + ref_lines), model_writer=buf, vocab_size=300, model_type="unigram",
        character_coverage=1.0, bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1, minloglevel=2, hard_vocab_limit=False)
    sp = sentencepiece.SentencePieceProcessor(model_proto=buf.getvalue())
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.id_to_piece(i) not in ("</s>", "<unk>")]
    vocab = {t: i for i, t in enumerate(["</s>", "<unk>", *pieces, "<pad>"])}
    torch.manual_seed(0)
    hf = MarianMTModel(MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=len(vocab), pad_token_id=len(vocab) - 1, eos_token_id=0,
        decoder_start_token_id=len(vocab) - 1, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=256, share_encoder_decoder_embeddings=True, tie_word_embeddings=True))
    stand_in = work / "opus-mt-stand-in"
    hf.save_pretrained(stand_in)
    for name in ("source.spm", "target.spm"):
        (stand_in / name).write_bytes(buf.getvalue())
    (stand_in / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    assert workbench_cli(["import", "marian", str(stand_in), "--out", str(work / "imported")]) == 0'''),
    ("md", """\
## Score newstest2014 with `workbench evaluate`

Exactly the command a user types in a shell (`workbench evaluate --checkpoint DIR --src ... --ref ...`), called
here through the CLI's entry point, with the decoding settings of the published evaluation; it prints
sacreBLEU's BLEU and chrF with their signatures."""),
    ("code", '''\
args = ["evaluate", "--checkpoint", str(work / "imported"), "--src", str(work / "test.en"),
        "--ref", str(work / "test.de"), "--beam", str(BEAM), "--hyp-out", str(work / "hyp.de"), *decode_flags]
if QUICK:
    args += ["--max-len", "40"]
print("workbench", " ".join(args))
assert workbench_cli(args) == 0'''),
    ("md", """\
## Rank the cross-attention heads over the test set

`workbench.analysis.corpus_head_stats` teacher-forces the model on every (source, reference) pair and collects
per-head statistics. Heads whose attention is confident (a high maximum weight, Voita et al.'s confidence),
close to the diagonal and monotonic are the usual *alignment heads*."""),
    ("code", """\
import workbench
from workbench.analysis import corpus_head_stats

wmt = workbench.load(work / "imported")
eos = wmt.model.cfg.eos_id
wmt_src = [wmt.encode_source(s)[0] for s in src_lines]
wmt_tgt = [wmt.tgt_tokenizer.encode(r) + [eos] for r in ref_lines]
wmt_stats = corpus_head_stats(wmt.model, wmt_src, wmt_tgt, kinds=["cross"])
# newstest has sentences longer than the model's positions: references are cut (exact for the rows kept, the
# decoder being causal), over-long sources are skipped; both are counted
print(f"{len(wmt_stats.sentence_ids)} sentences, {len(wmt_stats.truncated)} references cut to "
      f"max_positions={wmt.model.cfg.max_positions}, {len(wmt_stats.skipped)} skipped")
wmt_stats.rank("max", kind="cross").head(8)"""),
    ("md", """\
## Compare with the workbench's own model

The workbench's model translates the other way (German→English), so we give it the German references as input
and compare the two models' cross-attention: the same statistics per head, and one sentence side by side. It is
the shipped checkpoint when `../checkpoints/` holds one (outside quick mode), else the tour's tiny model."""),
    ("code", TINY_MODEL),
    ("code", """\
import pandas as pd

ours = workbench.load(CHECKPOINT)
our_src = [ours.encode_source(r)[0] for r in ref_lines]
our_tgt = [ours.tgt_tokenizer.encode(s) + [ours.model.cfg.eos_id] for s in src_lines]
our_stats = corpus_head_stats(ours.model, our_src, our_tgt, kinds=["cross"])
both = pd.concat([wmt_stats.summary().assign(model=f"{MODEL} (en→de)"),
                  our_stats.summary().assign(model="workbench (de→en)")])
alt.Chart(both, title="cross-attention heads: confidence vs distance from the diagonal").mark_circle(size=80).encode(
    x="diag_distance:Q", y="max:Q", color="model:N", tooltip=["model", "layer", "head", "max", "diag_distance"])"""),
    ("code", """\
from bokeh.layouts import row

from workbench.charts import attention_heatmap

a = wmt.trace(src_lines[0], beam=1, max_len=40)
b = ours.trace(ref_lines[0], beam=1, max_len=40)
size = dict(words=True, width=480, height=420)
show(row(attention_heatmap(a.trace, "cross", layer=a.trace.layers("cross") - 1, **size),
         attention_heatmap(b.trace, "cross", layer=b.trace.layers("cross") - 1, **size)))"""),
]

# ------------------------------------------------------------------------------------------ 05
HEADS = [
    ("md", """\
# Heads at scale

Attention maps of one sentence are anecdotes. Here we compute per-head statistics over a whole test set
(`workbench.analysis.corpus_head_stats`), find the sentences where a head behaves unusually, and measure each
head's importance by ablating it and re-scoring BLEU. The model is the shipped checkpoint when `../checkpoints/`
holds one (outside quick mode), else a tiny model trained in a few seconds, whose heads are far less
specialised."""),
    ("params", PARAMS + """
TRAIN_STEPS = 40 if QUICK else 1500  # only used when no checkpoint ships
N_SENTENCES = 40 if QUICK else 1000  # Multi30k test2016 has 1000"""),
    ("code", BOKEH_ALTAIR_SETUP),
    ("code", TINY_MODEL),
    ("code", """\
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
STATS"""),
    ("md", "## One row per head\n\nCorpus values (token-weighted means over every sentence):"),
    ("code", """\
summary = stats.summary()
summary.round(3)"""),
    ("code", """\
long = summary.melt(id_vars=["kind", "layer", "head"], value_vars=["entropy_norm", "max", "eos", "prev"],
                    var_name="stat")
alt.Chart(long).mark_rect().encode(
    x="head:O", y="layer:O", color=alt.Color("value:Q", scale=alt.Scale(scheme="viridis")),
    tooltip=["kind", "layer", "head", "stat", alt.Tooltip("value:Q", format=".3f")],
).properties(width=120, height=90).facet(row="stat:N", column="kind:N").resolve_scale(color="independent")"""),
    ("md", """\
## Where does a head behave unusually?

Take the encoder head that attends most to the previous token over the corpus, and list the sentences where it
does so least: its outliers. Then look at the most unusual one."""),
    ("code", """\
top = stats.rank("prev", kind="enc_self").iloc[0]
layer, head = int(top["layer"]), int(top["head"])
print(f"encoder layer {layer} head {head}: previous-token weight {top['prev']:.3f} over the corpus")
odd = stats.sentences("enc_self", layer, head, "prev", top=5, largest=False)
odd.assign(text=[test_de[i] for i in odd["sentence"]])"""),
    ("code", """\
from workbench.charts import attention_heatmap

i = int(odd["sentence"].iloc[0])
src = torch.tensor([sources[i]])
tgt = torch.tensor([[tm.model.cfg.start_id, *targets[i][:-1]]])
_, trace = tm.model.run_with_cache(src, tgt)
trace.meta.update(src_pieces=tm.src_tokenizer.pieces(sources[i]),
                  tgt_pieces=tm.tgt_tokenizer.pieces([tm.model.cfg.start_id, *targets[i][:-1]]))
show(attention_heatmap(trace, "enc_self", layer=layer, heads=head))"""),
    ("md", """\
## Head importance by ablation on BLEU

Ablate one head at a time (zero its output, `workbench.core.interventions.ablate_heads`), translate the test
sentences again and compare BLEU with the intact model (Michel et al., 2019, *Are Sixteen Heads Really Better
than One?*). In quick mode only the cross-attention heads of the last layer are tried, on a handful of
sentences."""),
    ("code", """\
import pandas as pd

from workbench.decoding.evaluate import evaluate
from workbench.core.interventions import ablate_heads

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
importance"""),
    ("code", """\
alt.Chart(importance.assign(block=importance["kind"] + " " + importance["layer"].astype(str)),
          title="BLEU change when one head is ablated").mark_bar().encode(
    x="head:O", y="delta:Q", color="block:N", column="block:N", tooltip=["kind", "layer", "head", "bleu", "delta"])"""),
]

NOTEBOOKS = {
    "01_tour.ipynb": TOUR,
    "02_annotated_transformer.ipynb": ANNOTATED,
    "03_train_multi30k.ipynb": MULTI30K,
    "04_wmt_checkpoints.ipynb": WMT,
    "05_heads_at_scale.ipynb": HEADS,
}


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        book = nb(cells)
        nbformat.validate(book)
        nbformat.write(book, HERE / name)
        print("wrote", HERE / name)


if __name__ == "__main__":
    main()

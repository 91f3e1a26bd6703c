# %% [markdown]
# # Published WMT checkpoints
#
# Import a published WMT English→German model (opus-mt through Marian, fairseq's WMT16 transformer, OpenNMT-py's
# WMT model), score newstest2014 with `workbench evaluate`, rank its cross-attention heads over the test set, and
# compare its attention with the workbench's own model.
#
# **Offline.** Importing needs the model hubs. When they cannot be reached (and always in quick mode), the
# notebook says so and builds a *small random Marian model locally* with `transformers`, saved in opus-mt's own
# directory layout, so every later cell still runs: the import, evaluation and analysis code paths are the same,
# only the scores are meaningless.

# %% tags=["parameters"]
import os

QUICK = os.environ.get("WORKBENCH_QUICK", "0") == "1"  # CI sets WORKBENCH_QUICK=1: seconds on one CPU core
MODEL = "marian"  # one of the entries of SOURCES below
N_TEST = 20 if QUICK else 3003  # newstest2014 has 3003 sentences
BEAM = 1 if QUICK else 4
TRAIN_STEPS = 40 if QUICK else 1500  # the workbench model to compare with, when no checkpoint ships

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
(work / "test.en").write_text("\n".join(src_lines) + "\n", encoding="utf-8")
(work / "test.de").write_text("\n".join(ref_lines) + "\n", encoding="utf-8")
print(len(src_lines), "newstest2014 sentences")

# %% [markdown]
# ## Import (online) or build a stand-in (offline)

# %%
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
          "Marian model locally instead of importing", source)

# %%
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
    assert workbench_cli(["import", "marian", str(stand_in), "--out", str(work / "imported")]) == 0

# %% [markdown]
# ## Score newstest2014 with `workbench evaluate`
#
# Exactly the command a user types in a shell (`workbench evaluate --checkpoint DIR --src ... --ref ...`), called
# here through the CLI's entry point, with the decoding settings of the published evaluation; it prints
# sacreBLEU's BLEU and chrF with their signatures.

# %%
args = ["evaluate", "--checkpoint", str(work / "imported"), "--src", str(work / "test.en"),
        "--ref", str(work / "test.de"), "--beam", str(BEAM), "--hyp-out", str(work / "hyp.de"), *decode_flags]
if QUICK:
    args += ["--max-len", "40"]
print("workbench", " ".join(args))
assert workbench_cli(args) == 0

# %% [markdown]
# ## Rank the cross-attention heads over the test set
#
# `workbench.analysis.corpus_head_stats` teacher-forces the model on every (source, reference) pair and collects
# per-head statistics. Heads whose attention is confident (a high maximum weight, Voita et al.'s confidence),
# close to the diagonal and monotonic are the usual *alignment heads*.

# %%
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
wmt_stats.rank("max", kind="cross").head(8)

# %% [markdown]
# ## Compare with the workbench's own model
#
# The workbench's model translates the other way (German→English), so we give it the German references as input
# and compare the two models' cross-attention: the same statistics per head, and one sentence side by side. It is
# the shipped checkpoint when `checkpoints/` holds one (outside quick mode), else the tour's tiny model.

# %%
from workbench.training.tutorial import tutorial_checkpoint

CHECKPOINT, how = tutorial_checkpoint(quick=QUICK, steps=TRAIN_STEPS)  # the notebooks read German Multi30k
print(how)

# %%
import pandas as pd

ours = workbench.load(CHECKPOINT)
our_src = [ours.encode_source(r)[0] for r in ref_lines]
our_tgt = [ours.tgt_tokenizer.encode(s) + [ours.model.cfg.eos_id] for s in src_lines]
our_stats = corpus_head_stats(ours.model, our_src, our_tgt, kinds=["cross"])
both = pd.concat([wmt_stats.summary().assign(model=f"{MODEL} (en→de)"),
                  our_stats.summary().assign(model="workbench (de→en)")])
alt.Chart(both, title="cross-attention heads: confidence vs distance from the diagonal").mark_circle(size=80).encode(
    x="diag_distance:Q", y="max:Q", color="model:N", tooltip=["model", "head_id", "max", "diag_distance"])

# %%
from bokeh.layouts import row

from workbench.charts import attention_heatmap

a = wmt.trace(src_lines[0], beam=1, max_len=40)
b = ours.trace(ref_lines[0], beam=1, max_len=40)
size = dict(words=True, width=480, height=420)
show(row(attention_heatmap(a.trace, "cross", layer=a.trace.layers("cross") - 1, **size),
         attention_heatmap(b.trace, "cross", layer=b.trace.layers("cross") - 1, **size)))

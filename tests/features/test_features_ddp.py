"""Feature statistics and dictionary training under torchrun (2 gloo processes): statistics equal one process's,
and the ranks train identical dictionaries from their own shares of the stream."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parents[1]

# Each rank builds the same tiny model, corpus and dictionary, computes the statistics over its share of the corpus
# and trains a few steps on its share of the stream; rank 0 writes the statistics, every rank its dictionary.
RANK_SCRIPT = """
import json, os, sys, torch
from safetensors.torch import save_file
from features_ddp_helpers import corpus, dictionary, model, train_config
from workbench.features.stats import corpus_feature_stats
from workbench.features.train import FeatureTrainer
from workbench.training.distributed import init_distributed
from workbench.decoding.translator import TranslationModel
out = sys.argv[1]
di = init_distributed()
m, data = model(), corpus()
tm = TranslationModel(m, None)
stats = corpus_feature_stats(tm, dictionary(), data, top=5, dist_info=di)
if di.main:
    stats.save(os.path.join(out, "stats.safetensors"))
trainer = FeatureTrainer(train_config(out), translation_model=tm, data=data)
d = trainer.fit()
save_file({k: v.contiguous() for k, v in d.state_dict().items()}, os.path.join(out, f"rank{di.rank}.safetensors"))
json.dump({"rows": trainer.stream.rows_read, "log": trainer.log}, open(os.path.join(out, f"rank{di.rank}.json"), "w"))
"""

HELPERS = """
import torch
from model_helpers import make_model
from workbench import presets
from workbench.corpus.data import ParallelData
from workbench.features import DictionaryConfig, SparseDictionary
from workbench.features.train import FeatureTrainConfig

def model():
    return make_model(presets.tiny())

def corpus():
    g = torch.Generator().manual_seed(3)
    lens = torch.randint(3, 12, (80, 2), generator=g)
    src = [torch.randint(4, 96, (int(a),), generator=g).tolist() for a, _ in lens]
    tgt = [torch.randint(4, 96, (int(b),), generator=g).tolist() for _, b in lens]
    return ParallelData(src, tgt)

def dictionary():
    torch.manual_seed(1)
    d = SparseDictionary(DictionaryConfig("dec.1.cross_attn.hook_out", 32, 48, k=6))
    with torch.no_grad():
        d.b_enc.normal_(0, 0.2)
    return d

def train_config(out):
    return FeatureTrainConfig(checkpoint="tiny", site="hook_memory", out_dir=out + "/run", d_sae=48, k=4,
                              activations=32 * 6, batch=32, buffer=64, max_tokens=64, warmup=2, log_every=3,
                              progress="none", dead_after=64)
"""


@pytest.mark.slow
def test_two_gloo_processes_match_one(tmp_path):
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    (tmp_path / "features_ddp_helpers.py").write_text(HELPERS)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.getcwd(), str(TESTS), str(tmp_path)]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2",
           str(tmp_path / "rank.py"), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    sys.path.insert(0, str(tmp_path))
    try:
        import features_ddp_helpers as h
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("features_ddp_helpers", None)
    from safetensors.torch import load_file

    from workbench.decoding.translator import TranslationModel
    from workbench.features.stats import FeatureStats, corpus_feature_stats

    two = FeatureStats.load(tmp_path / "stats.safetensors")
    one = corpus_feature_stats(TranslationModel(h.model(), None), h.dictionary(), h.corpus(), top=5)
    assert two.meta["world"] == 2 and one.tokens == two.tokens > 0
    assert torch.equal(one.count, two.count) and torch.equal(one.hist, two.hist)
    assert torch.equal(one.max, two.max) and torch.allclose(one.total, two.total)
    assert torch.equal(one.top_values, two.top_values)
    # the same contexts: (corpus sentence, position) per feature and rank
    ctx = lambda s: [[(s.sentence_ids[j], p) if j >= 0 else None for j, p in zip(js, ps)]
                     for js, ps in zip(s.top_sentence.tolist(), s.top_position.tolist())]
    assert ctx(one) == ctx(two)
    # the same uniform samples of firings (hashed priorities: independent of the sharding)
    assert torch.equal(one.sample_values, two.sample_values)
    smp = lambda s: [[(s.sentence_ids[j], p) if j >= 0 else None for j, p in zip(js, ps)]
                     for js, ps in zip(s.sample_sentence.tolist(), s.sample_position.tolist())]
    assert smp(one) == smp(two)
    assert one.sentences_src == two.sentences_src and int(one.count.sum()) > 0
    # histograms hold every firing, counts by hand
    assert torch.equal(two.hist.sum(1), two.count)

    # training: each rank read its own share of the stream, and both hold the same dictionary
    r0, r1 = load_file(tmp_path / "rank0.safetensors"), load_file(tmp_path / "rank1.safetensors")
    for k in r0:
        assert torch.equal(r0[k], r1[k]), k
    logs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert logs[0]["rows"] > 0 and logs[1]["rows"] > 0
    reduced = lambda log: [{k: r[k] for k in ("step", "lr", "fvu", "aux", "l0", "dead_frac")} for r in log]
    assert reduced(logs[0]["log"]) == reduced(logs[1]["log"]) and len(logs[0]["log"]) == 2
    assert all(0 < rec["fvu"] < 10 for rec in logs[0]["log"])

"""Feature dashboards' data on the shipped de->en model with a small random dictionary: statistics that agree with
a direct recomputation, contexts on the right tokens, output effects equal to a hand-made ablation, search, and
the charts built from them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from workbench import Transformer, presets
from workbench.core.batching import teacher_forced
from workbench.corpus.data import ParallelData, load_dataset
from workbench.decoding.translator import load
from workbench.features import DictionaryConfig, SparseDictionary, capture_site
from workbench.features.dashboard import FeatureData
from workbench.features.stats import FeatureStats, corpus_feature_stats

CKPT = Path(__file__).resolve().parents[1] / "checkpoints" / "multi30k-de-en"


@pytest.fixture(scope="module")
def fd(tmp_path_factory):
    tm = load(CKPT)
    torch.manual_seed(0)
    d = SparseDictionary(DictionaryConfig("hook_memory", 128, 64, k=6))
    src, tgt = load_dataset("multi30k", "valid", "de", "en", limit=24)
    data = ParallelData.encode(src, tgt, tm.src_tokenizer, tm.tgt_tokenizer)
    stats = corpus_feature_stats(tm, d, data, top=4, meta={"corpus": "multi30k:valid"})
    path = stats.save(tmp_path_factory.mktemp("stats") / "stats.safetensors")
    return FeatureData(tm, d, FeatureStats.load(path))


def test_statistics_agree_with_a_direct_recomputation(fd):
    s, tm = fd.stats, fd.tm
    assert torch.equal(s.hist.sum(1), s.count) and s.tokens > 0
    f = int(s.count.argmax())
    for value, j, p in s.contexts(f):
        src = torch.tensor([s.sentences_src[j] + [tm.model.cfg.eos_id]])
        acts = capture_site(tm.model, src, torch.tensor([[tm.model.cfg.start_id]]), fd.site)["hook_memory"]
        with torch.no_grad():
            assert float(fd.d.encode(acts[0, p])[f]) == pytest.approx(value, rel=1e-5)
    assert [v for v, _, _ in s.contexts(f)] == sorted((v for v, _, _ in s.contexts(f)), reverse=True)
    left, right, counts = fd.histogram(f)
    assert sum(counts) == int(s.count[f]) and all(a < b for a, b in zip(left, right))
    assert left[0] <= float(s.max[f]) and (float(s.max[f]) <= right[-1] or counts[-1] > 0)
    with pytest.raises(ValueError, match="features 0..63"):
        fd.summary(64)


def test_contexts_output_effects_and_search(fd):
    tm, s = fd.tm, fd.stats
    f = int(s.count.argmax())
    ctx = fd.contexts(f)
    assert ctx and all(0 <= c.position < len(c.pieces) for c in ctx)
    assert ctx[0].aligned in tm.tgt_tokenizer.pieces(tm.tgt_tokenizer.encode(ctx[0].target)) + ["</s>"]
    effects = fd.output_effects(f, contexts=1, top=3)
    assert len(effects["heads"]) == 16 and effects["contexts"] == 1
    # the whole-site drop of the top token, by hand: subtract a_f * W_dec[f] at the firing token
    c = ctx[0]
    j = s.contexts(f)[0][1]
    src = torch.tensor([s.sentences_src[j] + [tm.model.cfg.eos_id]])
    tgt_in = torch.tensor([[tm.model.cfg.start_id, *s.sentences_tgt[j]]])
    delta = c.value * fd.d.W_dec[f].detach()

    def remove(x, hook):
        x = x.clone()
        x[0, c.position] -= delta
        return x

    with torch.no_grad():
        clean = tm.model(src, tgt_in).log_softmax(-1)[0, c.aligned_position]
        with tm.model.hooks([("hook_memory", remove)]):
            ablated = tm.model(src, tgt_in).log_softmax(-1)[0, c.aligned_position]
    top = effects["tokens"][0]
    assert float(clean[top["id"]] - ablated[top["id"]]) == pytest.approx(top["drop"], abs=1e-4)
    assert top["drop"] == pytest.approx(float((clean - ablated).max()), abs=1e-4)
    # search finds the feature from the piece it fires on
    word = c.pieces[c.position].replace("\u2581", "")
    assert f in [h["feature"] for h in fd.search(word, limit=64)]
    assert fd.search("   ") == []


def test_sentence_features_and_charts(fd):
    from bokeh.embed import file_html
    from bokeh.resources import CDN

    from workbench.charts.features import contexts_html, feature_dashboard, sentence_features_html

    out = fd.sentence("Zwei Hunde spielen im Schnee.", "Two dogs play in the snow.")
    feats = out["activations"]
    assert feats.shape == (len(out["tokens"]), 64) and int((feats > 0).sum(1).max()) <= 6
    first = out["tokens"][0]
    assert first["features"][0][0] == int(feats[0].argmax())
    page = sentence_features_html(out)
    assert page.count("data-feature=") == sum(len(t["features"]) for t in out["tokens"])
    assert "?feature=" in page
    f = int(fd.stats.count.argmax())
    assert "class='firing'" in contexts_html(fd.contexts(f))
    html = file_html(feature_dashboard(fd, f, contexts=3), CDN, "feature")
    assert "feature_histogram" in html and "feature_output_tokens" in html and "feature_heads" in html


def test_aligned_positions_count_a_start_token_that_is_the_padding_id():
    """Marian's decoder starts with its padding id: the start row is a real position (lengths say so, not ids);
    padding after a shorter target is still never chosen."""
    torch.manual_seed(0)
    model = Transformer(presets.tiny(decoder_start_id=0)).eval()
    cfg = model.cfg
    assert cfg.start_id == cfg.pad_id
    fd = FeatureData.__new__(FeatureData)  # only the model is needed to align
    fd.tm = SimpleNamespace(model=model)
    sources = [[5, 6, 7, 8, cfg.eos_id]] * 6
    outputs = [[9, 10, 11, cfg.eos_id]] * 5 + [[9, cfg.eos_id]]
    batch = teacher_forced(sources, outputs, pad_id=cfg.pad_id, start_id=cfg.start_id)
    positions = [0, 1, 2, 3, 4, 0]
    got = fd._aligned(batch, positions)
    with torch.no_grad():  # by hand: mean cross-attention over layers and heads, argmax over the real rows
        _, trace = model.run_with_cache(batch.src, batch.tgt_in, names="dec.*.cross_attn.hook_probs")
    att = torch.stack([trace[f"dec.{i}.cross_attn.hook_probs"] for i in range(len(model.dec))]).mean((0, 2))
    want = [int(att[r, : len(outputs[r]), p].argmax()) for r, p in enumerate(positions)]
    assert got == want
    assert 0 in got[:5]  # the start row wins somewhere: masking it by id would move those
    assert got[5] < 2

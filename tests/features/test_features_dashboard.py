"""Feature dashboards' data on the shipped de->en model with a small random dictionary: statistics that agree with
a direct recomputation, contexts on the right tokens (top and across quantiles), output effects equal to hand-made
ablations of the values and of hook_memory, the direct logit effect equal to the model's own forward pass with its
norms frozen, nearest features, search, and the charts built from them; on the shipped dictionaries, the token a
live feature raises most is one the model gives real probability in its contexts."""

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
from workbench.features.dashboard import EFFECT_CONTROLS, EFFECT_FLOOR, FeatureData
from workbench.features.stats import FeatureStats, corpus_feature_stats

CKPT = Path(__file__).resolve().parents[2] / "checkpoints" / "multi30k-de-en"


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
    c = ctx[0]
    j = s.contexts(f)[0][1]
    src = torch.tensor([s.sentences_src[j] + [tm.model.cfg.eos_id]])
    tgt_in = torch.tensor([[tm.model.cfg.start_id, *s.sentences_tgt[j]]])
    delta = c.value * fd.d.W_dec[f].detach()

    def remove(x, hook):  # hook_memory itself: keys and values of every cross-attention layer
        x = x.clone()
        x[0, c.position] -= delta
        return x

    def remove_values(layer):  # the values alone, from the memory edit's image under W_V
        dv = (delta @ tm.model.dec[layer].cross_attn.v_proj.weight.T).view(4, -1)

        def fn(v, hook):
            v = v.clone()
            v[0, :, c.position] -= dv
            return v
        return fn

    with torch.no_grad():
        clean = tm.model(src, tgt_in).log_softmax(-1)[0, c.aligned_position]
        with tm.model.hooks([("hook_memory", remove)]):
            memory = tm.model(src, tgt_in).log_softmax(-1)[0, c.aligned_position]
        with tm.model.hooks([(f"dec.{i}.cross_attn.hook_v", remove_values(i)) for i in range(4)]):
            values = tm.model(src, tgt_in).log_softmax(-1)[0, c.aligned_position]
    for edit, ablated in (("values", values), ("memory", memory)):
        effects = fd.output_effects(f, contexts=1, top=3, edit=edit)
        assert len(effects["heads"]) == 16 and effects["contexts"] == 1
        assert ("keys, so attention patterns, clean" in effects["edited"]) == (edit == "values")
        dp = clean.exp() - ablated.exp()
        top, low = effects["tokens"][0], effects["lowers"][0]
        assert top["dp"] == pytest.approx(float(dp.max()), abs=1e-5) and top["id"] == int(dp.argmax())
        assert low["dp"] == pytest.approx(float(dp.min()), abs=1e-5) and low["dp"] < 0
        assert top["p_clean"] == pytest.approx(float(clean[top["id"]].exp()), abs=1e-5)
        assert top["drop"] == pytest.approx(float(clean[top["id"]] - ablated[top["id"]]), abs=1e-4)
    assert fd.output_effects(f, contexts=1, heads=False)["heads"] == []
    one = effects["tokens"][0]  # one context: where it moves is that context
    assert one["p_clean_where"] == pytest.approx(one["p_clean"], abs=1e-6)
    assert one["contexts_where"] == int(abs(one["dp"]) >= EFFECT_FLOOR)
    with pytest.raises(ValueError, match="edit must be"):
        fd.output_effects(f, edit="keys")
    # search finds the feature from the piece it fires on
    word = c.pieces[c.position].replace("\u2581", "")
    assert f in [h["feature"] for h in fd.search(word, limit=64)]
    assert fd.search("   ") == []


def test_output_effects_are_measurable_only_above_the_floor_and_the_random_controls(fd):
    """`measurable`: the top change in probability is at least the floor and above that of each control, a random
    direction of the feature's norm (seeded by the feature id) removed the same way: checked against hand-made
    removals of those directions from hook_memory (edit="memory")."""
    tm, s = fd.tm, fd.stats
    f = int(s.count.argmax())
    c = fd.contexts(f, 1)[0]
    j = s.contexts(f)[0][1]
    src = torch.tensor([s.sentences_src[j] + [tm.model.cfg.eos_id]])
    tgt_in = torch.tensor([[tm.model.cfg.start_id, *s.sentences_tgt[j]]])
    direction = fd.d.W_dec[f].detach()
    randoms = torch.randn(EFFECT_CONTROLS, direction.numel(), generator=torch.Generator().manual_seed(f))
    randoms = randoms / randoms.norm(dim=1, keepdim=True) * direction.norm()

    def removed(delta):
        def fn(x, hook):
            x = x.clone()
            x[0, c.position] -= delta
            return x
        with tm.model.hooks([("hook_memory", fn)]):
            return tm.model(src, tgt_in).softmax(-1)[0, c.aligned_position]
    with torch.no_grad():
        clean = tm.model(src, tgt_in).softmax(-1)[0, c.aligned_position]
        own = float((clean - removed(c.value * direction)).max())
        control = max(float((clean - removed(c.value * r)).max()) for r in randoms)
    e = fd.output_effects(f, contexts=1, edit="memory", heads=False)
    assert e["top_dp"] == pytest.approx(own, abs=1e-5) and e["top_dp"] == pytest.approx(e["tokens"][0]["dp"])
    assert e["control_top_dp"] == pytest.approx(control, abs=1e-5) and e["controls"] == EFFECT_CONTROLS == 19
    assert e["measurable"] == (own >= e["floor"] and own > control)
    assert (e["effect"] == "measurable") == e["measurable"]
    high = fd.output_effects(f, contexts=1, edit="memory", heads=False, floor=own + 0.01)
    assert not high["measurable"] and high["effect"].startswith("no measurable output effect: removing it raises")
    assert high["tokens"] == e["tokens"]  # the ranking is kept, flagged
    none = fd.output_effects(f, contexts=1, edit="memory", heads=False, floor=0.0, controls=0)
    assert none["measurable"] == (own > 0) and none["control_top_dp"] == 0.0


def test_quantile_contexts_summary_and_nearest(fd):
    s, tm = fd.stats, fd.tm
    f = int(s.count.argmax())
    q = fd.quantile_contexts(f, bands=4, per_band=2)
    assert 4 <= len(q) <= 8 and [c.value for c in q] == sorted(c.value for c in q)
    assert q[0].band == "0-25 %" and q[-1].band == "75-100 %" and q[0].value < fd.contexts(f)[0].value
    for c in (q[0], q[-1]):  # each sampled value is the feature's activation there
        src = torch.tensor([tm.src_tokenizer.encode(c.source) + [tm.model.cfg.eos_id]])
        acts = capture_site(tm.model, src, torch.tensor([[tm.model.cfg.start_id]]), fd.site)["hook_memory"]
        with torch.no_grad():
            assert float(fd.d.encode(acts[0, c.position])[f]) == pytest.approx(c.value, rel=1e-4)
    assert len(s.samples(f)) == min(32, int(s.count[f]))
    summary = fd.summary(f)
    assert summary["density"] == ("dense" if summary["frequency"] > 0.1 else "ok")
    assert bool(summary["warning"]) == (summary["density"] != "ok")
    near = fd.nearest(f, top=3)
    w = fd.d.W_dec / fd.d.W_dec.norm(dim=1, keepdim=True)
    cos = (w @ w[f]).detach()
    cos[f] = -2
    assert [n["feature"] for n in near] == cos.topk(3).indices.tolist()


def test_direct_effect_is_the_forward_pass_with_frozen_norms():
    """An SAE on the last decoder block's output: adding its direction at one position changes the logits there,
    with every norm's 1/σ frozen at the clean run's, by the direct effect times one positive factor."""
    tm = load(CKPT)
    torch.manual_seed(1)
    d = SparseDictionary(DictionaryConfig("dec.3.ffn.hook_out", 128, 16, k=2))
    fd = FeatureData(tm, d)
    de = fd.direct_effects(3, top=5)
    assert de["path"].startswith("dec.3.ffn")
    model = tm.model
    src, tgt_in = torch.tensor([tm.src_tokenizer.encode("Zwei Hunde spielen im Schnee.") + [2]]), \
        torch.tensor([[model.cfg.start_id, *tm.tgt_tokenizer.encode("Two dogs play")]])
    with torch.no_grad():
        _, trace = model.run_with_cache(src, tgt_in, names="*hook_scale")
        freeze = [(n, (lambda t: lambda x, hook: t)(trace[n])) for n in trace.keys()]
        clean = model(src, tgt_in)[0, 2]

        def add(x, hook):
            x = x.clone()
            x[0, 2] += 1e-2 * d.W_dec[3]
            return x
        with model.hooks(freeze + [("dec.3.ffn.hook_out", add)]):
            edited = model(src, tgt_in)[0, 2]
    change = (edited - clean) / 1e-2
    change = change - change.mean()
    want = fd._to_logits(d.W_dec[3].detach(), fd._direct_path(3, "ffn")).detach()
    want = want - want.mean()
    ratio = float(change @ want / (want @ want))
    assert ratio > 0 and torch.allclose(change, ratio * want, atol=1e-3 * float(change.abs().max()))
    assert [t["id"] for t in de["raises"]] == want.topk(5).indices.tolist()
    # hook_memory: the OV path of every head, summed
    mem = FeatureData(tm, SparseDictionary(DictionaryConfig("hook_memory", 128, 16, k=2))).direct_effects(0)
    assert len(mem["heads"]) == 16 and mem["raises"] and "OV" in mem["path"]


def test_where_a_token_moves_weights_its_clean_probability_by_how_far_it_moves():
    """`_where` by hand: a token raised in one of three contexts (p 0.29 -> 0.10 there, 0 elsewhere: the mean over
    the three is 0.097) has its clean probability where it moves, 0.29, in 1 context; one moved in two contexts by
    0.1 and 0.3 is weighted 1:3; a token nothing moves counts no context."""
    from workbench.features.dashboard import _where

    clean = torch.tensor([[0.0, 0.5, 0.2], [0.29, 0.2, 0.2], [0.0, 0.6, 0.2]])  # (3 contexts, 3 tokens)
    without = torch.tensor([[0.0, 0.4, 0.2], [0.10, 0.2, 0.2], [0.0, 0.3, 0.2]])
    p, n = _where(clean, without, 0.005)
    assert p[0] == pytest.approx(0.29) and int(n[0]) == 1
    assert float(clean[:, 0].mean()) == pytest.approx(0.0967, abs=1e-4)  # the plain mean dilutes it
    assert p[1] == pytest.approx((0.5 * 0.1 + 0.6 * 0.3) / 0.4) and int(n[1]) == 2
    assert int(n[2]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("site", sorted(p.name for p in (CKPT / "features").glob("*") if (p / "cfg.json").is_file()))
def test_shipped_features_raise_tokens_the_model_gives_real_probability(site):
    """Issue 38's check on 8 seeded live features per shipped dictionary (every feature: far too slow for a test;
    scripts/check_feature_effects.py runs any number): the top raised token should have a mean clean probability
    of at least 0.05 over the feature's 8 top contexts. It does not hold for every feature (see docs/features.md:
    most sampled features of the L0-16 SAEs have no measurable output effect at their top contexts, which
    `output_effects` now flags and the check counts apart), so this asserts what holds: the ranking by change in
    probability passes it more often than the old ranking by mean log-prob drop, which picks tail tokens (0 of 30
    on dec.2). And issue 38's own check where it is measurable: every sampled feature with a measurable effect
    raises a token with clean probability at least 0.05 where its removal moves it (`p_clean_where`)."""
    tm = load(CKPT)
    fd = FeatureData.load(tm, CKPT / "features" / site)
    live = (fd.stats.count > 0).nonzero().flatten()
    pick = live[torch.randperm(live.numel(), generator=torch.Generator().manual_seed(0))[:8]].tolist()
    new = old = 0
    for f in pick:
        e = fd.output_effects(f, contexts=8, heads=False, top=tm.model.cfg.tgt_vocab)
        new += e["tokens"][0]["p_clean"] >= 0.05
        old += max(e["tokens"] + e["lowers"], key=lambda t: t["drop"])["p_clean"] >= 0.05
        assert not e["measurable"] or e["tokens"][0]["p_clean_where"] >= 0.05, (site, f, e["tokens"][0])
    assert new > old, (site, new, old)


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


def test_the_raised_tokens_chart_draws_the_ranking_it_lists():
    """Bars are the probability each token gains (the dashboard's ranking), not the log-prob drop, which would put
    a tail token with a tiny probability above a likely one."""
    from workbench.charts.features import output_effect_note, output_tokens_figure

    effects = {"contexts": 8, "tokens": [
        {"token": "▁running", "id": 5, "dp": 0.30, "p_clean": 0.43, "drop": 0.9},
        {"token": "▁robe", "id": 6, "dp": 0.0004, "p_clean": 0.0005, "drop": 2.5}]}
    fig = output_tokens_figure(effects)
    (bars,) = fig.renderers
    assert list(bars.data_source.data["dp"]) == [0.30, 0.0004] and bars.glyph.right == "dp"
    assert "probability it adds" in fig.xaxis.axis_label
    # without a measurable effect: no bars, the title says why
    flat = effects | {"measurable": False, "effect": "no measurable output effect: removing it raises no token's "
                                                      "probability by 0.005 or more (largest 0.0004)"}
    fig = output_tokens_figure(flat)
    assert not fig.renderers and fig.title.text == "no measurable output effect (8 contexts)"  # titles do not wrap
    note = output_effect_note(flat)
    assert "no measurable output effect: removing it raises no token&#x27;s probability by 0.005" in note
    assert output_effect_note(effects) is None


def test_a_graph_feature_card_says_when_the_feature_has_no_measurable_output_effect():
    from workbench.charts.features import feature_node_html

    row = {"token": "▁running", "id": 5, "dp": 0.0004, "p_clean": 0.43, "drop": 0.001}
    details = {"site": "hook_memory", "feature": 7, "contexts": [],
               "output_effects": {"contexts": 8, "tokens": [row], "lowers": [], "measurable": True}}
    assert "raises <b> running</b> <small>(+0.0004)</small>" in feature_node_html(details, "?feature=7")
    details["output_effects"] |= {"measurable": False, "effect": "no measurable output effect: removing it raises "
                                                                 "no token's probability by 0.005 or more"}
    card = feature_node_html(details, "?feature=7")
    assert "no measurable output effect: removing it raises no token" in card and "running" not in card

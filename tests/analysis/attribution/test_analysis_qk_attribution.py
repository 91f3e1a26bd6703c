"""QK attribution of one cross-attention edge: the terms rebuild the model's own pre-softmax score, with components,
heads split by the key they read, and dictionary features (SAE on the memory and on an attention output, transcoder
on an FFN), on post-norm, pre-norm and pad-start (Marian-style) models."""

from __future__ import annotations

import pytest
import torch
from model_helpers import graph_model, make_model, one_sentence

from workbench import presets
from workbench.analysis.attribution.qk_attribution import (
    KEY_BIAS,
    QUERY_BIAS,
    qk_attribution,
    qk_attributions,
    qk_dictionaries,
)
from workbench.analysis.attribution.score_split import split_cross_scores
from workbench.features.dictionary import DictionaryConfig, SparseDictionary
from workbench.features.sites import resolve_site

TOL = {"atol": 1e-5, "rtol": 1e-5}


def _scores(model, src, tgt, layer):
    """The model's own hook_scores of decoder layer `layer`'s cross-attention, (H, T, S)."""
    name = model.dec[layer].cross_attn.hook_scores.name
    _, trace = model.run_with_cache(src, tgt, names=[name])
    return trace[name][0]


def _close(qk, score):
    torch.testing.assert_close(torch.tensor(qk.total, dtype=torch.float64), torch.tensor(float(score),
                               dtype=torch.float64), **TOL)


def _dictionary(model, spec, seed, k=6):
    """A random TopK dictionary at `spec` with a non-zero decoder bias (so the bias part is not trivially 0)."""
    site = resolve_site(model, spec)
    d = model.cfg.d_model
    cfg = DictionaryConfig(site.hook_in, d_in=d, d_sae=48, k=k, d_out=d if site.transcoder else None,
                           hook_name_out=site.hook_out)
    dic = SparseDictionary(cfg)
    g = torch.Generator().manual_seed(seed)
    dic.reset_parameters(g)
    with torch.no_grad():
        dic.b_dec.copy_(0.1 * torch.randn(d, generator=g))
        dic.b_enc.copy_(0.1 * torch.randn(48, generator=g))
    return dic


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("by_position", [False, True], ids=["components", "by-position"])
def test_terms_sum_to_the_models_score(norm_first, by_position):
    model = graph_model(norm_first)
    src, tgt = one_sentence(model.cfg, s=8, t=6)
    for layer in (0, 1):
        scores = _scores(model, src, tgt, layer)
        edges = [(layer, h, t, s) for h in (0, 3) for t in (0, 2, 5) for s in (0, 4, 7)]
        for qk, (_, h, t, s) in zip(qk_attributions(model, src, tgt, edges, by_position=by_position), edges):
            _close(qk, scores[h, t, s])
            assert qk.score == pytest.approx(float(scores[h, t, s]), abs=1e-5)
            assert qk.query_labels[-1] == QUERY_BIAS and qk.key_labels[-1] == KEY_BIAS
            assert "src_tok" in qk.key_labels and "tgt_tok" in qk.query_labels
            assert not any(lab.startswith(f"cross:{layer}:") for lab in qk.query_labels)  # the block itself
            if by_position:  # every encoder head split by the source piece it read, each key at most once
                parts = [lab for lab in qk.key_labels if lab.startswith("enc_self:1:2 <- ")]
                assert len(parts) == len(set(parts)) == src.size(1)
                assert all(i["from"] == s for lab, i in zip(qk.key_labels, qk.key_info) if lab == "src_tok")
                if layer == 1:  # decoder self-attention at t reads t + 1 prefix positions (causal)
                    assert sum(lab.startswith("dec_self:1:0 <- ") for lab in qk.query_labels) == t + 1


def test_the_components_agree_with_the_score_split():
    """Summed over the split of each head, the by-position terms are the per-component ones; and those are
    `split_cross_scores`'s terms of the same edge (a second code path)."""
    model = graph_model(False)
    src, tgt = one_sentence(model.cfg, s=7, t=5)
    split = split_cross_scores(model, src, tgt, 1)
    qk = qk_attribution(model, src, tgt, layer=1, head=2, t=3, s=4, by_position=False)
    assert qk.query_labels[:-1] == split.query_labels and qk.key_labels[:-1] == split.key_labels
    torch.testing.assert_close(qk.terms[:-1, :-1], split.terms[2, :, :, 3, 4], atol=1e-9, rtol=1e-9)
    assert qk.terms[-1].sum() == pytest.approx(float(split.query_bias[2, 3, 4]), abs=1e-9)
    fine = qk_attribution(model, src, tgt, layer=1, head=2, t=3, s=4)
    keys = dict(fine.key_totals())
    head_total = sum(v for lab, v in keys.items() if lab.startswith("enc_self:0:3 <- "))
    assert head_total == pytest.approx(dict(qk.key_totals())["enc_self:0:3"], abs=1e-6)


def test_top_and_frame_are_the_largest_terms_and_match_each_other():
    model = graph_model(True)
    src, tgt = one_sentence(model.cfg, s=6, t=4)
    qk = qk_attribution(model, src, tgt, layer=1, head=0, t=2, s=3)
    top = qk.top(5)
    frame = qk.frame()
    assert len(frame) == qk.terms.numel()
    assert [tuple(r) for r in frame[["query_side", "key_side", "value"]].head(5).itertuples(index=False)] == top
    values = frame["value"].abs().to_numpy()
    assert (values[:-1] >= values[1:]).all()
    assert abs(top[0][2]) == pytest.approx(float(qk.terms.abs().max()))
    assert frame["value"].sum() == pytest.approx(qk.total, abs=1e-12)
    assert len(qk.frame(k=7)) == 7


def test_dictionaries_replace_what_they_cover_and_the_sum_stays_exact():
    model = graph_model(False)
    src, tgt = one_sentence(model.cfg, s=7, t=5)
    dicts = [_dictionary(model, "hook_memory", 1), _dictionary(model, "dec.0.ffn", 2),
             _dictionary(model, model.dec[0].cross_attn.hook_out.name, 3),
             _dictionary(model, model.dec[1].cross_attn.hook_out.name, 4)]  # at the edge's own block: unused
    scores = _scores(model, src, tgt, 1)
    qk = qk_attribution(model, src, tgt, layer=1, head=1, t=4, s=2, dictionaries=dicts)
    _close(qk, scores[1, 4, 2])
    mem = [i for i in qk.key_info if i["kind"] == "feature"]
    assert 0 < len(mem) <= 6 and all(i["site"] == "hook_memory" and i["from"] == 2 for i in mem)
    assert {lab for lab in qk.key_labels if not lab.startswith("hook_memory f")} == {
        "hook_memory b_dec", "hook_memory error", KEY_BIAS}
    kinds = {(i.get("site"), i["kind"]) for i in qk.query_info}
    assert {("dec.0.ffn", "feature"), ("dec.0.ffn", "dict_error"), ("dec.0.ffn", "dict_bias")} <= kinds
    cross0 = model.dec[0].cross_attn.hook_out.name
    assert (cross0, "feature") in kinds and (cross0, "dict_error") in kinds
    assert "dec.0.ffn" not in qk.query_labels and not any(lab.startswith("cross:0:") for lab in qk.query_labels)
    assert "dec_self:0:1 <- 0" in qk.query_labels  # blocks without a dictionary keep their parts
    assert qk.meta["unused"] == [model.dec[1].cross_attn.hook_out.name]
    # the features of one query site sum, with its bias and error, to what the plain analysis calls that block
    plain = qk_attribution(model, src, tgt, layer=1, head=1, t=4, s=2, dictionaries=dicts[:1])
    ffn = sum(v for lab, v in qk.query_totals() if lab.startswith("dec.0.ffn "))
    assert ffn == pytest.approx(dict(plain.query_totals())["dec.0.ffn"], abs=1e-6)
    a = qk.frame()
    assert a.loc[a["key_feature"].notna(), "key_kind"].eq("feature").all()


def test_an_encoder_transcoder_and_a_pre_norm_model():
    model = graph_model(True)
    src, tgt = one_sentence(model.cfg, s=7, t=5)
    dicts = [_dictionary(model, "enc.1.ffn", 5), _dictionary(model, model.dec[0].self_attn.hook_out.name, 6)]
    scores = _scores(model, src, tgt, 1)
    for t, s in ((0, 0), (4, 6), (2, 3)):
        qk = qk_attribution(model, src, tgt, layer=1, head=3, t=t, s=s, dictionaries=dicts)
        _close(qk, scores[3, t, s])
        assert any(lab.startswith("enc.1.ffn f") for lab in qk.key_labels) and "enc.1.ffn" not in qk.key_labels
        assert not any(lab.startswith("dec_self:0:") for lab in qk.query_labels)


def test_a_pad_start_decoder_keeps_position_zero():
    """Marian: the decoder starts with the pad id (0). Position 0 is a real query; its score is explained too."""
    model = make_model(presets.tiny(vocab=40, decoder_start_id=0), seed=3)
    assert model.cfg.pad_id == model.cfg.start_id == 0
    src, tgt = torch.tensor([[5, 6, 7, 8, 2]]), torch.tensor([[0, 9, 10, 11]])
    scores = _scores(model, src, tgt, 0)
    for t in range(4):
        qk = qk_attribution(model, src, tgt, layer=0, head=1, t=t, s=2)
        _close(qk, scores[1, t, 2])
        assert qk.probability > 0
    q0 = qk_attribution(model, src[0], tgt[0], layer=0, head=1, t=0, s=2)  # (L,) tensors as well
    assert "dec_self:0:1 <- 0" in q0.query_labels and q0.t == 0


def test_bad_edges_are_refused_with_the_reason():
    model = graph_model(False)
    src, tgt = one_sentence(model.cfg, s=5, t=4)
    with pytest.raises(ValueError, match="layer 2 out of range"):
        qk_attribution(model, src, tgt, layer=2, head=0, t=0, s=0)
    with pytest.raises(ValueError, match="head 4 out of range"):
        qk_attribution(model, src, tgt, layer=0, head=4, t=0, s=0)
    with pytest.raises(ValueError, match="t=4 out of range"):
        qk_attribution(model, src, tgt, layer=0, head=0, t=4, s=0)
    padded = torch.cat([src, torch.tensor([[model.cfg.pad_id]])], 1)
    with pytest.raises(ValueError, match="padding"):
        qk_attribution(model, padded, tgt, layer=0, head=0, t=0, s=5)
    resid = SparseDictionary(DictionaryConfig(model.dec[0].hook_resid_ffn.name, 32, 16, k=2))
    with pytest.raises(ValueError, match="does not write one part"):
        qk_attribution(model, src, tgt, layer=1, head=0, t=0, s=0, dictionaries=[resid])


def test_qk_dictionaries_keeps_what_it_can_expand_once_per_site():
    model = graph_model(False)
    mem, mem2 = _dictionary(model, "hook_memory", 1), _dictionary(model, "hook_memory", 2)
    ffn = _dictionary(model, "dec.0.ffn", 3)
    resid = SparseDictionary(DictionaryConfig(model.dec[0].hook_resid_ffn.name, 32, 16, k=2))
    kept = qk_dictionaries(model, [resid, mem, ffn, mem2])
    assert len(kept) == 2 and kept[0] is mem and kept[1] is ffn


def test_the_contrast_picks_the_part_that_lifts_the_piece_above_the_others():
    """By hand: three pieces of one row; "a" is large everywhere (cancels), "b" is large at piece 1 only, "c" exists
    at the other pieces only and is negative there (its absence at 1 lifts 1 by less than b does)."""
    from workbench.analysis.attribution.qk_attribution import QKAttribution, _contrast_top

    def qk(s, parts):
        labels = list(parts)
        info = [{"kind": "ffn", "from": s, "label": lab} for lab in labels]
        terms = torch.tensor([list(parts.values())], dtype=torch.float64)  # one query part
        return QKAttribution(0, 0, 0, s, ["q"], [{"kind": "embed"}], labels, info, terms, 0.0, 0.0)

    row = [qk(0, {"a": 5.0, "b": 0.1, "c": -1.0}), qk(1, {"a": 5.0, "b": 3.0}), qk(2, {"a": 5.2, "b": 0.2, "c": -1.5})]
    label, info = _contrast_top(row, 1)
    assert label == "b" and info["from"] == 1  # gain 3 - 0.15 = 2.85 against a's -0.1 and c's +1.25
    label, info = _contrast_top(row, 2)
    assert label == "a" and info["from"] == 2  # a: 5.2 - 5.0 = 0.2; b: 0.2 - 1.55 < 0; c: -1.5 + 0.5 = -1.0


@pytest.mark.parametrize("changes", [
    {"emb_norm": True}, {"bias": False}, {"positions": "learned", "norm_first": True},
    {"enc_heads": 2, "dec_heads": 8, "enc_final_norm": True}, {"positions": "none", "dec_final_norm": True},
], ids=["emb-norm", "no-bias", "learned-positions", "per-stack-heads", "no-positions"])
def test_exact_across_architecture_switches(changes):
    model = make_model(presets.tiny(vocab=40, **changes), seed=4)
    src, tgt = one_sentence(model.cfg, s=6, t=5)
    for layer in (0, 1):
        scores = _scores(model, src, tgt, layer)
        heads = model.dec[layer].cross_attn.n_heads
        edges = [(layer, h, t, s) for h in (0, heads - 1) for t, s in ((0, 0), (4, 3), (2, 5))]
        for qk, (_, h, t, s) in zip(qk_attributions(model, src, tgt, edges), edges):
            _close(qk, scores[h, t, s])
            n_enc = model.enc[0].self_attn.n_heads
            assert sum(lab.startswith("enc_self:0:") and lab.endswith(" <- 0") for lab in qk.key_labels) == n_enc


def _self_scores(model, src, tgt, kind, layer):
    block = (model.enc if kind == "enc_self" else model.dec)[layer].self_attn
    _, trace = model.run_with_cache(src, tgt, names=[block.hook_scores.name])
    return trace[block.hook_scores.name][0]


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_self_attention_edges_are_exact_too(norm_first):
    """The same split for encoder and decoder self-attention: queries and keys read the same stream."""
    model = graph_model(norm_first)
    src, tgt = one_sentence(model.cfg, s=7, t=6)
    for kind, pairs in (("enc_self", ((0, 0), (3, 6), (6, 2))), ("dec_self", ((0, 0), (5, 2), (3, 3)))):
        for layer in (0, 1):
            scores = _self_scores(model, src, tgt, kind, layer)
            edges = [(layer, h, t, s) for h in (1, 2) for t, s in pairs]
            for qk, (_, h, t, s) in zip(qk_attributions(model, src, tgt, edges, kind=kind), edges):
                _close(qk, scores[h, t, s])
                side = "src" if kind == "enc_self" else "tgt"
                assert f"{side}_tok" in qk.query_labels and f"{side}_tok" in qk.key_labels
                assert qk.meta["kind"] == kind
                assert not any(lab.startswith(f"{kind}:{layer}:") for lab in qk.query_labels + qk.key_labels)
                if kind == "dec_self" and layer == 1:  # an earlier cross head, split by the source piece it read
                    assert sum(lab.startswith("cross:0:3 <- ") for lab in qk.key_labels) == src.size(1)
    with pytest.raises(ValueError, match="causal"):
        qk_attribution(model, src, tgt, layer=0, head=0, t=2, s=3, kind="dec_self")
    with pytest.raises(ValueError, match="kind must be one of"):
        qk_attribution(model, src, tgt, layer=0, head=0, t=2, s=3, kind="self")


def test_self_attention_with_dictionaries_and_a_pad_start_decoder():
    model = graph_model(False)
    src, tgt = one_sentence(model.cfg, s=7, t=5)
    dicts = [_dictionary(model, "enc.0.ffn", 7), _dictionary(model, model.dec[0].cross_attn.hook_out.name, 8),
             _dictionary(model, "hook_memory", 9)]
    scores = _self_scores(model, src, tgt, "enc_self", 1)
    qk = qk_attribution(model, src, tgt, layer=1, head=0, t=4, s=1, kind="enc_self", dictionaries=dicts)
    _close(qk, scores[0, 4, 1])
    assert any(lab.startswith("enc.0.ffn f") for lab in qk.query_labels + qk.key_labels)
    assert sorted(qk.meta["unused"]) == sorted([model.dec[0].cross_attn.hook_out.name, "hook_memory"])
    scores = _self_scores(model, src, tgt, "dec_self", 1)
    qk = qk_attribution(model, src, tgt, layer=1, head=3, t=4, s=2, kind="dec_self", dictionaries=dicts)
    _close(qk, scores[3, 4, 2])
    assert any(i.get("site") == model.dec[0].cross_attn.hook_out.name for i in qk.key_info)
    marian = make_model(presets.tiny(vocab=40, decoder_start_id=0), seed=3)
    src, tgt = torch.tensor([[5, 6, 7, 8, 2]]), torch.tensor([[0, 9, 10, 11]])
    scores = _self_scores(marian, src, tgt, "dec_self", 0)
    for t in range(4):  # key 0 holds the pad id and is a real position
        _close(qk_attribution(marian, src, tgt, layer=0, head=1, t=t, s=0, kind="dec_self"), scores[1, t, 0])


def test_own_word_check_counts_gold_linked_and_off_gold_argmax_edges_apart():
    from workbench.analysis.attribution.qk_attribution import GROUPS, OFF_GOLD, own_word_check

    model = graph_model(False)
    src, tgt = one_sentence(model.cfg, s=6, t=5)
    plain = own_word_check(model, [(src[0].tolist(), tgt[0].tolist())], layer=1, head=0, contrast=False)
    assert OFF_GOLD not in plain.edges and plain.edges[GROUPS[0]] == plain.edges[GROUPS[1]] > 0
    everything = {(t, s) for t in range(5) for s in range(6)}
    linked = own_word_check(model, [(src[0].tolist(), tgt[0].tolist(), everything)], layer=1, head=0, contrast=False)
    assert linked.counts == plain.counts and linked.edges == plain.edges
    none = own_word_check(model, [(src[0].tolist(), tgt[0].tolist(), set())], layer=1, head=0, contrast=False)
    assert none.edges[GROUPS[0]] == 0 and none.edges[OFF_GOLD] == plain.edges[GROUPS[0]]
    assert none.counts["top pair"][OFF_GOLD] == plain.counts["top pair"][GROUPS[0]]
    assert none.counts["top pair"][GROUPS[1]] == plain.counts["top pair"][GROUPS[1]]  # the controls are the same

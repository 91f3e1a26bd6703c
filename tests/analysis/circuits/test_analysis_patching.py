"""Patching sweeps: identities that must hold exactly, batched == one at a time, single sites == direct hooks."""

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.analysis.circuits.patching import (
    attribution_patching,
    build_sites,
    log_prob,
    logit_diff,
    patching_sweep,
    path_patching,
)
from workbench.core.interventions import patch


@pytest.fixture(params=["post", "pre"])
def model(request):
    return make_model(presets.tiny(vocab=50, norm_first=request.param == "pre"), seed=4)


def pair(cfg):
    src, tgt = make_batch(cfg, batch=2, pad=False, seed=5)
    return src[:1], tgt[:1], src[1:], tgt[1:]


def test_clean_equals_corrupted_changes_nothing(model):
    src, tgt, _, _ = pair(model.cfg)
    metric = logit_diff(3, 7, 9)
    for sites in ("head", "resid_enc", "cross_kv", "pattern"):
        res = patching_sweep(model, src, tgt, corrupted_src=src.clone(), sites=sites, metric=metric)
        real = res.values[~res.values.isnan()]
        torch.testing.assert_close(real, torch.full_like(real, res.clean_metric), atol=1e-5, rtol=0)
        atp = attribution_patching(model, src, tgt, corrupted_src=src.clone(), sites=sites, metric=metric)
        torch.testing.assert_close(atp.values.nan_to_num(), res.values.nan_to_num(), atol=1e-5, rtol=0)


def test_full_denoising_restores_the_clean_metric_exactly(model):
    src, tgt, c_src, c_tgt = pair(model.cfg)
    metric = log_prob(torch.arange(10, 10 + tgt.size(1)))
    res = patching_sweep(model, src, tgt, corrupted_src=c_src, corrupted_tgt=c_tgt, sites="resid_dec",
                         metric=metric, direction="denoising", positions="all")
    assert res.values[-1, 0].item() == pytest.approx(res.clean_metric, abs=1e-4)
    assert abs(res.clean_metric - res.corrupted_metric) > 0.1  # the corruption did something
    enc = patching_sweep(model, src, tgt, corrupted_src=c_src, sites="resid_enc", metric=metric,
                         direction="denoising", positions="all")
    assert enc.values[-1, 0].item() == pytest.approx(enc.clean_metric, abs=1e-4)
    noised = patching_sweep(model, src, tgt, corrupted_src=c_src, sites="resid_enc", metric=metric, positions="all")
    assert noised.values[-1, 0].item() == pytest.approx(noised.corrupted_metric, abs=1e-4)


@pytest.mark.parametrize("sites", ["head", "resid_dec", "cross_kv", "pattern"])
def test_batched_sweep_equals_one_site_at_a_time(model, sites):
    src, tgt, c_src, c_tgt = pair(model.cfg)
    kw = dict(corrupted_src=c_src, corrupted_tgt=c_tgt, sites=sites, metric=logit_diff(4, 11, 12))
    batched = patching_sweep(model, src, tgt, batch_size=64, **kw)
    single = patching_sweep(model, src, tgt, batch_size=1, **kw)
    torch.testing.assert_close(batched.values, single.values, atol=2e-5, rtol=0, equal_nan=True)
    n_sites = int((~single.values.isnan()).sum())
    assert single.forward_passes == 2 + n_sites
    assert batched.forward_passes == 2 + -(-n_sites // 64)


def test_a_site_equals_the_direct_intervention(model):
    src, tgt, c_src, c_tgt = pair(model.cfg)
    metric = logit_diff(5, 3, 20)
    res = patching_sweep(model, src, tgt, corrupted_src=c_src, corrupted_tgt=c_tgt, sites="head", metric=metric)
    _, donor = model.run_with_cache(c_src, c_tgt, names="dec.1.cross_attn.hook_result")
    with model.hooks({"dec.1.cross_attn.hook_result": patch(donor["dec.1.cross_attn.hook_result"], positions=[2],
                                                            heads=[3])}):
        want = metric(model(src, tgt)).item()
    assert res.values[res.rows.index("cross:1:3"), 2].item() == pytest.approx(want, abs=1e-5)
    assert res.rows[:4] == ["enc_self:0:0", "enc_self:0:1", "enc_self:0:2", "enc_self:0:3"]
    assert res.values.shape == (3 * 2 * 4, max(src.size(1), tgt.size(1)))


def test_ablations(model):
    src, tgt, _, _ = pair(model.cfg)
    metric = logit_diff(2, 5)
    zero = patching_sweep(model, src, tgt, ablation="zero", sites="head_cross", metric=metric)
    with model.hooks({"dec.0.cross_attn.hook_result": lambda x, h: _zero_at(x, 1, 4)}):
        want = metric(model(src, tgt)).item()
    assert zero.values[1, 4].item() == pytest.approx(want, abs=1e-5)
    ref = make_batch(model.cfg, batch=6, seed=9)
    mean = patching_sweep(model, src, tgt, ablation="mean", reference=ref, sites="resid_enc", metric=metric)
    _, tr = model.run_with_cache(*ref, names="enc.0.hook_resid_ffn")
    real = (ref[0] != model.cfg.pad_id)
    avg = tr["enc.0.hook_resid_ffn"][real].mean(0)
    with model.hooks({"enc.0.hook_resid_ffn": lambda x, h: _put(x, 3, avg)}):
        want = metric(model(src, tgt)).item()
    assert mean.values[1, 3].item() == pytest.approx(want, abs=1e-5)
    a = patching_sweep(model, src, tgt, ablation="resample", reference=ref, sites="head", metric=metric, seed=1)
    b = patching_sweep(model, src, tgt, ablation="resample", reference=ref, sites="head", metric=metric, seed=1)
    torch.testing.assert_close(a.values, b.values, equal_nan=True)


def _zero_at(x, head, pos):
    x = x.clone()
    x[:, head, pos] = 0
    return x


def _put(x, pos, v):
    x = x.clone()
    x[:, pos] = v
    return x


def test_attribution_patching_is_exact_where_the_metric_is_linear():
    """Post-norm without a final norm: the last decoder layer's output feeds the output layer directly."""
    model = make_model(presets.tiny(vocab=50), seed=4)
    src, tgt, c_src, c_tgt = pair(model.cfg)
    kw = dict(corrupted_src=c_src, corrupted_tgt=c_tgt, sites="resid_dec", metric=logit_diff(3, 7, 9))
    real = patching_sweep(model, src, tgt, **kw)
    est = attribution_patching(model, src, tgt, **kw)
    torch.testing.assert_close(est.values[-1], real.values[-1], atol=1e-4, rtol=0)
    assert est.clean_metric == pytest.approx(real.clean_metric, abs=1e-5)
    assert est.corrupted_metric == pytest.approx(real.corrupted_metric, abs=1e-5)


def test_path_patching_through_cross_attention_keys_and_values(model):
    src, tgt, c_src, _ = pair(model.cfg)
    metric = logit_diff(3, 7, 9)
    same = path_patching(model, src, tgt, corrupted_src=src.clone(), metric=metric)
    torch.testing.assert_close(same.values, torch.full_like(same.values, same.clean_metric), atol=1e-5, rtol=0)
    res = path_patching(model, src, tgt, corrupted_src=c_src, metric=metric, batch_size=5)
    assert res.values.shape == (2 * (4 + 1), 2) and res.forward_passes == 2 + 2 + 4
    # the last encoder FFN has no encoder component after it: freezing is a no-op, so its path effect on
    # layer i is patching its output, recomputing memory, and keeping only layer i's cross keys/values
    _, corr = model.run_with_cache(c_src, tgt, names="enc.1.ffn.hook_out")
    kv = [f"dec.{i}.cross_attn.hook_{x}" for i in range(2) for x in "kv"]
    with model.hooks({"enc.1.ffn.hook_out": patch(corr["enc.1.ffn.hook_out"])}):
        _, moved = model.run_with_cache(src, tgt, names=kv)
    for layer in range(2):
        names = [f"dec.{layer}.cross_attn.hook_k", f"dec.{layer}.cross_attn.hook_v"]
        with model.hooks({n: patch(moved[n]) for n in names}):
            want = metric(model(src, tgt)).item()
        assert res.values[res.rows.index("enc.1.ffn"), layer].item() == pytest.approx(want, abs=1e-5)


def test_translation_metric_on_encoder_sites(model):
    src, tgt, _, _ = pair(model.cfg)
    detok = " ".join
    res = patching_sweep(model, src, tgt, corrupted_src=src.clone(), sites="cross_kv", metric="chrf",
                         detokenize=lambda ids: detok(map(str, ids)), reference_text="1 2 3", max_len=6)
    assert torch.all(res.values == res.clean_metric)


def test_refuses_what_it_cannot_handle(model):
    src, tgt, c_src, _ = pair(model.cfg)
    m = logit_diff(0, 1)
    with pytest.raises(ValueError, match="sites must be one of"):
        patching_sweep(model, src, tgt, corrupted_src=c_src, sites="heads", metric=m)
    with pytest.raises(ValueError, match="must match the clean lengths"):
        patching_sweep(model, src, tgt, corrupted_src=c_src[:, :-1], metric=m)
    with pytest.raises(ValueError, match="give corrupted_src and/or corrupted_tgt, or an ablation"):
        patching_sweep(model, src, tgt, metric=m)
    with pytest.raises(ValueError, match="needs reference="):
        patching_sweep(model, src, tgt, ablation="mean", metric=m)
    with pytest.raises(ValueError, match="encoder-side sites"):
        patching_sweep(model, src, tgt, corrupted_src=c_src, sites="head", metric="bleu", detokenize=str,
                       reference_text="x")
    with pytest.raises(ValueError, match="direction must be one of"):
        patching_sweep(model, src, tgt, corrupted_src=c_src, metric=m, direction="both")
    with pytest.raises(ValueError, match="one sentence"):
        patching_sweep(model, torch.cat([src, src]), tgt, corrupted_src=c_src, metric=m)
    with pytest.raises(ValueError, match="positions must be 'each' or 'all'"):
        build_sites(model, "head", 3, 3, positions="some")


def test_progress_is_reported_after_each_batch(model):
    src, tgt, c_src, _ = pair(model.cfg)
    seen = []
    res = patching_sweep(model, src, tgt, corrupted_src=c_src, sites="head", metric=logit_diff(4, 11, 12),
                         batch_size=3, progress=lambda done, total: seen.append((done, total)))
    n_sites = int((~res.values.isnan()).sum())
    assert seen == [(min(k, n_sites), n_sites) for k in range(3, n_sites + 3, 3)]
    assert res.forward_passes == 2 + len(seen)


@pytest.mark.parametrize("sites", ["resid_enc", "resid_dec", "head", "pattern", "cross_kv"])
def test_attribution_patching_equals_gradient_times_difference_site_by_site(model, sites):
    """The estimate's per-hook gathering against a plain loop over the sites: metric + Σ grad·(donor − base)."""
    from workbench.analysis.attribution.gradients import run_with_grads

    src, tgt, c_src, c_tgt = pair(model.cfg)
    metric = logit_diff(3, 7, 9)
    est = attribution_patching(model, src, tgt, corrupted_src=c_src, corrupted_tgt=c_tgt, sites=sites, metric=metric)
    rows, cols, site_list = build_sites(model, sites, src.size(1), tgt.size(1), "each")
    names = sorted({n for s in site_list for n, _ in s.edits})
    value, acts, grads = run_with_grads(model, src, tgt, lambda logits: metric(logits)[0], names)
    with torch.no_grad():
        _, donor = model.run_with_cache(c_src, c_tgt, names=names)
    expected = torch.full((len(rows), len(cols)), float("nan"), dtype=torch.float64)
    for site in site_list:
        expected[site.row, site.col] = float(value) + sum(
            float((grads[n][0][idx].double() * (donor[n][0][idx] - acts[n][0][idx]).double()).sum())
            for n, idx in site.edits)
    torch.testing.assert_close(est.values, expected, atol=1e-6, rtol=1e-6, equal_nan=True)

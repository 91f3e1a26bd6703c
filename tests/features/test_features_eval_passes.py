"""`features eval`'s spliced passes reuse the batch's clean encoder output (a decoder-side site cannot change it;
`hook_memory`'s hooks are applied to it) and project only the real target positions: its CE and KL figures, the
dictionary's, the ablations' and the baselines', equal those of whole teacher-forced forward passes with the same
hooks, on an encoder-side site, `hook_memory`, a decoder block's output and a transcoder; its FVU and L0, read
from the spliced pass's own reconstruction, equal each dictionary's on the site's captured rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workbench.corpus.data import ParallelData, load_dataset
from workbench.decoding.translator import load
from workbench.features import DictionaryConfig, SparseDictionary
from workbench.features.evaluate import _Clock, _density_data, _density_pass, _fit_baselines, evaluate_dictionary
from workbench.features.sites import ablation_hooks, site_of, site_rows, splice_hooks

CKPT = Path(__file__).resolve().parents[2] / "checkpoints" / "multi30k-de-en"
LIMIT, DENSITY = 10, 2000


def _dictionary(hook: str, hook_out: str | None = None) -> SparseDictionary:
    torch.manual_seed(0)
    return SparseDictionary(DictionaryConfig(hook, 128, 256, k=8, d_out=128 if hook_out else None,
                                             hook_name_out=hook_out, skip=bool(hook_out))).eval()


def _data(tm) -> ParallelData:
    src, tgt = load_dataset("multi30k", "valid", "de", "en", limit=LIMIT)
    return ParallelData.encode(src, tgt, tm.src_tokenizer, tm.tgt_tokenizer, max_len=tm.model.cfg.max_positions - 1)


def _fvu_l0(tm, site, hidden: tuple, dictionaries: dict) -> dict[str, tuple[float, float]]:
    """FVU and L0 of each dictionary on the site's rows, each row encoded and decoded on its own terms."""
    data, got = _data(tm), {}
    rows = [site_rows(tm.model, data.collate(idx, tm.model.cfg), site, extra=hidden)
            for idx in data.batches(4096, shuffle=False)]
    x = torch.cat([r[0] for r in rows])
    target = x if rows[0][1] is None else torch.cat([r[1] for r in rows])
    with torch.no_grad():
        for name, d in dictionaries.items():
            codes = d.encode(x)
            recon = d(x)
            err = (target - recon).double().pow(2).sum()
            got[name] = (float(err / (target.double() - target.double().mean(0)).pow(2).sum()),
                         float((codes != 0).sum(1).double().mean()))
    return got


def _whole_passes(tm, variants: dict[str, list]) -> dict[str, tuple[float, float]]:
    """CE and KL to the clean model of each variant (its hooks), from whole forward passes over every position."""
    model, data = tm.model, _data(tm)
    nll = dict.fromkeys(variants, 0.0)
    kl = dict.fromkeys(variants, 0.0)
    n = 0
    with torch.no_grad():
        for idx in data.batches(4096, shuffle=False):
            batch = data.collate(idx, model.cfg)
            mask = batch.tgt_out != model.cfg.pad_id
            clean = model(batch.src, batch.tgt_in)[mask].float().log_softmax(-1)
            target = batch.tgt_out[mask]
            n += target.numel()
            for name, hooks in variants.items():
                with model.hooks(hooks):
                    logp = model(batch.src, batch.tgt_in)[mask].float().log_softmax(-1)
                nll[name] += float(-logp.gather(1, target[:, None]).sum())
                kl[name] += float((clean.exp() * (clean - logp)).sum())
    return {name: (nll[name] / n, kl[name] / n) for name in variants}


@pytest.mark.slow
@pytest.mark.parametrize("hook, hook_out", [("hook_memory", None), ("enc.2.hook_resid_self_attn", None),
                                            ("dec.2.cross_attn.hook_out", None),
                                            ("dec.1.ffn.hook_in", "dec.1.ffn.hook_out")])
def test_spliced_figures_equal_whole_forward_passes(hook, hook_out):
    tm = load(CKPT)
    d = _dictionary(hook, hook_out)
    r = evaluate_dictionary(tm, d, bleu_split=None, limit=LIMIT, density_tokens=DENSITY)
    site = site_of(d)
    # the mean ablation's value and the baselines come from the density pass: rebuild them as the evaluation does
    model = tm.model.eval()
    hidden = (f"{site.name}.hook_hidden",) if site.transcoder else ()
    dens_data, _ = _density_data(tm, "multi30k", "train", DENSITY, site.side, None)
    dens = _density_pass(model, d, site, dens_data, 4096, hidden, model.cfg.ffn_dim("dec") if hidden else 0, True,
                         _Clock())
    fits = _fit_baselines(dens, d, site, 0, model.device, _Clock())
    want = _whole_passes(tm, {"spliced": splice_hooks(site, d), "zero": ablation_hooks(site, None),
                              "mean": ablation_hooks(site, dens.mean(model.device)),
                              **{name: splice_hooks(site, b) for name, b in fits.items()}})
    assert r["ce_spliced"] == pytest.approx(want["spliced"][0], abs=1e-5)
    assert r["kl"] == pytest.approx(want["spliced"][1], abs=1e-5)
    assert r["ce_zero_ablated"] == pytest.approx(want["zero"][0], abs=1e-5)
    assert r["ce_mean_ablated"] == pytest.approx(want["mean"][0], abs=1e-5)
    for name in fits:
        b = r["baselines"][name]
        assert b["ce_spliced"] == pytest.approx(want[name][0], abs=1e-5), name
        assert b["kl"] == pytest.approx(want[name][1], abs=1e-5), name
    fvu_l0 = _fvu_l0(tm, site, hidden, {"dictionary": d, **fits})
    assert (r["fvu"], r["l0"]) == pytest.approx(fvu_l0["dictionary"], rel=1e-5)
    for name in fits:
        assert (r["baselines"][name]["fvu"], r["baselines"][name]["l0"]) == pytest.approx(fvu_l0[name], rel=1e-5)
    assert r["delta_ce"] > 1e-4 and r["ce_zero_ablated"] > r["ce_clean"]  # the splice changes something to compare


def test_the_in_place_kl_and_log_softmax_are_bit_for_bit_the_plain_ones():
    """`_Splice.add` sums the KL in the variant's own log-probabilities (no (N, V) temporaries) and `_logp` takes
    the log-softmax in the logits' own memory: the same floats as Σ p (log p − log q) and `log_softmax`."""
    from workbench.features.evaluate import _Clean, _Splice

    g = torch.Generator().manual_seed(0)
    z = torch.randn(300, 1000, generator=g) * 3
    clean = _Clean.of(z.log_softmax(-1))
    q = (z + torch.randn(300, 1000, generator=g) * 0.3)
    logits = q.clone()
    assert torch.equal(torch.log_softmax(logits, -1, out=logits), q.log_softmax(-1))
    logq = q.log_softmax(-1)
    target = torch.randint(0, 1000, (300,), generator=g)
    splice = _Splice()
    splice.add(logq.clone(), target, clean)
    assert splice.kl == float((clean.p * (clean.logp - logq)).sum()) > 0
    assert splice.nll == float(-logq.gather(1, target[:, None]).sum())

"""The replacement model with dictionaries spliced in: with nothing frozen it is still the model, and zeroing the
splice's error gives the dictionaries' reconstruction; its clean features are the real spliced model's; with the
features frozen it reproduces the clean run and is the dictionaries' linearisation around it (active set held,
error constant)."""

from __future__ import annotations

import pytest
import torch
from dictionary_helpers import tiny_dictionaries
from model_helpers import graph_model, one_sentence

from workbench.core.replacement import FEATURES, FREEZABLE, ReplacementModel
from workbench.features.sites import splice


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def model(request):
    return graph_model(norm_first=request.param)


def test_with_splices_and_nothing_frozen_it_is_the_model(model):
    src, tgt = one_sentence(model.cfg)
    dicts = tiny_dictionaries(model)
    rm = ReplacementModel(model, src, tgt, freeze=(), splices=dicts)
    plain = model(src, tgt)
    torch.testing.assert_close(rm(), plain, rtol=0, atol=1e-6)
    torch.testing.assert_close(rm.logits, plain, rtol=0, atol=1e-6)
    for site in dicts:  # the clean features and error are what the real spliced model's hook points hold
        sf = rm.features[site]
        with splice(model, dicts[site]) as sae, model.capture([sae.hook_acts.name, sae.hook_error.name]) as seen:
            model(src, tgt)
        assert sf.acts_name == sae.hook_acts.name
        torch.testing.assert_close(rm.clean[sf.acts_name], seen[sae.hook_acts.name][0], rtol=0, atol=1e-6)
        torch.testing.assert_close(rm.clean[sf.error_name], seen[sae.hook_error.name][0], rtol=0, atol=1e-6)
        assert int(sf.active[0].sum(-1).max()) <= 4 and bool(sf.active.any())


def test_zeroing_the_error_gives_the_reconstruction(model):
    src, tgt = one_sentence(model.cfg)
    dicts = tiny_dictionaries(model)
    site = model.dec[1].cross_attn.hook_out.name
    rm = ReplacementModel(model, src, tgt, freeze=(), splices={site: dicts[site]})
    sf = rm.features[site]
    zero = [(sf.error_name, lambda e, hook: torch.zeros_like(e))]
    with model.capture([site]) as seen:  # the block's own output, before the splice rewrites it
        rm(extra=zero)
    with torch.no_grad(), model.hooks({site: lambda y, hook: dicts[site](y)}):  # the reconstruction by hand
        by_hand = model(src, tgt)
    torch.testing.assert_close(rm(extra=zero), by_hand, rtol=0, atol=1e-5)
    assert (rm(extra=zero) - rm()).abs().max() > 1e-3  # the error is not nothing
    assert seen[site][0].shape == (1, tgt.size(1), model.cfg.d_model)


def test_frozen_features_reproduce_the_clean_run_and_are_the_dictionarys_linearisation(model):
    src, tgt = one_sentence(model.cfg)
    dicts = tiny_dictionaries(model)
    rm = ReplacementModel(model, src, tgt, freeze=(*FREEZABLE, FEATURES), dtype=torch.float64, splices=dicts)
    torch.testing.assert_close(rm(), rm.logits, rtol=0, atol=1e-10)
    for site, d in dicts.items():  # the frozen site's output as a function of its input, near the clean point
        sf = rm.features[site]
        x = rm.clean[sf.hook_in]
        delta = 1e-3 * torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        got = {}

        def push(v, hook, delta=delta):
            return v + delta

        def keep(v, hook, got=got):
            got["y"] = v

        with torch.no_grad(), rm.model.hooks([(sf.hook_in, push)]):  # an outer context's hook runs first
            rm(extra=[(sf.hook_out, keep)])
        W_enc, W_dec = d.W_enc.double(), d.W_dec.double()
        lin = ((delta @ W_enc) * sf.active) @ W_dec  # only the clean active set moves, linearly
        if d.cfg.skip:
            lin = lin + delta @ d.W_skip.double().T
        torch.testing.assert_close(got["y"], rm.clean[sf.hook_out] + lin, rtol=0, atol=1e-10)


def test_freezing_features_needs_dictionaries(model):
    src, tgt = one_sentence(model.cfg)
    with pytest.raises(ValueError, match="needs dictionaries"):
        ReplacementModel(model, src, tgt, freeze=(*FREEZABLE, FEATURES))


def test_a_model_with_a_dictionary_spliced_in_gets_a_float64_twin_without_it(model):
    src, tgt = one_sentence(model.cfg)
    dicts = tiny_dictionaries(model)
    site = model.hook_memory.name
    spliced = splice(model, dicts[site])  # kept, as the app keeps a dictionary the user picked
    try:
        rm = ReplacementModel(model, src, tgt, freeze=(*FREEZABLE, FEATURES), dtype=torch.float64, splices=dicts)
        assert rm.model is not model and rm.model.hook_memory._modules.get("sae") is None
        torch.testing.assert_close(rm(), rm.logits, rtol=0, atol=1e-10)
        assert model.hook_memory.sae.users == 1  # the caller's splice is untouched
    finally:
        spliced.remove()

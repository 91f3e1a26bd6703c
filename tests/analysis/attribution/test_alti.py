"""ALTI+: the linearised blocks rebuild the real activations, contributions are conserved through the rollout."""

from __future__ import annotations

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.analysis.attribution.alti import alti, alti_hooks, block_terms


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_block_terms_rebuild_each_block_and_shares_sum_to_one(norm_first):
    model = make_model(presets.tiny(vocab=40, norm_first=norm_first))
    src, tgt = make_batch(model.cfg, batch=2, src_len=6, tgt_len=5, pad=False)
    _, trace = model.run_with_cache(src, tgt, names=alti_hooks(model))
    for kind, n in (("enc_self", 2), ("dec_self", 2), ("cross", 2)):
        for layer in range(n):
            t = block_terms(model, trace, kind, layer, dtype=torch.float64)
            rebuilt = t.per_key().sum(2) + t.residual + t.bias
            torch.testing.assert_close(t.per_head().sum((1, 3)), t.per_key().sum(2), atol=1e-10, rtol=0)
            torch.testing.assert_close(rebuilt, t.output, atol=1e-4, rtol=0)
    a = alti(model, src, tgt, trace=trace)
    rows = a.source.sum(-1) + a.target.sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-5, rtol=0)
    torch.testing.assert_close(a.cross.sum(-1), torch.ones(2, 2, 5), atol=1e-5, rtol=0)
    assert (a.source >= 0).all() and (a.target >= 0).all()
    assert torch.all(a.target.triu(1) == 0)  # no position draws on a later target token
    assert 0 < float(a.source_share.mean()) < 1

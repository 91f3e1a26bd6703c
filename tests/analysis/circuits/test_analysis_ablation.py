"""One sentence's head ablation: the ablated output and scores agree with a direct `model.intervene` run."""

from __future__ import annotations

import pytest
import torch
from model_helpers import SHARED_DATA

from workbench.analysis.circuits.ablation import ablation_effect
from workbench.core.interventions import ablate_heads


@pytest.fixture(scope="module")
def tm():
    from test_translator import build_translation_model

    return build_translation_model(SHARED_DATA)


def test_ablation_effect_matches_a_direct_intervention(tm):
    r = tm.translate(["Ein Hund läuft durch den Park."], beam=1, return_tokens=True)[0]
    heads = [("cross", 0, 1), ("enc_self", 1, 0), ("cross", 0, 1)]  # a repeat counts once
    effect = ablation_effect(tm, r.source_tokens, r.tokens, heads, beam=1)
    assert effect.heads == (("cross", 0, 1), ("enc_self", 1, 0))
    cfg = tm.model.cfg
    src = torch.tensor([r.source_tokens])
    tgt_in = torch.tensor([[cfg.start_id, *r.tokens[:-1]]])
    with tm.model.intervene(ablate_heads({("cross", 0): [1], ("enc_self", 1): [0]})), torch.no_grad():
        lp = torch.log_softmax(tm.model(src, tgt_in)[0], -1)
        ablated = tm.translate(["Ein Hund läuft durch den Park."], beam=1, return_scores=True)[0]
    direct = float(lp[torch.arange(len(r.tokens)), torch.tensor(r.tokens)].sum())
    assert effect.original_log_prob == pytest.approx(direct, abs=1e-4)
    assert effect.delta == pytest.approx(direct - r.log_prob, abs=1e-4) and abs(effect.delta) > 1e-4
    assert list(effect.tokens) == ablated.tokens and effect.text == ablated.text
    assert effect.log_prob == pytest.approx(ablated.log_prob, abs=1e-4)
    assert tm.score(r.source_tokens, r.tokens).log_prob == pytest.approx(r.log_prob, abs=1e-4)  # hooks gone


def test_a_head_the_model_lacks_is_a_clear_error(tm):
    with pytest.raises(ValueError, match="head cross:5:0 does not exist: this model has 2 cross layers of 4 heads"):
        ablation_effect(tm, [5, 6, 2], [7, 2], [("cross", 5, 0)])

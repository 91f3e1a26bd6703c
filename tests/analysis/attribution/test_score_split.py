"""The cross-attention score split: component pairs plus the bias terms rebuild hook_scores."""

from __future__ import annotations

import pytest
import torch
from model_helpers import make_model

from workbench import presets
from workbench.analysis.attribution.score_split import margin_by_group, split_cross_scores


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_terms_sum_to_the_scores_and_the_margins_to_the_score_gap(norm_first):
    model = make_model(presets.tiny(vocab=40, norm_first=norm_first))
    src, tgt = torch.tensor([[5, 9, 12, 7, 2]]), torch.tensor([[1, 8, 14, 6]])
    for layer in (0, 1):
        split = split_cross_scores(model, src, tgt, layer)
        torch.testing.assert_close(split.total(), split.scores, atol=1e-4, rtol=0)
        assert split.terms.shape[:1] == (4,) and split.terms.shape[-2:] == (4, 5)
        assert any(lab == "src_tok" for lab in split.key_labels) and "tgt_pos" in split.query_labels
        assert any(lab.startswith("enc_self:1:") for lab in split.key_labels)
        assert not any(lab.startswith(f"cross:{layer}:") for lab in split.query_labels)
    margins = margin_by_group(split, head=2)
    s = split.scores[2][:, :4]  # EOS (key 4) left out of the contest
    top = s.topk(2, dim=-1).values
    assert sum(margins.values()) == pytest.approx(float((top[:, 0] - top[:, 1]).sum()), abs=1e-4)
    assert ("token", "token") in margins and ("position", "position") in margins

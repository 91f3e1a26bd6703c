"""One head spelling: every function that names heads prints `Head`'s "kind:layer:head", `Head.parse` reads all of
them back, and no table has a column named "head" (it would shadow `DataFrame.head`)."""

from __future__ import annotations

import pytest
import torch
from model_helpers import make_model

from workbench import presets
from workbench.analysis import (
    alignment_head_scores,
    corpus_head_stats,
    direct_logit_attribution,
    head_importance,
    log_prob,
    patching_sweep,
    path_patching,
    positional_share,
)
from workbench.core.heads import KINDS, Head

SOURCES = [[5, 6, 7, 8, 2], [9, 12, 13, 2]]
OUTPUTS = [[9, 10, 11, 2], [13, 14, 2]]


@pytest.fixture(scope="module")
def model():
    return make_model(presets.tiny(vocab=40), seed=1)


def _is_head(label: str) -> bool:
    return label.split(":")[0] in KINDS


def test_every_printed_head_parses_back(model):
    src, tgt = torch.tensor([SOURCES[0]]), torch.tensor([[model.cfg.start_id, 9, 10, 11]])
    c_src = torch.tensor([[5, 6, 12, 8, 2]])
    metric = log_prob(OUTPUTS[0])
    printed: list[str] = []
    printed += patching_sweep(model, src, tgt, corrupted_src=c_src, metric=metric, positions="all").rows
    printed += path_patching(model, src, tgt, corrupted_src=c_src, metric=metric, senders="all").rows
    printed += direct_logit_attribution(model, src, tgt, position=1, token=10).labels
    tables = [corpus_head_stats(model, SOURCES, OUTPUTS).summary(),
              head_importance(model, SOURCES, OUTPUTS, kinds=("cross",), max_len_b=4),
              positional_share(model, src, tgt)]
    alignments = [{(0, 0), (1, 1)}, {(0, 0)}]
    from workbench.analysis import corpus_cross_attention

    cross = corpus_cross_attention(model, SOURCES, OUTPUTS)
    tables.append(alignment_head_scores(cross, alignments))
    for table in tables:
        assert "head" not in table.columns and callable(table.head)
        ids = list(table["head_id"].dropna())
        assert ids
        printed += ids
        for _, row in table[table["head_id"].notna()].iterrows():
            assert Head.parse(row["head_id"]) == Head.parse(row)  # the row's columns say the same head
    heads = [p for p in printed if _is_head(p)]
    assert len({Head.parse(p).kind for p in heads}) == 3
    for p in heads:
        assert str(Head.parse(p)) == p


def test_parse_reads_the_older_spellings_too():
    assert Head.parse("dec.1.cross_attn.head.2") == Head("cross", 1, 2)
    assert Head.parse("enc.0.self_attn.head.3") == Head("enc_self", 0, 3)
    assert Head.parse({"kind": "dec_self", "layer": 1, "head_index": 0}) == Head("dec_self", 1, 0)
    assert Head.parse(("cross", "1", "0")) == Head("cross", 1, 0)
    with pytest.raises(ValueError, match="kind:layer:head"):
        Head.parse("dec.1.ffn.head.2")


def test_head_stats_sentences_take_a_head(model):
    table = corpus_head_stats(model, SOURCES, OUTPUTS)
    by_head = table.sentences(Head("cross", 1, 2), "entropy")
    assert by_head.equals(table.sentences("cross", 1, 2, "entropy"))
    assert by_head.equals(table.sentences("cross:1:2", "entropy"))

"""Analysis views draw what the analyses computed (checked on the Bokeh models' data) and export offline."""

from __future__ import annotations

import numpy as np
import torch
from bokeh.models import DataTable
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.analysis import (
    add_cross_attention,
    alignment_head_scores,
    corpus_head_stats,
    decoder_rollout,
    head_importance,
    logit_lens,
    positional_share,
    replay_beam,
    token_attribution,
)
from workbench.charts import to_html
from workbench.charts.analysis import (
    LENS_TEXT,
    TREE_NODES,
    alignment_view,
    attribution_view,
    beam_step_view,
    beam_tree_figure,
    decoder_rollout_view,
    head_importance_view,
    head_stats_heatmap,
    head_stats_table,
    head_stats_view,
    logit_lens_view,
    positional_share_view,
)
from workbench.charts.heatmap import IMAGE_NAME
from workbench.decoding.search import beam_search

CFG = presets.tiny(vocab=24)


def _image(fig) -> np.ndarray:
    return np.asarray(fig.select_one({"name": IMAGE_NAME}).data_source.data["image"][0])


def test_head_stats_views_show_the_table_values():
    model = make_model(CFG)
    table = corpus_head_stats(model, [[5, 6, 7, 2], [8, 9, 2]], [[5, 6, 2], [7, 2]])
    fig = head_stats_heatmap(table, "entropy", "cross")
    expected = np.stack([table.values("entropy")[table.block_index("cross", i)] for i in range(2)])
    np.testing.assert_allclose(_image(fig), expected, rtol=1e-6)
    dt = head_stats_table(table, kind="enc_self", stats=["entropy", "eos"])
    assert isinstance(dt, DataTable) and dt.sortable and len(dt.source.data["head_index"]) == 8
    assert "</html>" in to_html(head_stats_view(table))


def test_rollout_attribution_and_lens_views():
    model = make_model(CFG)
    src, tgt = make_batch(CFG, batch=1, src_len=5, tgt_len=4, pad=False)
    _, trace = model.run_with_cache(src, tgt)
    view = decoder_rollout_view(decoder_rollout(trace), src_tokens=list("abcde"), tgt_tokens=list("wxyz"))
    left = view.children[0]
    np.testing.assert_allclose(_image(left), decoder_rollout(trace).source[0].numpy(), rtol=1e-6)
    targets = torch.roll(tgt, -1, 1)
    attr = token_attribution(model, src, tgt, targets)
    att = trace.attention("cross", 1)[0].mean(0).numpy()
    pair = attribution_view(attr, attention=att)
    assert "Spearman" in pair.children[1].title.text
    lens = logit_lens(model, src, tgt, top_k=2)
    vocab = [f"w{i}" for i in range(CFG.tgt_vocab)]
    fig = logit_lens_view(lens, tokens=vocab)
    text = fig.select_one({"name": LENS_TEXT}).data_source.data["text"]
    assert text[-4:] == [vocab[int(i)] for i in lens.top_ids[-1, 0, :, 0]]
    assert "</html>" in to_html(positional_share_view(positional_share(model, src, tgt)))


def test_alignment_and_importance_views():
    rng = np.random.default_rng(0)
    cross = [rng.dirichlet(np.ones(4), size=(2, 4, 3)) for _ in range(2)]
    scores = alignment_head_scores(cross, [{(0, 0), (1, 1)}, {(2, 2)}])
    view = alignment_view(scores)
    grid = _image(view.children[0])
    best = scores[scores["head_index"] != "mean"].iloc[0]
    assert grid[int(best["layer"]), int(best["head_index"])] == np.nanmin(grid)
    model = make_model(CFG)
    table = head_importance(model, [[5, 6, 2]], [[6, 2]], kinds=["cross"], decode=False)
    assert "</html>" in to_html(head_importance_view(table))


def test_beam_views_show_every_candidate_and_the_output():
    model = make_model(CFG, seed=2)
    src = torch.tensor([[5, 6, 7, 2]])
    gen = beam_search(model, src, beam=2, max_len_b=4, record_steps=True)
    replay = add_cross_attention(replay_beam(gen, 0), model, src[0])
    fig = beam_tree_figure(replay)
    data = fig.select_one({"name": TREE_NODES}).data_source.data
    assert len(data["x"]) == sum(len(s.candidates) for s in replay.steps)
    assert data["fate"].count("final") == 1
    step = beam_step_view(replay, 1, src_tokens=["a", "b", "c", "</s>"])
    assert "</html>" in to_html(step)

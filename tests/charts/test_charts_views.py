"""Every view builds from a Trace (6+3-style depth mismatch, a batch); arrays and hover match the trace."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bokeh.models import ColumnDataSource, HoverTool
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.charts import (
    attention_heatmap,
    combined_attention,
    compare_traces,
    head_view,
    matrix_figure,
    model_view,
    select_attention,
)
from workbench.charts.compare import difference
from workbench.charts.head_view import line_data
from workbench.charts.heatmap import IMAGE_NAME
from workbench.core.trace import Trace

KINDS = ("enc_self", "dec_self", "cross")


@pytest.fixture(scope="module")
def trace():
    """Encoder 2 layers, decoder 3 (different depths), batch of 3 with padding, piece strings in meta."""
    cfg = presets.tiny(vocab=50, dec_layers=3)
    src, tgt = make_batch(cfg, batch=3, src_len=7, tgt_len=6)
    _, tr = make_model(cfg).run_with_cache(src, tgt)
    tr.meta["src_pieces"] = [[f"▁s{b}_{i}" if i % 2 == 0 else f"x{i}" for i in range(7)] for b in range(3)]
    tr.meta["tgt_pieces"] = [["<s>"] + [f"▁t{b}_{i}" for i in range(1, 6)] for b in range(3)]
    return tr


def _image(fig):
    return fig.select_one({"name": IMAGE_NAME}).data_source.data["image"][0]


def _hover_tokens(fig):
    """(query tokens, key tokens) the heatmap's hover names."""
    hover = next(h for h in fig.select({"type": HoverTool}) if "$x" in h.formatters)
    return list(hover.formatters["$y"].args["tokens"]), list(hover.formatters["$x"].args["tokens"])


@pytest.mark.parametrize("kind", KINDS)
def test_heatmap_array_equals_trace_and_hover_names_tokens(trace, kind):
    # sentence 0 has 2 padded source positions: trimmed away, so keys of enc_self/cross are the first 5
    fig = attention_heatmap(trace, kind, 1, heads=2, batch=0)
    img = _image(fig)
    probs = trace.attention(kind, 1, head=2)[0].numpy()
    s_real = 5
    expected = probs[:, :s_real] if kind == "cross" else probs[:s_real, :s_real] if kind == "enc_self" else probs
    if kind == "dec_self":
        expected = np.where(np.triu(np.ones_like(expected, dtype=bool), 1), np.nan, expected)
    assert img.dtype == np.float32
    np.testing.assert_allclose(img, expected, rtol=0, atol=0)
    q_tok, k_tok = _hover_tokens(fig)
    src, tgt = trace.meta["src_pieces"][0][:s_real], trace.meta["tgt_pieces"][0]
    assert (q_tok, k_tok) == {"enc_self": (src, src), "dec_self": (tgt, tgt), "cross": (tgt, src)}[kind]


def test_untrimmed_padding_is_masked_and_heads_average(trace):
    fig = attention_heatmap(trace, "enc_self", 0, heads=[0, 3], batch=0, select={"trim": False})
    img = _image(fig)
    probs = trace.attention("enc_self", 0)[0, [0, 3]].mean(0).numpy()
    assert np.isnan(img[:, 5:]).all()  # padded keys
    np.testing.assert_allclose(img[:, :5], probs[:, :5], atol=1e-6)
    assert "mean of heads [0, 3]" in fig.title.text


def test_words_view_rows_sum_to_one_and_name_words(trace):
    att = select_attention(trace, "cross", 2, batch=1, words=True)
    # pieces "▁s1_0", "x1" -> one word; 7 pieces (no padding in sentence 1) -> 4 words
    assert att.keys == ("s1_0x1", "s1_2x3", "s1_4x5", "s1_6")
    np.testing.assert_allclose(att.values.sum(-1), 1.0, atol=1e-5)
    fig = attention_heatmap(trace, "cross", 2, batch=1, words=True)
    assert _hover_tokens(fig)[1] == list(att.keys)


def test_downsampled_view_says_so_and_holds_block_means():
    rng = np.random.default_rng(0)
    values = rng.random((10, 9)).astype(np.float32)
    fig = matrix_figure(values, [str(i) for i in range(10)], [str(i) for i in range(9)], max_size=4)
    img = _image(fig)
    assert "downsampled x3" in fig.title.text and img.shape == (4, 3)
    np.testing.assert_allclose(img[0, 0], values[:3, :3].mean(), rtol=1e-6)
    np.testing.assert_allclose(img[3, 2], values[9:, 6:].mean(), rtol=1e-6)


def test_bad_selection_errors_state_values(trace):
    with pytest.raises(IndexError, match="4 heads"):
        select_attention(trace, "cross", 0, heads=[1, 7])
    with pytest.raises(IndexError, match="holds 3 sentences"):
        select_attention(trace, "cross", 0, batch=5)
    with pytest.raises(ValueError, match="kind must be"):
        select_attention(trace, "decoder", 0)


@pytest.mark.parametrize("kind", [*KINDS, "combined"])
def test_head_view_builds_for_every_kind_and_all_layers(trace, kind):
    layout = head_view(trace, kind, batch=2, min_weight=0.05)
    shown = layout.select_one({"name": "head_lines"})
    stored = [s for s in layout.select({"type": ColumnDataSource}) if "w8" in s.data]
    n_layers = {"enc_self": 2, "dec_self": 3, "cross": 3, "combined": 2}[kind]
    assert len(stored) == n_layers  # one stored set per layer for the in-page picker
    first = select_attention(trace, "enc_self", 0, batch=2).values if kind != "combined" else None
    for d in [shown.data, *({**s.data, "w": s.data["w8"] / 255} for s in stored)]:
        assert (np.asarray(d["w"]) >= 0.05 - 0.5 / 255).all() and set(np.asarray(d["h"]).tolist()) <= {0, 1, 2, 3}
    if kind == "enc_self":  # the first layer's lines are exactly the trace's weights at (h, q, k)
        d = shown.data
        np.testing.assert_array_equal(d["w"], first[d["h"], d["q"], d["k"]])


def test_line_data_keeps_exactly_the_strong_links():
    w = np.array([[0.6, 0.3, 0.1], [0.02, 0.005, 0.975]], dtype=np.float32)
    d = line_data(w, min_weight=0.01, top_k=2, highlight=1)
    assert list(zip(d["q"], d["k"])) == [(0, 0), (0, 1), (1, 0), (1, 2)]
    np.testing.assert_allclose(d["alpha"], [0.6 * 0.08, 0.3 * 0.08, 0.02, 0.975], rtol=1e-6)
    assert d["q"].dtype == np.int16 and d["h"].dtype == np.int8


def test_line_data_matches_a_brute_force_selection_over_heads():
    rng = np.random.default_rng(0)
    w = rng.random((3, 40, 50)).astype(np.float32) ** 8  # peaked rows, distinct values (no ties)
    w /= w.sum(-1, keepdims=True)
    d = line_data(w, min_weight=0.02, top_k=5)
    expected = [(h, q, k) for h in range(3) for q in range(40) for k in range(50)
                if w[h, q, k] >= 0.02 and w[h, q, k] >= np.sort(w[h, q])[-5]]
    assert list(zip(d["h"].tolist(), d["q"].tolist(), d["k"].tolist())) == expected
    np.testing.assert_array_equal(d["w"], w[d["h"], d["q"], d["k"]])


def test_combined_attention_is_the_three_blocks(trace):
    att = combined_attention(trace, enc_layer=1, dec_layer=2, heads=0, batch=2)  # sentence 2: no padding
    s = 7
    assert att.values.shape == (1, 13, 13)
    v = att.values[0]
    np.testing.assert_allclose(v[:s, :s], trace.attention("enc_self", 1, 0)[2].numpy())
    np.testing.assert_allclose(v[s:, :s], trace.attention("cross", 2, 0)[2].numpy())
    np.testing.assert_allclose(v[s:, s:], trace.attention("dec_self", 2, 0)[2].numpy())
    assert att.masked[:s, s:].all() and v[:s, s:].sum() == 0


def test_model_view_grid_covers_each_depth_and_compares_sentences(trace):
    layout = model_view(trace, compare=1, heads=[0, 2])
    tiles = {s.name: s for s in layout.select({"type": ColumnDataSource}) if s.name}
    grids = [s for s in layout.select({"type": ColumnDataSource}) if "layer" in s.data]
    assert len(grids) == 6  # 3 kinds x 2 sentences
    per_kind = sorted(len(g.data["layer"]) for g in grids)
    assert per_kind == [4, 4, 6, 6, 6, 6]  # 2 enc layers x 2 heads, 3 dec layers x 2 heads
    assert tiles  # named tile sources for an app to watch
    for g in grids:
        assert all(img.dtype == np.uint8 for img in g.data["image"])
        assert set(g.data["head"]) == {0, 2}


def test_model_view_tile_quantises_the_trace(trace):
    layout = model_view(trace, "dec_self", layers=[1], heads=[3], batch=0)
    grid = next(s for s in layout.select({"type": ColumnDataSource}) if "layer" in s.data)
    tile, scale = grid.data["image"][0], grid.data["scale"][0]
    probs = trace.attention("dec_self", 1, 3)[0].numpy()
    causal_future = np.triu(np.ones_like(probs, dtype=bool), 1)
    assert (tile[causal_future] == 0).all() and (tile[~causal_future] >= 1).all()
    np.testing.assert_allclose((tile[~causal_future] - 1) / 254 * scale, probs[~causal_future], atol=scale / 254)


def test_model_view_filters_skip_layers_a_kind_lacks(trace):
    layout = model_view(trace, layers=[2])  # the 2-layer encoder has no layer 2
    grids = [s for s in layout.select({"type": ColumnDataSource}) if "layer" in s.data]
    assert len(grids) == 2 and all(set(g.data["layer"]) == {2} for g in grids)


def _two_models():
    """Same sentence through two models with different head counts (4 and 2) and tokenizations."""
    traces = []
    for heads, pieces in ((4, ["▁The", "▁cat", "s", "▁sat", "</s>"]), (2, ["▁The", "▁ca", "ts", "▁s", "at", "</s>"])):
        cfg = presets.tiny(vocab=40, n_heads=heads, enc_layers=1, dec_layers=1)
        src = torch.arange(4, 4 + len(pieces))[None]
        src[0, -1] = cfg.eos_id
        tgt = torch.tensor([[cfg.start_id, 5, 6]])
        _, tr = make_model(cfg, seed=heads).run_with_cache(src, tgt)
        tr.meta.update(src_pieces=pieces, tgt_pieces=["<s>", "▁Die", "▁Katze"])
        traces.append(tr)
    return traces


def test_compare_aligns_different_tokenizers_by_words():
    a_tr, b_tr = _two_models()
    a = select_attention(a_tr, "enc_self", 0)
    b = select_attention(b_tr, "enc_self", 0)
    diff, wa, wb = difference(a, b)
    assert wa.keys == wb.keys == ("The", "cats", "sat", "</s>")
    np.testing.assert_allclose(diff, wb.mean - wa.mean)
    np.testing.assert_allclose(wb.values.sum(-1), 1.0, atol=1e-5)
    layout = compare_traces(a_tr, b_tr, "cross", 0, heads=[1, 3], heads_b=[0], labels=("4 heads", "2 heads"))
    assert len(layout.children) == 3


def test_compare_refuses_different_sentences():
    a_tr, b_tr = _two_models()
    b_tr.meta["src_pieces"] = ["▁A", "▁dog", "▁ran", "▁off", "▁now", "</s>"]
    with pytest.raises(ValueError, match="cannot align"):
        difference(select_attention(a_tr, "enc_self", 0), select_attention(b_tr, "enc_self", 0))


def test_views_fall_back_to_ids_without_token_strings():
    cfg = presets.tiny(vocab=30, enc_layers=1, dec_layers=1)
    src, tgt = make_batch(cfg, batch=1, src_len=4, tgt_len=3)
    _, tr = make_model(cfg).run_with_cache(src, tgt)
    tr = Trace(dict(tr), src=tr.src, tgt=tr.tgt)
    fig = attention_heatmap(tr, "cross", 0)
    assert _hover_tokens(fig)[1] == [str(int(i)) for i in src[0]]


def test_altair_heatmap_for_short_sentences(trace):
    from workbench.charts import altair_heatmap

    att = select_attention(trace, "dec_self", 1, heads=[0, 1], batch=0, words=True)
    spec = altair_heatmap(att).to_dict()
    rows = next(iter(spec["datasets"].values()))
    assert len(rows) == len(att.queries) * len(att.keys)
    cell = rows[len(att.keys) + 0]  # query 1, key 0
    assert (cell["query"], cell["key"]) == (att.queries[1], att.keys[0])
    assert cell["weight"] == pytest.approx(float(att.mean[1, 0]))
    assert [r["masked"] for r in rows[:2]] == [False, True]  # query 0 cannot see key 1 (causal)
    with pytest.raises(ValueError, match="max_cells"):
        altair_heatmap(att, max_cells=10)


def test_bucket_paths_draw_each_visible_line_once_at_its_level():
    from workbench.charts.head_view import LEVELS, bucket_paths

    lines = line_data(np.array([[[0.5, 0.5], [0.9, 0.1]], [[0.02, 0.98], [0.3, 0.7]]], dtype=np.float32))
    lines["alpha"][lines["h"] == 1] *= np.array([0.0, 1.0, 1.0, 1.0])  # one hidden line
    paths = bucket_paths(lines, ["red", "blue"])
    drawn = []
    for xs, ys, color, alpha in zip(paths["xs"], paths["ys"], paths["color"], paths["alpha"]):
        assert np.isnan(xs[2::3]).all() and np.isnan(ys[2::3]).all()
        drawn += [(color, int(q), int(k), alpha) for q, k in zip(ys[0::3], ys[1::3])]
    expected = [(["red", "blue"][h], q, k, (min(int(a * LEVELS), LEVELS - 1) + 0.5) / LEVELS)
                for h, q, k, a in zip(lines["h"], lines["q"], lines["k"], lines["alpha"]) if a > 0]
    assert sorted(drawn) == sorted(expected) and len(drawn) == 7


def test_bucket_paths_window_keeps_exactly_the_lines_crossing_it():
    from workbench.charts.head_view import bucket_paths

    lines = {"q": np.array([0, 5, 9, 2, 30], dtype=np.int16), "k": np.array([1, 20, 3, 40, 31], dtype=np.int16),
             "h": np.zeros(5, dtype=np.int8), "w": np.full(5, 0.5, np.float32), "alpha": np.full(5, 0.5, np.float32)}
    paths = bucket_paths(lines, ["red"], window=(10.0, 25.0))
    drawn = sorted((int(q), int(k)) for ys in paths["ys"] for q, k in zip(ys[0::3], ys[1::3]))
    assert drawn == [(2, 40), (5, 20)]  # lines from above the window into it, or across it; not (0,1), (9,3), (30,31)


def test_a_long_head_view_draws_only_the_scrolled_window():
    from workbench.charts.head_view import WINDOW_MARGIN

    cfg = presets.tiny(vocab=50)
    _, long_trace = make_model(cfg).run_with_cache(*make_batch(cfg, batch=1, src_len=60, tgt_len=60))
    view = head_view(long_trace, "cross", 0, max_height=400, min_weight=0.0)  # 17 of 60 rows shown
    fig = view.children[1]
    lines = view.select_one({"name": "head_lines"}).data
    paths = view.select_one({"name": "head_paths"}).data
    shown = int(fig.y_range.start + 0.5)
    assert shown == 17
    lo, hi = -0.5 - WINDOW_MARGIN * shown, shown - 0.5 + WINDOW_MARGIN * shown
    expected = sum(1 for q, k in zip(lines["q"], lines["k"]) if max(q, k) >= lo and min(q, k) <= hi)
    assert sum(len(ys) // 3 for ys in paths["ys"]) == expected < len(lines["q"])
    assert fig.y_range.js_property_callbacks["change:start"]  # scrolling redraws the window


def test_values_shown_in_place_equal_a_new_figure_and_another_shape_is_refused():
    """`show_matrix_values` puts what `matrix_values` computes into a shown figure: the same image, colour range,
    title (with its downsampling note) and highlighted row as a figure built from those values."""
    from workbench.charts.heatmap import HIGHLIGHT_NAME, matrix_figure, matrix_values, show_matrix_values

    rng = np.random.default_rng(0)
    tokens = [f"t{i}" for i in range(40)]
    shown = matrix_figure(rng.random((40, 40)), tokens, tokens, title="a", max_size=16)
    values, masked = rng.random((40, 40)), np.triu(np.ones((40, 40), dtype=bool), 1)
    show_matrix_values(shown, matrix_values(values, masked, title="b", max_size=16, highlight=3))
    fresh = matrix_figure(values, tokens, tokens, masked=masked, title="b", max_size=16, highlight=3)
    for name in (IMAGE_NAME, HIGHLIGHT_NAME):
        a, b = (dict(f.select_one({"name": name}).data_source.data) for f in (shown, fresh))
        assert a.keys() == b.keys()
        assert all(np.array_equal(np.asarray(a[k]), np.asarray(b[k]), equal_nan=True) for k in a)
    mapper = lambda f: f.select_one({"name": IMAGE_NAME}).glyph.color_mapper  # noqa: E731
    assert (mapper(shown).low, mapper(shown).high) == (mapper(fresh).low, mapper(fresh).high)
    assert shown.title.text == fresh.title.text and "downsampled x3" in shown.title.text
    with pytest.raises(ValueError, match="another shape"):
        show_matrix_values(shown, matrix_values(rng.random((40, 39))))

"""Evidence charts: line widths follow the weights, flagged tokens are red, every head of the roles table is drawn,
pruning and formation curves carry the data they were given."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from bokeh.models import GlyphRenderer

from workbench.analysis.attention.roles import HeadRoles
from workbench.charts import to_html
from workbench.charts.evidence import (
    alignment_line_data,
    alignment_lines,
    formation_chart,
    pruning_chart,
    role_grid,
    source_share_bars,
)


def _sources(obj):
    return [r.data_source for r in obj.select({"type": GlyphRenderer})]


def test_alignment_lines_width_is_the_weight():
    w = np.array([[0.7, 0.2, 0.1], [0.02, 0.03, 0.95]])
    d = alignment_line_data(w, min_weight=0.05, max_width=10)
    assert list(zip(d["t"], d["s"])) == [(0, 0), (0, 1), (0, 2), (1, 2)]
    assert d["width"] == pytest.approx([7.5, 2.5, 1.5, 10.0])
    # a row whose weights are all under the threshold still gets its strongest line
    d = alignment_line_data(np.array([[0.03, 0.04]]), min_weight=0.05)
    assert list(zip(d["t"], d["s"])) == [(0, 1)]
    fig = alignment_lines(["Das", "Haus", "."], ["The", "house"], w[:, :3], links=[(0, 0), (1, 1)])
    seg = fig.select_one({"name": "alignment_weights"}).data_source.data
    assert seg["src"] == ["Das", "Haus", ".", "."] and seg["out"] == ["The", "The", "The", "house"]
    assert "Haus" in to_html(fig)
    with pytest.raises(ValueError, match="2 output and 2 source words"):
        alignment_lines(["a", "b"], ["x", "y"], w)


def test_source_share_bars_flag_tokens():
    fig = source_share_bars(["A", "dog", "jerrier"], [0.8, 0.7, 0.2], flagged=[2])
    data = fig.select_one({"name": "source_share"}).data_source.data
    assert data["color"] == ["#1f77b4", "#1f77b4", "#d62728"] and data["share"] == [0.8, 0.7, 0.2]
    with pytest.raises(ValueError, match="2 output tokens"):
        source_share_bars(["a", "b"], [0.1, 0.2, 0.3])


def test_role_grid_pruning_and_formation_charts():
    table = pd.DataFrame({"kind": ["enc_self"] * 2 + ["cross"] * 2, "layer": [0, 0, 0, 0], "head_index": [0, 1, 0, 1],
                          "prev_top": [0.95, 0.1, np.nan, np.nan], "next_top": [0.0, 0.1, np.nan, np.nan],
                          "eos": [0.0, 0.6, 0.1, 0.1], "punct": [0.0] * 4, "rare": [0.1] * 4,
                          "aer": [np.nan, np.nan, 0.4, 0.8], "roles": ["previous", "eos", "alignment", ""]})
    grid = role_grid(HeadRoles(table))
    texts = [t for s in _sources(grid) if "roles" in s.data for t in s.data["roles"]]
    assert sorted(texts) == sorted(["previous", "eos", "alignment", "–"])
    curve = pd.DataFrame({"kind": ["enc_self"] * 3, "removed": [0, 2, 4], "total": 4, "bleu": [30.0, 29.8, 20.0],
                          "chrf": [50.0, 49.0, 40.0]})
    shares = [s.data["share"] for s in _sources(pruning_chart(curve)) if "share" in s.data]
    assert shares[0] == [0.0, 0.5, 1.0]
    # two layers x two heads; head cross:1:0 is best only at the last snapshot (given out of order)
    head_aer = {50: [[0.9, 0.95], [0.97, 0.96]], 200: [[0.75, 0.9], [0.8, 0.9]], 800: [[0.7, 0.9], [0.65, 0.9]]}
    records = [{"step": s, "best_aer": a, "diagonal_aer": 0.7, "source_share": sh, "head_aer": head_aer[s],
                "source_share_by_position": [sh - 0.1, sh], "role_counts": {"cross": {"alignment": n}}}
               for s, a, sh, n in [(800, 0.65, 0.7, 3), (50, 0.9, 0.5, 0), (200, 0.75, 0.6, 1)]]
    chart = formation_chart(records)
    html = to_html(chart)
    assert "cross:1:0 (best at the end)" in html and "diagonal aligner" in html and "output position 0" in html
    bold = chart.select_one({"name": "aer_final_best"}).data_source.data
    assert bold["x"] == [50, 200, 800] and bold["y"] == [0.97, 0.8, 0.65]  # sorted by step, that head's AER
    thin = [r.name for r in chart.select({"type": GlyphRenderer}) if (r.name or "").startswith("aer_cross:")]
    assert sorted(thin) == ["aer_cross:0:0", "aer_cross:0:1", "aer_cross:1:1"]  # every other head, thin
    assert chart.select_one({"name": "aer_best"}).data_source.data["y"] == [0.9, 0.75, 0.65]
    with pytest.raises(ValueError, match="no snapshots"):
        formation_chart([])


def test_sentence_evidence_on_the_shipped_model():
    from model_helpers import ROOT

    from workbench import load
    from workbench.analysis.attribution.sentence_evidence import sentence_evidence
    from workbench.analysis.attribution.source_share import LowShareThresholds

    tm = load(ROOT / "checkpoints" / "multi30k-de-en")
    src, out = "Ein Hund läuft im Schnee .", "A dog runs in the snow ."
    by_method = {m: sentence_evidence(tm, src, out, method=m) for m in ("weights", "norms", "alti")}
    for method, ev in by_method.items():
        assert ev.weights.shape == (7, 6) and np.allclose(ev.weights.sum(1), 1.0)
        assert len(ev.pieces) == len(ev.shares) == 8 and ev.pieces[-1] == "</s>"
        assert ((ev.shares > 0) & (ev.shares < 1)).all() and not any(ev.flags)
        # what `workbench align --method M` uses: the checkpoint's own aligner (its alignment.json: shift and
        # units) for its own method, the fallback (last layer, AWO) for another (`word_align.aligner`)
        if method == tm.alignment["method"]:
            units = ",".join(f"{layer}:{head}" for layer, head in tm.alignment["units"])
            assert ev.spec == f"{method} {tm.alignment['shift'].upper()} units {units}", ev.spec
        else:
            assert ev.spec == f"{method} AWO units {len(tm.model.dec) - 1}", ev.spec
        assert ev.links and all(0 <= s < 6 and 0 <= t < 7 for s, t in ev.links)
    assert not np.allclose(by_method["weights"].weights, by_method["alti"].weights)
    flagged = sentence_evidence(tm, src, out, thresholds=LowShareThresholds(0.75, 0.75, 0.05, 100))
    assert flagged.flags == [False, False, *(s < 0.75 for s in flagged.shares[2:-1]), False] and any(flagged.flags)
    with pytest.raises(ValueError, match="method must be one of"):
        sentence_evidence(tm, src, out, method="rollout")

"""Formation over a run's snapshots: the diagonal baseline by hand, per-head AER against gold, records in step
order, and measured snapshots read back from the cache instead of reloaded."""

from __future__ import annotations

import json

import numpy as np
import pytest
from model_helpers import ROOT, SHARED_DATA

from workbench.analysis.alignment.alignment import score_alignments
from workbench.analysis.alignment.word_align import WordMaps
from workbench.analysis.training_dynamics.formation import (
    FormationProbe,
    diagonal_links,
    formation_records,
    head_aer_table,
    snapshots,
)

RWTH = SHARED_DATA / "alignments" / "rwth-deen"


def test_diagonal_links_by_hand():
    assert diagonal_links(5, 3) == {(0, 0), (2, 1), (4, 2)}
    assert diagonal_links(2, 4) == {(0, 0), (0, 1), (1, 2), (1, 3)}  # round(1/3)=0, round(2/3)=1
    assert diagonal_links(3, 1) == {(0, 0)} and diagonal_links(0, 3) == set()


def test_head_aer_table_scores_each_head_against_gold():
    # one sentence, 2 target x 2 source words (+ EOS column); head 0 aligns straight, head 1 crosses
    straight = np.array([[0.9, 0.1, 0.0], [0.2, 0.7, 0.1]])
    crossed = straight[:, [1, 0, 2]]
    maps = [WordMaps(np.stack([straight, crossed])[None], straight[None], "weights", "awi")]
    gold = [({(0, 0)}, {(0, 0), (1, 1)})]  # sure 0-0, possible 1-1
    table = head_aer_table(maps, gold)
    assert table.iloc[0][["layer", "head_index"]].tolist() == [0, 0] and table.iloc[0]["aer"] == pytest.approx(0.0)
    assert table.iloc[0]["head_id"] == "cross:0:0"
    assert table.iloc[1]["aer"] == pytest.approx(1.0)  # 1 - (0 + 0) / (2 + 1)
    assert table.iloc[1]["aer"] == score_alignments([{(1, 0), (0, 1)}], gold).aer


@pytest.mark.skipif(not (RWTH / "test.talp").is_file(), reason="needs ../shared/data/alignments")
def test_records_over_a_run_in_step_order_and_cached(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "step_0008000").symlink_to(ROOT / "checkpoints" / "multi30k-de-en", target_is_directory=True)
    (run / "step_0000512").symlink_to(ROOT / "checkpoints" / "multi30k-de-en-early", target_is_directory=True)
    (run / "step_notastep").mkdir()
    assert [s for s, _ in snapshots(run)] == [512, 8000]
    src = ["Ein Hund läuft im Schnee .", "Zwei Männer spielen Fußball ."] * 6
    ref = ["A dog runs in the snow .", "Two men play soccer ."] * 6
    probe = FormationProbe.from_files(RWTH / "test.de", RWTH / "test.en", RWTH / "test.talp", src, ref, limit=12,
                                      share_sentences=12)
    cache = tmp_path / "formation.json"
    records = formation_records(run, probe, cache=cache)
    assert [r["step"] for r in records] == [512, 8000]
    for r in records:
        grid = np.array(r["head_aer"])
        assert grid.shape == (4, 4) and r["best_aer"] == pytest.approx(np.nanmin(grid))
        assert 0.0 < r["diagonal_aer"] < 1.0 and 0.0 < r["source_share"] < 1.0
        assert sum(r["role_counts"]["cross"].values()) >= 16 and len(r["roles"]) == 48
        alignment_heads = [h for h, roles in r["roles"].items() if "alignment" in roles]
        below = [f"cross:{i}:{j}" for i in range(4) for j in range(4) if grid[i, j] < r["diagonal_aer"]]
        assert sorted(alignment_heads) == sorted(below)
    assert records[0]["head_aer"] != records[1]["head_aer"]
    assert [r["step"] for r in json.loads(cache.read_text())] == [512, 8000]

    def no_load(path):
        raise AssertionError(f"{path} was measured already")

    seen = []  # the one progress protocol: progress(done, total, what)
    again = formation_records(run, probe, cache=cache, load=no_load,
                              progress=lambda done, total, what="": seen.append((done, total, what)))
    assert again == records
    assert seen == [(1, 2, "step 512"), (2, 2, "step 8000")]

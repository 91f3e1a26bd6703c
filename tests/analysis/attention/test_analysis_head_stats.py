"""Head statistics on constructed patterns (exact expected values) and on a model, batched two ways."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from model_helpers import make_model

from workbench import presets
from workbench.analysis.attention.head_stats import HeadStats, corpus_head_stats, head_stats, punctuation_ids
from workbench.core.trace import Trace

L = 5


def _trace(patterns: list[torch.Tensor], src: torch.Tensor) -> Trace:
    """One encoder layer whose heads are the given (L, L) patterns, for one sentence."""
    probs = torch.stack(patterns)[None]  # (1, H, L, L)
    return Trace({"enc.0.self_attn.hook_probs": probs}, src=src)


def test_constructed_patterns_give_expected_values():
    src = torch.tensor([[5, 6, 7, 8, 2]])  # EOS last
    diag = torch.eye(L)
    prev = torch.zeros(L, L)
    prev[0, 0] = 1
    for i in range(1, L):
        prev[i, i - 1] = 1
    uniform = torch.full((L, L), 1 / L)
    on_eos = torch.zeros(L, L)
    on_eos[:, -1] = 1
    t = head_stats(_trace([diag, prev, uniform, on_eos], src), pad_id=0, eos_id=2, src_punct=[7])
    v = {s: t.values(s)[0] for s in t.sums}
    # pure diagonal
    assert v["entropy"][0] == 0 and v["distance"][0] == 0 and v["self"][0] == 1 and v["max"][0] == 1
    assert v["prev"][0] == 0 and v["next"][0] == 0
    # previous-token head: every row but the first puts all weight one step back
    assert v["prev"][1] == pytest.approx((L - 1) / L)
    assert v["distance"][1] == pytest.approx((L - 1) / L)
    assert v["self"][1] == pytest.approx(1 / L)
    # uniform: entropy log L, normalised entropy 1, mean distance = mean over i of mean_j |i-j|
    assert v["entropy"][2] == pytest.approx(math.log(L))
    assert v["entropy_norm"][2] == pytest.approx(1.0)
    expected = np.mean([np.mean([abs(i - j) for j in range(L)]) for i in range(L)])
    assert v["distance"][2] == pytest.approx(expected)
    assert v["punct"][2] == pytest.approx(1 / L) and v["first"][2] == pytest.approx(1 / L)
    # all on EOS
    assert v["eos"][3] == 1 and v["first"][3] == 0 and v["eos"][0] == pytest.approx(1 / L)
    assert v["diag_distance"][3] == pytest.approx(np.mean([(L - 1 - i) / (L - 1) for i in range(L)]))
    # encoder self-attention has no monotonicity; cross-only stat is NaN here
    assert np.isnan(v["monotonic"]).all()


def test_argmax_position_and_rare_token_statistics():
    """prev_top / next_top count rows whose argmax is one step back / ahead (Voita et al.'s positional test);
    rare counts rows whose argmax is the sentence's least frequent key (EOS and padding never count)."""
    src = torch.tensor([[5, 6, 7, 8, 2]])
    prev = torch.zeros(L, L)
    prev[0, 0] = 1
    for i in range(1, L):
        prev[i, i - 1] = 0.6
        prev[i, i] = 0.4
    nxt = torch.roll(torch.eye(L), 1, dims=1)  # row i -> key i+1; the last row wraps to key 0
    on_rare = torch.zeros(L, L)
    on_rare[:, 2] = 0.9  # token 7
    on_rare[:, 4] = 0.1
    counts = torch.full((10,), 100)
    counts[7] = 3  # the rarest of 5, 6, 7, 8
    counts[2] = 0  # EOS is rarer still but never the "rare" key
    t = head_stats(_trace([prev, nxt, on_rare], src), pad_id=0, eos_id=2, src_counts=counts)
    v = {s: t.values(s)[0] for s in t.sums}
    assert v["prev_top"][0] == 1.0 and v["prev"][0] == pytest.approx(0.6 * (L - 1) / L)  # rows 1..L-1 only
    assert v["next_top"][1] == 1.0 and v["next_top"][0] == 0  # rows 0..L-2: the wrapped last row is not counted
    assert v["rare"].tolist() == pytest.approx([1 / L, 1 / L, 1.0])  # row 3 / row 1 of the positional heads hit key 2
    assert np.isnan(head_stats(_trace([prev], src), pad_id=0, eos_id=2).values("rare")).all()  # no counts: NaN


def test_padding_rows_are_left_out():
    src = torch.tensor([[5, 6, 2, 0, 0]])
    p = torch.zeros(1, 1, L, L)
    p[0, 0, :, 2] = 1  # every row on EOS ...
    p[0, 0, 3:, :] = 1 / L  # ... except padded rows, which must not count
    t = head_stats(Trace({"enc.0.self_attn.hook_probs": p}, src=src), pad_id=0, eos_id=2)
    assert t.values("eos")[0, 0] == 1.0
    assert t.counts["eos"][0, 0] == 3


def test_cross_monotonicity_and_diagonal():
    src = torch.tensor([[5, 6, 7, 2]])
    tgt = torch.tensor([[1, 9, 9, 9]])
    mono = torch.eye(4)[None, None]  # diagonal: monotonic, zero distance from the scaled diagonal
    back = torch.eye(4).flip(0)[None, None]  # reversed: every step goes back
    trace = Trace({"dec.0.cross_attn.hook_probs": torch.cat([mono, back], 1)}, src=src, tgt=tgt)
    t = head_stats(trace, kinds=["cross"])
    assert t.values("monotonic")[0].tolist() == [1.0, 0.0]
    assert t.values("distance")[0, 0] == 0
    assert np.isnan(t.values("prev")).all()


def test_ranking_and_sentence_search():
    src = torch.tensor([[5, 6, 7, 8, 2], [5, 6, 7, 8, 2]])
    a = torch.eye(L)
    b = torch.zeros(L, L)
    b[:, -1] = 1
    probs = torch.stack([torch.stack([a, b]), torch.stack([b, a])])  # sentence 1 swaps the heads
    t = head_stats(Trace({"enc.0.self_attn.hook_probs": probs}, src=src))
    found = t.sentences("enc_self", 0, 1, "eos", top=2)
    assert found["sentence"].tolist() == [0, 1] and found["value"].tolist() == [1.0, pytest.approx(0.2)]
    ranked = t.rank("entropy")
    assert list(ranked.columns[:4]) == ["head_id", "kind", "layer", "head_index"] and len(ranked) == 2
    with pytest.raises(KeyError, match="unknown statistic"):
        t.values("nope")
    with pytest.raises(KeyError, match="no block"):
        t.sentences("cross", 0, 0, "eos")


def test_corpus_stats_do_not_depend_on_batching():
    cfg = presets.tiny(vocab=40)
    model = make_model(cfg)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 9, (11, 2), generator=g).tolist()
    sources = [torch.randint(4, 40, (a,), generator=g).tolist() + [2] for a, _ in lengths]
    targets = [torch.randint(4, 40, (b,), generator=g).tolist() + [2] for _, b in lengths]
    one = corpus_head_stats(model, sources, targets, batch_size=11)
    many = corpus_head_stats(model, sources, targets, batch_size=3)
    single = corpus_head_stats(model, sources, targets, batch_size=1)
    assert one.blocks == many.blocks and len(one.blocks) == 6
    for stat in one.sums:
        for other in (many, single):
            # the model's float32 attention itself moves by ~1e-8 with the batch shape (BLAS blocking)
            np.testing.assert_allclose(one.values(stat), other.values(stat), rtol=1e-6, atol=1e-9, equal_nan=True)
            np.testing.assert_allclose(one.per_sentence(stat), other.per_sentence(stat), rtol=1e-6, atol=1e-9,
                                       equal_nan=True)
    assert one.sentence_ids.tolist() == list(range(11))
    # real probabilities are distributions: sinks are within [0, 1]
    assert np.all((one.values("first") >= 0) & (one.values("first") <= 1 + 1e-9))


def test_same_attention_batched_differently_is_identical():
    """Given the same per-sentence attention, padding and batching change nothing, bit for bit."""
    g = torch.Generator().manual_seed(3)
    lengths = [3, 7, 5, 2, 6, 4]
    sents = [torch.softmax(torch.randn(2, n, n, generator=g), -1) for n in lengths]
    ids = [torch.tensor([*range(4, 3 + n), 2]) for n in lengths]

    def batch(idx: list[int]) -> HeadStats:
        width = max(lengths[i] for i in idx)
        probs = torch.zeros(len(idx), 2, width, width)
        src = torch.zeros(len(idx), width, dtype=torch.long)
        for r, i in enumerate(idx):
            n = lengths[i]
            probs[r, :, :n, :n] = sents[i]
            src[r, :n] = ids[i]
        return head_stats(Trace({"enc.0.self_attn.hook_probs": probs}, src=src), sentence_ids=idx)

    whole = batch(list(range(6)))
    split = HeadStats.concat([batch([4, 1]), batch([0, 5, 2]), batch([3])])
    for stat in whole.sums:
        np.testing.assert_array_equal(whole.values(stat), split.values(stat))
        np.testing.assert_array_equal(whole.per_sentence(stat), split.per_sentence(stat))


def test_concat_refuses_mismatched_blocks():
    a = HeadStats((("enc_self", 0),), {"x": np.zeros((1, 1, 2))}, {"x": np.ones((1, 1))}, np.array([0]))
    b = HeadStats((("cross", 0),), {"x": np.zeros((1, 1, 2))}, {"x": np.ones((1, 1))}, np.array([1]))
    with pytest.raises(ValueError, match="blocks differ"):
        HeadStats.concat([a, b])


def test_punctuation_ids():
    assert punctuation_ids(["<pad>", "▁.", ",", "▁the", "?!", "▁", "a@@"]) == [1, 2, 4]


def test_heads_command_writes_csv_and_report(tmp_path, monkeypatch):
    from pathlib import Path

    import pandas as pd

    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "ui"))
    from app_fixtures import build_checkpoint

    from workbench.cli import main

    ckpt = build_checkpoint(tmp_path / "ck", steps=0)
    src, ref = tmp_path / "t.de", tmp_path / "t.en"
    src.write_text("Ein Hund läuft.\nZwei Kinder spielen im Park.\n", encoding="utf-8")
    ref.write_text("A dog runs.\nTwo children play in the park.\n", encoding="utf-8")
    assert main(["heads", str(ckpt), "--src", str(src), "--ref", str(ref), "--out", str(tmp_path / "o")]) == 0
    df = pd.read_csv(tmp_path / "o" / "heads.csv")
    assert len(df) == 6 * 4 and {"entropy", "eos", "monotonic"} <= set(df.columns)
    assert "<title>Head statistics</title>" in (tmp_path / "o" / "heads.html").read_text(encoding="utf-8")
    assert main(["heads", str(ckpt), "--out", str(tmp_path / "o")]) == 2  # no data given: a clear error


@pytest.mark.gpu
def test_corpus_stats_on_gpu_equal_cpu():
    cfg = presets.tiny(vocab=40)
    model = make_model(cfg)
    sources = [[5, 6, 7, 2], [8, 9, 10, 11, 2], [12, 2]]
    targets = [[5, 6, 2], [7, 8, 9, 2], [10, 2]]
    cpu = corpus_head_stats(model, sources, targets)
    # full fp32 matmuls: a training test earlier in the process (pick_device) turns TF32 on for the whole process,
    # whose 10-bit mantissa moved one statistic by 1.1e-4 relative on the H100
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        gpu = corpus_head_stats(model.cuda(), sources, targets)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    for stat in cpu.sums:
        np.testing.assert_allclose(cpu.values(stat), gpu.values(stat), rtol=1e-4, atol=1e-6, equal_nan=True)


def test_corpus_stats_cut_long_targets_and_skip_long_sources():
    """Longer than max_positions (newstest has a 261-token reference for a 256-position model): no error; a long
    target is cut, exactly (the kept rows equal a run on the cut pair), a long source is skipped; both counted."""
    cfg = presets.tiny(vocab=40, max_positions=12)
    model = make_model(cfg)
    g = torch.Generator().manual_seed(0)

    def ids(n):
        return [*torch.randint(4, 40, (n - 1,), generator=g).tolist(), cfg.eos_id]

    sources = [ids(6), ids(8), ids(15), ids(5)]  # sentence 2: source longer than 12 positions
    targets = [ids(5), ids(20), ids(6), ids(12)]  # sentence 1: 20 tokens, the decoder would read 20 positions
    counts = {"src_counts": torch.arange(40), "tgt_counts": torch.arange(40)}  # "rare" needs the same frequencies
    with pytest.warns(UserWarning, match=r"1 target\(s\) cut .* 1 sentence\(s\) skipped"):
        table = corpus_head_stats(model, sources, targets, batch_size=2, **counts)
    assert table.truncated == (1,) and table.skipped == (2,)
    assert table.sentence_ids.tolist() == [0, 1, 3]
    cut = corpus_head_stats(model, [sources[1]], [targets[1][: cfg.max_positions]], **counts)
    for stat in table.sums:
        np.testing.assert_allclose(table.per_sentence(stat)[1], cut.per_sentence(stat)[0], rtol=1e-6, atol=1e-9,
                                   equal_nan=True)
    with pytest.raises(ValueError, match=r"all 1 sources are longer than the model's max_positions \(12\)"):
        corpus_head_stats(model, [sources[2]], [targets[2]])


def test_fit_to_positions_can_skip_long_targets_instead():
    from workbench.analysis.attention.head_stats import fit_to_positions

    fitted = fit_to_positions(4, [[5, 2], [5, 6, 7, 8, 2], [5, 2]], [[5, 6, 7, 8, 9, 2], [5, 2], [6, 2]],
                              cut_targets=False)
    assert fitted.ids == [2] and fitted.skipped == [0, 1] and fitted.truncated == []
    assert fit_to_positions(4, [[5, 2]], [[6, 2]]).report() is None

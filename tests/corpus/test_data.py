import pytest
import torch

from workbench import presets
from workbench.core.batching import decoder_input
from workbench.corpus.data import (
    DATASETS,
    MIXTURES,
    ParallelData,
    copy_task,
    dataset_files,
    load_dataset,
    padding_fraction,
    read_parallel,
    shard,
)


def _random_pairs(n=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    src_lens = torch.randint(1, 40, (n,), generator=g).tolist()
    tgt_lens = torch.randint(1, 40, (n,), generator=g).tolist()
    return ParallelData([[5] * a for a in src_lens], [[6] * b for b in tgt_lens])


def test_batches_cover_every_pair_once_within_budget():
    data = _random_pairs()
    for epoch in range(3):
        plan = data.batches(300, seed=7, epoch=epoch)
        flat = [i for b in plan for i in b]
        assert sorted(flat) == list(range(len(data)))  # none dropped, none duplicated
        for idx in plan:
            assert len(idx) * max(data.src_lens[idx].max(), data.tgt_lens[idx].max()) <= 300
            batch = data.collate(idx, presets.tiny(vocab=50))
            assert batch.src.numel() <= 300 and batch.tgt_in.numel() <= 300


def test_batching_is_deterministic_under_a_seed_and_changes_per_epoch():
    data = _random_pairs()
    assert data.batches(300, seed=1, epoch=0) == data.batches(300, seed=1, epoch=0)
    assert data.batches(300, seed=1, epoch=0) != data.batches(300, seed=1, epoch=1)
    assert data.batches(300, seed=1, epoch=0) != data.batches(300, seed=2, epoch=0)


def test_length_bucketing_keeps_padding_small():
    """Translations have correlated lengths; sorting by them leaves little padding on either side."""
    g = torch.Generator().manual_seed(0)
    src_lens = torch.randint(1, 40, (2000,), generator=g)
    tgt_lens = (src_lens + torch.randint(-3, 4, (2000,), generator=g)).clamp(min=1)
    data = ParallelData([[5] * a for a in src_lens.tolist()], [[6] * b for b in tgt_lens.tolist()])
    bucketed = data.batches(600, seed=0)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(data), generator=g).tolist()
    sizes = [len(b) for b in bucketed]
    random_plan, k = [], 0
    for s in sizes:
        random_plan.append(perm[k : k + s])
        k += s
    assert padding_fraction(data, bucketed) < 0.15 < 0.3 < padding_fraction(data, random_plan)


def test_budget_smaller_than_a_sequence_is_an_error():
    data = _random_pairs()
    with pytest.raises(ValueError, match=r"max_tokens \(20\) is smaller than the longest sequence"):
        data.batches(20)


def test_collate_builds_eos_terminated_sources_and_shifted_targets():
    cfg = presets.tiny(vocab=50)
    data = ParallelData([[7, 8, 9], [10]], [[11, 12], [13, 14, 15]])
    b = data.collate([0, 1], cfg)
    assert b.src.tolist() == [[7, 8, 9, cfg.eos_id], [10, cfg.eos_id, 0, 0]]
    assert b.tgt_in.tolist() == [[cfg.start_id, 11, 12, 0], [cfg.start_id, 13, 14, 15]]
    assert b.tgt_out.tolist() == [[11, 12, cfg.eos_id, 0], [13, 14, 15, cfg.eos_id]]
    assert (b.n_src_tokens, b.n_tgt_tokens) == (6, 7)
    # the trainer's in-place fill is the one shift's result (tests/test_architecture.py SHIFT_HOMES relies on it)
    for tgt_in, tgt_out, n in zip(b.tgt_in.tolist(), b.tgt_out.tolist(), (3, 4)):
        assert tgt_in[:n] == decoder_input(tgt_out[:n], cfg.start_id)
    marian = presets.tiny(vocab=50, decoder_start_id=0)  # the start token is the padding id
    assert data.collate([0], marian).tgt_in.tolist() == [decoder_input([11, 12, marian.eos_id], 0)]
    # the loss's non-padding rows, found on the host: the same positions the device would find
    assert b.tgt_rows.tolist() == (b.tgt_out.reshape(-1) != cfg.pad_id).nonzero().squeeze(1).tolist() == [0, 1, 2, 4,
                                                                                                       5, 6, 7]
    moved = b.to("cpu")
    assert torch.equal(moved.tgt_rows, b.tgt_rows) and torch.equal(moved.tgt_out, b.tgt_out)


@pytest.mark.gpu
def test_batch_to_cuda_goes_through_pinned_memory_and_keeps_every_value():
    cfg = presets.tiny(vocab=50)
    b = _random_pairs(64).collate(list(range(64)), cfg)
    moved = b.to("cuda")
    for name in ("src", "tgt_in", "tgt_out", "tgt_rows"):
        assert getattr(moved, name).is_cuda and torch.equal(getattr(moved, name).cpu(), getattr(b, name)), name


def test_length_filter():
    data = ParallelData([[1] * 3, [1] * 30, [1] * 5], [[2] * 4, [2] * 4, [2] * 31])
    assert len(data.filter(10)) == 1


def test_shard_splits_a_batch_without_overlap():
    idx = list(range(11))
    parts = [shard(idx, r, 3) for r in range(3)]
    assert sorted(i for p in parts for i in p) == idx


def test_copy_task_is_seeded():
    a, b = copy_task(5, vocab=11, length=6, seed=3), copy_task(5, vocab=11, length=6, seed=3)
    assert a == b and all(4 <= t < 11 for row in a for t in row)


def test_read_errors_name_file_and_line(tmp_path):
    good, short = tmp_path / "a.de", tmp_path / "a.en"
    good.write_text("eins\nzwei\ndrei\n", encoding="utf-8")
    short.write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"a.de has 3 lines but .*a.en has 2"):
        read_parallel(good, short)
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"one\ntwo \xff\xfe\nthree\n")
    with pytest.raises(ValueError, match=r"bad.en line 2: invalid UTF-8"):
        read_parallel(good, bad)
    empty = tmp_path / "empty.en"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty.en is empty"):
        read_parallel(good, empty)
    with pytest.raises(FileNotFoundError, match="missing.en does not exist"):
        read_parallel(good, tmp_path / "missing.en")


def test_named_dataset_multi30k_from_the_local_root(shared_data):
    src, tgt = load_dataset("multi30k", "train", "de", "en", shared_data)
    assert len(src) == len(tgt) == 29000
    vsrc, _ = load_dataset("multi30k", "valid", "de", "en", shared_data)
    assert len(vsrc) == 1014
    assert DATASETS["multi30k"].url.startswith("https://")
    for name, ds in DATASETS.items():  # every named set resolves offline under the shared root
        split = next(iter(ds.splits))
        paths = dataset_files(name, split, "de", "en", shared_data, download=False)
        assert all(p.is_file() for p in paths), (name, paths)
    with pytest.raises(ValueError, match="has no split 'dev'"):
        dataset_files("multi30k", "dev", "de", "en", shared_data)
    with pytest.raises(FileNotFoundError, match="get tatoeba from"):
        dataset_files("tatoeba", "train", "de", "en", shared_data / "nowhere", download=False)


def test_the_general_mixture_is_every_training_part_in_order_and_no_test_set(shared_data):
    src, tgt = load_dataset("general_de_en", "train", "en", "de", shared_data)
    parts = [load_dataset(name, split, "en", "de", shared_data) for name, split in MIXTURES["general_de_en"]["train"]]
    assert src == [line for s, _ in parts for line in s] and len(tgt) == len(src)
    assert len(src) == sum(len(s) for s, _ in parts) > 200_000
    test_splits = {("tatoeba", "test"), ("multi30k", "test"), ("wmt_news", "newstest2014"), ("wmt_news", "test")}
    assert not test_splits & set(MIXTURES["general_de_en"]["train"])
    tatoeba_test, _ = load_dataset("tatoeba", "test", "en", "de", shared_data)
    assert not set(tatoeba_test[:2000]) & set(src[:160_000]) - {""}  # the shared Tatoeba train already drops overlap
    assert load_dataset("general_de_en", "train", "en", "de", shared_data, limit=7)[0] == src[:7]
    with pytest.raises(ValueError, match="mixture 'general_de_en' has no split 'test'"):
        load_dataset("general_de_en", "test", "en", "de", shared_data)


# ------------------------------------------------------------------ one padding helper, one batching rule


def test_pad_sequences_right_pads_with_the_given_id():
    from workbench.core.batching import pad_sequences

    out = pad_sequences([[5, 6, 7], [8], []], pad_id=1)
    assert out.dtype == torch.long and out.tolist() == [[5, 6, 7], [8, 1, 1], [1, 1, 1]]
    with pytest.raises(ValueError, match="no sequences to pad"):
        pad_sequences([], pad_id=0)


def test_token_batches_keeps_every_batch_within_the_budget():
    from workbench.core.batching import token_batches

    lengths = [3, 9, 1, 4, 4, 12, 2]
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches = token_batches(lengths, 10, order)
    assert [i for b in batches for i in b] == order  # consecutive, every item once
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 10
        # and greedy: the next item would not have fit
    for b, nxt in zip(batches, batches[1:]):
        assert (len(b) + 1) * max(lengths[i] for i in [*b, nxt[0]]) > 10
    assert token_batches([50], 10) == [[0]]  # too long alone: still its own batch
    with pytest.raises(ValueError, match=r"max_tokens \(0\) must be positive"):
        token_batches([1], 0)


def test_parallel_data_batches_match_the_two_sided_rule():
    # the rule written out per side (as before token_batches existed): pairs x longest, on each side
    g = torch.Generator().manual_seed(0)
    src = [list(range(4, 4 + n)) for n in torch.randint(1, 20, (200,), generator=g).tolist()]
    tgt = [list(range(4, 4 + n)) for n in torch.randint(1, 20, (200,), generator=g).tolist()]
    data = ParallelData(src, tgt)
    plan = data.batches(64, shuffle=False)
    want, cur, max_s, max_t = [], [], 0, 0
    for i in [i for b in plan for i in b]:
        s, t = int(data.src_lens[i]), int(data.tgt_lens[i])
        ns, nt = max(max_s, s), max(max_t, t)
        if cur and (len(cur) + 1) * max(ns, nt) > 64:
            want.append(cur)
            cur, ns, nt = [], s, t
        cur.append(i)
        max_s, max_t = ns, nt
    want.append(cur)
    assert plan == want


def test_default_data_root_is_the_shared_data_beside_the_checkout(monkeypatch, tmp_path):
    """Without $WORKBENCH_DATA the named datasets are read from `shared/data` beside the project checkout (the
    module's folder depth is counted right: workbench/corpus/data.py -> ../shared/data), else the user cache."""
    from pathlib import Path

    import workbench.corpus.data as data

    checkout = Path(data.__file__).resolve().parents[2]
    assert (checkout / "workbench" / "corpus" / "data.py").is_file()
    monkeypatch.delenv("WORKBENCH_DATA", raising=False)
    beside = checkout.parent / "shared" / "data"
    expected = beside if beside.is_dir() else Path.home() / ".cache" / "workbench" / "data"
    assert data.default_data_root() == expected
    monkeypatch.setenv("WORKBENCH_DATA", str(tmp_path))
    assert data.default_data_root() == tmp_path

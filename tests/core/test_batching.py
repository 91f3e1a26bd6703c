"""The one corpus loop (`core.batching.corpus_batches`) gives the batches the hand-written loops it replaced gave."""

import pytest
import torch

from workbench.core.batching import corpus_batches, decoder_input, length_order, pad_sequences

SOURCES = [[5, 6, 7], [8], [9, 10], [11, 12, 13, 14], [15, 16], [17]]
OUTPUTS = [[4, 2], [4, 4, 4, 2], [2], [4, 2], [4, 4, 2], [4, 2]]


def test_batches_in_length_order_padded_as_by_hand():
    order = sorted(range(len(SOURCES)), key=lambda k: (len(SOURCES[k]), len(OUTPUTS[k])))
    assert length_order(SOURCES, OUTPUTS) == order == [5, 1, 2, 4, 0, 3]
    got = list(corpus_batches(SOURCES, OUTPUTS, pad_id=0, start_id=1, batch_size=4))
    assert [idx for idx, _ in got] == [order[0:4], order[4:]]
    for idx, b in got:
        assert torch.equal(b.src, pad_sequences([SOURCES[k] for k in idx], 0))
        assert torch.equal(b.tgt_in, pad_sequences([decoder_input(OUTPUTS[k], 1) for k in idx], 0))
        assert torch.equal(b.tgt_out, pad_sequences([OUTPUTS[k] for k in idx], 0))
        assert b.src_lengths.tolist() == [len(SOURCES[k]) for k in idx]
        assert b.tgt_lengths.tolist() == [len(OUTPUTS[k]) for k in idx]


def test_sources_only_and_given_order():
    assert length_order(SOURCES) == [1, 5, 2, 4, 0, 3]
    (idx, b), = corpus_batches(SOURCES, pad_id=0, batch_size=10, order=range(len(SOURCES)))
    assert idx == list(range(6)) and b.tgt_in is None and b.tgt_out is None
    assert torch.equal(b.src, pad_sequences(SOURCES, 0))


def test_refuses_a_bad_batch_size_and_mismatched_lengths():
    with pytest.raises(ValueError, match="batch_size"):
        next(corpus_batches(SOURCES, pad_id=0, batch_size=0))
    with pytest.raises(ValueError, match="6 sources but 2 outputs"):
        next(corpus_batches(SOURCES, OUTPUTS[:2], pad_id=0, batch_size=2))


def test_source_end_and_prefix_give_the_alignment_loops_batches():
    """`source_end` + `prefix=True`: the batches the alignment analyses built by hand (source + EOS, decoder
    input = start + the whole target), in the same (source length, target length) order."""
    eos, start = 3, 1
    order = sorted(range(len(SOURCES)), key=lambda k: (len(SOURCES[k]), len(OUTPUTS[k])))
    got = list(corpus_batches(SOURCES, OUTPUTS, pad_id=0, start_id=start, batch_size=4, source_end=eos,
                              prefix=True))
    assert [idx for idx, _ in got] == [order[0:4], order[4:]]
    for idx, b in got:
        assert torch.equal(b.src, pad_sequences([[*SOURCES[k], eos] for k in idx], 0))
        assert torch.equal(b.tgt_in, pad_sequences([decoder_input(OUTPUTS[k], start, prefix=True) for k in idx], 0))
        assert b.tgt_out is None
        assert b.src_lengths.tolist() == [len(SOURCES[k]) + 1 for k in idx]
        assert b.tgt_lengths.tolist() == [len(OUTPUTS[k]) + 1 for k in idx]
        assert b.tgt_mask().sum().item() == sum(len(OUTPUTS[k]) + 1 for k in idx)

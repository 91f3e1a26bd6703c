"""Traces over greedy and beam search hold any hook names and equal the teacher-forced forward on the output."""

import pytest
import torch
from model_helpers import make_model

from workbench import presets
from workbench.analysis.generation.generation_trace import generation_trace
from workbench.decoding.search import beam_search, greedy

NAMES = ["hook_src_embed", "enc.1.self_attn.hook_result", "hook_memory", "dec.0.cross_attn.hook_k",
         "dec.1.cross_attn.hook_result", "dec.0.self_attn.hook_probs", "dec.1.self_attn.hook_scores",
         "dec.1.cross_attn.hook_probs", "dec.0.hook_resid_ffn", "dec.1.ffn.hook_hidden", "dec.1.ffn_norm.hook_scale",
         "hook_tgt_pos", "hook_logits", "dec.0.self_attn.hook_k"]


@pytest.fixture(params=["post", "pre"])
def model(request):
    return make_model(presets.tiny(vocab=40, norm_first=request.param == "pre"), seed=6)


@pytest.mark.parametrize("beam", [1, 3])
def test_generation_trace_equals_teacher_forcing_the_output(model, beam):
    src = torch.tensor([[5, 9, 13, 7, 22, 2, 0, 0]])  # padded: the trace drops the padding
    hyp, trace = generation_trace(model, src, names=NAMES, beam=beam, max_len_b=9)
    search = greedy(model, src[:, :6], max_len_b=9) if beam == 1 else beam_search(model, src[:, :6], beam=3,
                                                                                    max_len_b=9)
    assert hyp.tokens == search.hypotheses[0][0].tokens
    assert trace.tgt.tolist() == [[model.cfg.start_id, *hyp.tokens[:-1]]]
    _, forced = model.run_with_cache(trace.src, trace.tgt, names=NAMES)
    assert set(trace) == set(NAMES)
    for name in NAMES:
        torch.testing.assert_close(trace[name], forced[name], atol=1e-5, rtol=1e-5, msg=name)


def test_beam_path_is_not_always_beam_zero():
    """Sentences whose chosen hypothesis leaves beam 0: the ancestry walk is actually exercised."""
    model = make_model(presets.tiny(vocab=40), seed=6)
    moved = 0
    for seed in range(8):
        g = torch.Generator().manual_seed(seed)
        src = torch.cat([torch.randint(4, 40, (1, 6), generator=g), torch.tensor([[2]])], 1)
        hyp, trace = generation_trace(model, src, names="dec.*.hook_resid_ffn", beam=4, max_len_b=8)
        _, forced = model.run_with_cache(trace.src, trace.tgt, names="dec.*.hook_resid_ffn")
        torch.testing.assert_close(trace["dec.1.hook_resid_ffn"], forced["dec.1.hook_resid_ffn"], atol=1e-5,
                                   rtol=1e-5)
        moved += any(r != 0 for r in trace.meta["rows"])
    assert moved > 0


def test_refuses_batches_and_bad_beams(model):
    with pytest.raises(ValueError, match="one sentence"):
        generation_trace(model, torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="beam must be at least 1"):
        generation_trace(model, torch.tensor([5, 2]), beam=0)
    with pytest.raises(KeyError, match="hook_memory"):
        generation_trace(model, torch.tensor([5, 2]), names="hook_memroy")

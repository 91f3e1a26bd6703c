"""A spliced dictionary's features through nnsight during greedy and beam search (issue 36 point 2): nnsight traces
the search itself (`trace(src, fn=search)`), and `tracer.iter[:]` reaches `<site>.sae.hook_acts` at every step (one
call per step on the new position, the KV cache). What it reads is what the workbench's capture reads; an edit
written there steers the search exactly as the same edit written as a workbench hook."""

from __future__ import annotations

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.core.config import DecodeConfig
from workbench.decoding.search import generate
from workbench.features import DictionaryConfig, SparseDictionary, splice

nnsight = pytest.importorskip("nnsight")

FEATURE, VALUE = 9, 6.0


def _dictionary(model) -> SparseDictionary:
    cfg = DictionaryConfig("dec.1.cross_attn.hook_out", d_in=model.cfg.d_model, d_sae=48, k=6)
    torch.manual_seed(0)
    d = SparseDictionary(cfg)
    with torch.no_grad():
        d.b_enc.normal_(0, 0.1)
        d.b_dec.normal_(0, 0.3)
    return d.eval()


def _add(acts, hook):
    acts[..., FEATURE] += VALUE
    return acts


@pytest.mark.filterwarnings("ignore:.*was never reached")  # an open `tracer.iter[:]` ends past the last step
@pytest.mark.parametrize("beam", [1, 3], ids=["greedy", "beam"])
def test_nnsight_reads_and_edits_a_spliced_feature_during_search_as_the_workbench_hook_does(beam):
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)  # its own model: nnsight instruments the modules it wraps
    src, _ = make_batch(cfg)
    runs = []

    def search(s):
        runs.append(generate(model, s, DecodeConfig(beam=beam, max_len_a=0.0, max_len_b=8)))
        return runs[-1]

    def outputs(g):
        return [[(h.tokens, h.score) for h in hyps] for hyps in g.hypotheses]

    with splice(model, _dictionary(model)) as sae, torch.no_grad():
        name = sae.hook_acts.name
        with model.capture(name) as store:
            plain = search(src)
        with model.hooks({name: _add}):
            by_hook = search(src)
        wrapped = nnsight.NNsight(model)
        acts = wrapped.dec[1].cross_attn.hook_out.sae.hook_acts
        with wrapped.trace(src, fn=search) as tracer:
            read = nnsight.save([])
            for _ in tracer.iter[:]:
                read.append(acts.output.clone())
        with wrapped.trace(src, fn=search) as tracer:
            for _ in tracer.iter[:]:
                acts.output[..., FEATURE] += VALUE
        by_nnsight = runs[-1]
    steps = store[name]
    assert len(steps) > 1 and len(read) == len(steps)  # one read per step of the search
    for got, want in zip(read, steps):  # (rows, 1, d_sae): the new position of every live row
        assert got.shape == want.shape and got.size(1) == 1
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # nnsight's instrumented modules run unfused
    assert [[t for t, _ in hyps] for hyps in outputs(by_nnsight)] == [[t for t, _ in hyps] for hyps in outputs(by_hook)]
    torch.testing.assert_close([s for hyps in outputs(by_nnsight) for _, s in hyps],
                               [s for hyps in outputs(by_hook) for _, s in hyps], rtol=0, atol=1e-5)
    assert outputs(by_hook) != outputs(plain)  # the edit steered the search

"""Trace: indexing by name and by (kind, layer, head), layer order, suggestions, safetensors round trip."""

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import Trace, presets


@pytest.fixture
def traced():
    cfg = presets.tiny(vocab=50, enc_layers=12, dec_layers=2)  # 12 layers: enc.10 must sort after enc.2
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    return model, src, tgt, model.run_with_cache(src, tgt)[1]


def test_default_capture_is_every_attention_probability(traced):
    model, _, _, trace = traced
    assert set(trace) == set(model.hook_names("*.hook_probs"))
    assert trace.layers("enc_self") == 12 and trace.layers("cross") == 2


def test_stack_is_in_layer_order(traced):
    _, _, _, trace = traced
    stacked = trace.stack("enc.*.self_attn.hook_probs")
    assert stacked.shape[0] == 12
    torch.testing.assert_close(stacked[10], trace["enc.10.self_attn.hook_probs"])
    torch.testing.assert_close(stacked[2], trace["enc.2.self_attn.hook_probs"])


def test_index_by_kind_layer_head(traced):
    _, src, tgt, trace = traced
    cross = trace.attention("cross", 1)
    assert cross.shape == (src.size(0), 4, tgt.size(1), src.size(1))
    torch.testing.assert_close(trace[("cross", 1, 3)], cross[:, 3])
    with pytest.raises(IndexError, match="4 heads"):
        trace.attention("cross", 1, head=4)
    with pytest.raises(ValueError, match="kind must be one of"):
        trace.attention("encoder", 0)


def test_missing_key_names_close_matches(traced):
    _, _, _, trace = traced
    with pytest.raises(KeyError, match="closest: \\['dec.1.cross_attn.hook_probs'"):
        trace["dec.1.cross_attn.hook_prob"]


def test_save_load_round_trip_with_tokens_and_meta(traced, tmp_path):
    _, src, tgt, trace = traced
    trace.meta["src_pieces"] = [["▁Ein", "▁Hund"]]
    trace.save(tmp_path / "t.safetensors")
    again = Trace.load(tmp_path / "t.safetensors")
    assert set(again) == set(trace) and again.meta == trace.meta
    torch.testing.assert_close(again.src, src)
    torch.testing.assert_close(again.tgt, tgt)
    for name in trace:
        torch.testing.assert_close(again[name], trace[name])


def test_load_refuses_other_safetensors(tmp_path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    with pytest.raises(ValueError, match="not a workbench trace"):
        Trace.load(tmp_path / "w.safetensors")


def test_to_casts_and_moves(traced):
    _, _, _, trace = traced
    half = trace.to("cpu", dtype=torch.float16)
    assert all(t.dtype == torch.float16 for t in half.values()) and half.src.dtype == torch.int64
    assert half.nbytes() * 2 == trace.nbytes()


def test_capture_to_cpu_and_keep_graph(traced):
    model, src, tgt, _ = traced
    model.train()
    logits, trace = model.run_with_cache(src, tgt, names="hook_memory", detach=False, device="cpu")
    assert trace["hook_memory"].requires_grad
    trace["hook_memory"].sum().backward()  # gradient flows to the parameters through the captured tensor
    assert model.src_embed.weight.grad is not None


def test_token_strings_are_pieces_and_old_files_still_load(tmp_path):
    import json

    from safetensors.torch import save_file

    trace = Trace({"hook_memory": torch.zeros(1, 2, 4)}, src=torch.tensor([[5, 2]]))
    trace.meta["src_pieces"] = ["▁Hund", "</s>"]
    assert type(trace.meta) is dict and "src_tokens" not in trace.meta  # plain data: no second naming layer
    with pytest.raises(KeyError):
        trace.meta["src_tokens"]
    # a file written before the rename loads under the new names, silently
    old = tmp_path / "old.safetensors"
    save_file({"hook_memory": torch.zeros(1, 2, 4), "__src__": torch.tensor([[5, 2]])}, str(old),
              metadata={"workbench_trace": json.dumps({"src_tokens": ["▁Hund", "</s>"]})})
    loaded = Trace.load(old)
    assert dict(loaded.meta) == {"src_pieces": ["▁Hund", "</s>"]}
    assert dict(loaded.to("cpu").meta) == dict(loaded.meta)


def test_a_trace_of_chosen_heads_indexes_by_the_models_head_and_round_trips(tmp_path):
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    _, full = model.run_with_cache(src, tgt)
    _, some = model.run_with_cache(src, tgt, heads=["enc_self:0:1", "enc_self:0:3"])
    assert list(some) == ["enc.0.self_attn.hook_probs"]  # the first block: nothing upstream differs
    torch.testing.assert_close(some.attention("enc_self", 0, 3), full.attention("enc_self", 0, 3), rtol=0, atol=1e-6)
    with pytest.raises(KeyError, match=r"holds heads \[1, 3\]"):
        some.attention("enc_self", 0, 2)
    some.save(tmp_path / "t.safetensors")
    again = Trace.load(tmp_path / "t.safetensors")
    torch.testing.assert_close(again.attention("enc_self", 0, 1), some.attention("enc_self", 0, 1))

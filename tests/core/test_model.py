"""Model wiring follows the config: norms, positions, tying; incremental decoding equals full decoding."""

import math

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.core.embedding import sinusoidal_positions
from workbench.core.model import DecoderCache, Encoded


@pytest.mark.parametrize("norm_first", [False, True])
def test_norm_placement_is_what_the_config_says(norm_first):
    cfg = presets.tiny(vocab=50, norm_first=norm_first)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    _, trace = model.run_with_cache(src, tgt, names=["enc.0.hook_resid_in", "enc.0.hook_resid_ffn",
                                                    "dec.1.hook_resid_in", "dec.1.hook_resid_ffn", "hook_src_embed"])
    layer, x = model.enc[0], trace["enc.0.hook_resid_in"]
    mask = (src != cfg.pad_id)[:, None, None, :]
    attn = lambda h: layer.self_attn(h, mask=mask)[0]  # noqa: E731
    if norm_first:  # x + f(LN(x))
        h = x + attn(layer.self_attn_norm(x))
        expected = h + layer.ffn(layer.ffn_norm(h))
    else:  # LN(x + f(x)), the paper
        h = layer.self_attn_norm(x + attn(x))
        expected = layer.ffn_norm(h + layer.ffn(h))
    torch.testing.assert_close(trace["enc.0.hook_resid_ffn"], expected)
    torch.testing.assert_close(trace["enc.0.hook_resid_in"], trace["hook_src_embed"])
    assert (model.enc_norm is not None) == norm_first and (model.dec_norm is not None) == norm_first


def test_final_norms_can_be_set_independently():
    model = make_model(presets.tiny(vocab=50, norm_first=True, enc_final_norm=False, dec_final_norm=True))
    assert model.enc_norm is None and model.dec_norm is not None


def test_paper_positions_match_the_formula():
    d, table = 16, sinusoidal_positions(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_halves_and_t2t_positions_match_their_formulas():
    d, half = 16, 8
    halves = sinusoidal_positions(20, d, "sinusoidal_halves")
    t2t = sinusoidal_positions(20, d, "sinusoidal_t2t", offset=2)
    for pos in (0, 3, 19):
        for i in range(half):
            paper = pos / 10000 ** (2 * i / d)
            assert halves[pos, i].item() == pytest.approx(math.sin(paper), abs=1e-6)
            assert halves[pos, half + i].item() == pytest.approx(math.cos(paper), abs=1e-6)
            t2t_angle = (pos + 2) * math.exp(-i * math.log(10000) / (half - 1))
            assert t2t[pos, i].item() == pytest.approx(math.sin(t2t_angle), abs=1e-5)
            assert t2t[pos, half + i].item() == pytest.approx(math.cos(t2t_angle), abs=1e-5)


def test_model_adds_positions_with_offset_and_scale():
    cfg = presets.tiny(vocab=50, positions="sinusoidal_t2t", position_offset=2)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    _, trace = model.run_with_cache(src, tgt, names=["hook_src_tok", "hook_src_pos", "hook_src_embed"])
    expected_pos = sinusoidal_positions(src.size(1) + 2, cfg.d_model, "sinusoidal_t2t")[2:]
    torch.testing.assert_close(trace["hook_src_pos"][0], expected_pos)
    torch.testing.assert_close(trace["hook_src_tok"], model.src_embed(src) * math.sqrt(cfg.d_model))
    torch.testing.assert_close(trace["hook_src_embed"], trace["hook_src_tok"] + trace["hook_src_pos"])


def test_learned_positions_are_parameters():
    model = make_model(presets.tiny(vocab=50, positions="learned"))
    assert "positions.weight" in dict(model.named_parameters())


@pytest.mark.parametrize("tie, shared", [("none", 0), ("decoder", 1), ("all", 2)])
def test_weight_tying(tie, shared):
    vocab = dict(src_vocab=50, tgt_vocab=50 if tie == "all" else 60)
    model = make_model(presets.tiny(tie_embeddings=tie, **vocab))
    ptr = lambda m: m.weight.data_ptr()  # noqa: E731
    same_out = ptr(model.output_proj) == ptr(model.tgt_embed)
    same_src = ptr(model.src_embed) == ptr(model.tgt_embed)
    assert int(same_out) + int(same_src) == shared


def _assert_incremental_equals_full(model, src, tgt):
    """Token-by-token decoding with the KV cache gives the full forward's logits at every position."""
    tgt = tgt.clone()
    tgt[1, -2:] = 7  # no target padding in incremental decoding
    encoded = model.encode(src)
    full = model.decode(tgt, encoded)[0]
    cache = model.start_cache(encoded)
    for t in range(tgt.size(1)):
        step, cache = model.decode(tgt[:, t : t + 1], encoded, cache)
        torch.testing.assert_close(step[:, 0], full[:, t], rtol=1e-5, atol=1e-5)
    assert cache.length == tgt.size(1)


@pytest.mark.parametrize("norm_first", [False, True])
def test_kv_cache_decoding_equals_full_decoding_token_by_token(norm_first):
    cfg = presets.tiny(vocab=50, norm_first=norm_first, enc_layers=3, dec_layers=2)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=3, tgt_len=8, pad=True)
    _assert_incremental_equals_full(model, src, tgt)


def test_kv_cache_prefill_then_steps_and_reorder():
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=2, tgt_len=7, pad=False)
    encoded = model.encode(src)
    full = model.decode(tgt, encoded)[0]
    _, cache = model.decode(tgt[:, :4], encoded, model.start_cache(encoded))  # prefill 4 tokens at once
    order = torch.tensor([1, 0])
    logits, _ = model.decode(tgt[order, 4:], encoded.index_select(order), cache.index_select(order))
    torch.testing.assert_close(logits, full[order, 4:], rtol=1e-5, atol=1e-5)


def _copied_now(cache, index, *, cross: bool):
    """The cache's rows `index` as before reorders were owed: the self-attention K/V (and with `cross` the
    cross-attention K/V) copied at once."""
    from workbench.core.attention import KVCache

    copy = lambda kv: KVCache(kv.k.index_select(0, index), kv.v.index_select(0, index))  # noqa: E731
    return DecoderCache([copy(kv) for kv in cache.self_kv], [copy(kv) if cross else kv for kv in cache.cross_kv])


def test_owed_reorders_equal_copying_the_cache_at_once():
    """Beam search's reorders (expand to beams, follow parents, drop finished rows) are owed and applied by the next
    append; every step's logits and the K/V a reader sees are bit-identical to copying the cache at each reorder."""
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=3, tgt_len=2, pad=False)
    encoded = model.encode(src)
    _, owed = model.decode(tgt, encoded, model.start_cache(encoded))  # a prefilled (strided) cache
    now = owed
    # (parents: beam search's own reorder, of the self-attention K/V only; else every K/V tensor), composed in pairs
    steps = [[("all", [0, 0, 1, 1, 2, 2])], [("parents", [1, 0, 3, 2, 4, 4])], [], [("all", [0, 1, 4, 5])],
             [("parents", [1, 0, 3, 3])], [("parents", [1, 0, 3, 2]), ("all", [2, 3, 0])], [("parents", [2, 2, 0])]]
    tokens = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for reorders in steps:
            for kind, index in reorders:
                index = torch.tensor(index)
                if kind == "all":
                    owed, now = owed.index_select(index), _copied_now(now, index, cross=True)
                    encoded = Encoded(encoded.memory.index_select(0, index), None)
                else:
                    owed, now = owed.reorder(index), _copied_now(now, index, cross=False)
            step = torch.randint(4, cfg.tgt_vocab, (encoded.memory.size(0), 1), generator=tokens)
            step_owed, owed = model.decode(step, encoded, owed)
            step_now, now = model.decode(step, encoded, now)
            assert torch.equal(step_owed, step_now)
        owed = owed.reorder(torch.tensor([1, 0, 0]))
        now = _copied_now(now, torch.tensor([1, 0, 0]), cross=False)
    for a, b in zip(owed.self_kv + owed.cross_kv, now.self_kv + now.cross_kv):  # read while a reorder is owed
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    assert owed.length == now.length == 2 + len(steps)


def test_a_beam_cache_equals_copying_the_cache_per_beam_row():
    """`for_beams`: cross-attention K/V and the source mask kept once per sentence (its beams' queries meet them in
    one attention) and the self-attention reorders written into two reused buffers per layer. Every step's logits
    equal those of the cache copied out to one row per beam (padded sources, finished sentences dropped), within
    the summation-order difference of the two attention shapes; a listener to the cross-attention probabilities
    sees one row per beam, as without sharing; the arenas never hold more than their two buffers."""
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, _ = make_batch(cfg, batch=3, tgt_len=2, pad=True)
    assert (src == cfg.pad_id).any()
    K, steps = 4, 6
    encoded = model.encode(src)
    beam = model.start_cache(encoded).for_beams(K, steps)
    rows = torch.arange(3).repeat_interleave(K)
    per_row = model.start_cache(encoded).index_select(rows)
    enc_rows = encoded.index_select(rows)
    tokens = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for t in range(steps):
            step = torch.randint(4, cfg.tgt_vocab, (rows.numel(), 1), generator=tokens)
            got, beam = model.decode(step, encoded, beam)
            want, per_row = model.decode(step, enc_rows, per_row)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            if t == 2:  # sentence 1 finishes: keep the others' sentences and beam rows
                keep = torch.tensor([0, 2])
                beam_rows = (keep[:, None] * K + torch.arange(K)).view(-1)
                encoded = encoded.index_select(keep)
                beam = beam.keep_sentences(keep).reorder(beam_rows)
                per_row, enc_rows = per_row.index_select(beam_rows), enc_rows.index_select(beam_rows)
                rows = rows[beam_rows]
            parents = torch.randint(0, K, (rows.numel(),), generator=tokens) + (torch.arange(rows.numel()) // K) * K
            beam, per_row = beam.reorder(parents), per_row.reorder(parents)
        with model.capture("dec.0.cross_attn.hook_probs") as store:
            step = torch.randint(4, cfg.tgt_vocab, (rows.numel(), 1), generator=tokens)
            got, _ = model.decode(step, encoded, beam)
        want, _ = model.decode(step, enc_rows, per_row)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    probs = store["dec.0.cross_attn.hook_probs"][0]
    assert probs.shape == (rows.numel(), cfg.n_heads, 1, src.size(1))
    assert torch.allclose(probs.sum(-1), torch.ones(()))
    assert all(len(arena._buffers) <= 2 for pair in beam.arenas for arena in pair)
    with pytest.raises(ValueError, match="fresh cache"):
        beam.for_beams(K, steps)
    with pytest.raises(ValueError, match="shared by beams"):
        beam.index_select(torch.arange(rows.numel()))


def test_continuing_one_cache_twice_leaves_it_and_both_continuations_intact():
    """A cache is a value: appending never writes into the tensors an earlier cache reads."""
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=2, tgt_len=6, pad=False)
    encoded = model.encode(src)
    cache = model.start_cache(encoded)
    for t in range(3):
        _, cache = model.decode(tgt[:, t : t + 1], encoded, cache)
    cache = cache.reorder(torch.tensor([1, 1]))
    before = [(kv.k.clone(), kv.v.clone()) for kv in cache.self_kv]
    first, after_first = model.decode(tgt[:, 3:4], encoded, cache)
    second, _ = model.decode(tgt[:, 4:5], encoded, cache)
    again, _ = model.decode(tgt[:, 3:4], encoded, cache)
    assert torch.equal(first, again) and not torch.equal(first, second)
    for (k, v), kv in zip(before, cache.self_kv):
        assert torch.equal(k, kv.k) and torch.equal(v, kv.v)
    assert after_first.length == 4


def test_owed_reorder_under_autograd_gives_gradients():
    """Under autograd the append takes the plain gather and cat (out= copies are not differentiable)."""
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=2, tgt_len=4, pad=False)
    encoded = model.encode(src)
    _, cache = model.decode(tgt[:, :2], encoded, model.start_cache(encoded))
    logits, _ = model.decode(tgt[[1, 1], 2:3], Encoded(encoded.memory[[1, 1]], None),
                             cache.reorder(torch.tensor([1, 1])))
    logits.sum().backward()
    assert model.dec[0].self_attn.k_proj.weight.grad.abs().sum() > 0
    with torch.no_grad():
        _, cache = model.decode(tgt[:, :2], encoded, model.start_cache(encoded))
        same, _ = model.decode(tgt[[1, 1], 2:3], Encoded(encoded.memory[[1, 1]], None),
                               cache.reorder(torch.tensor([1, 1])))
    assert torch.equal(same, logits.detach())


def test_cached_steps_capture_attention_matching_the_full_pass():
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=2, tgt_len=5, pad=False)
    _, trace = model.run_with_cache(src, tgt)
    encoded = model.encode(src)
    cache = model.start_cache(encoded)
    with model.capture("dec.*.hook_probs") as store:
        for t in range(tgt.size(1)):
            _, cache = model.decode(tgt[:, t : t + 1], encoded, cache)
    for layer in range(cfg.dec_layers):
        steps = store[f"dec.{layer}.self_attn.hook_probs"]
        for t, probs in enumerate(steps):  # (B, H, 1, t + 1)
            torch.testing.assert_close(probs[:, :, 0], trace.attention("dec_self", layer)[:, :, t, : t + 1])
        cross = torch.cat(store[f"dec.{layer}.cross_attn.hook_probs"], dim=2)
        torch.testing.assert_close(cross, trace.attention("cross", layer))


def test_bad_ids_and_lengths_give_clear_errors(tiny_model, tiny_config):
    src, tgt = make_batch(tiny_config)
    with pytest.raises(ValueError, match=r"source ids must lie in \[0, 50\)"):
        tiny_model(src + 100, tgt)
    with pytest.raises(ValueError, match="empty"):
        tiny_model(src[:, :0], tgt)
    with pytest.raises(ValueError, match="must be \\(batch, length\\)"):
        tiny_model(src[0], tgt)
    long = torch.full((1, tiny_config.max_positions + 1), 5)
    with pytest.raises(ValueError, match="longer than max_positions"):
        tiny_model(long, tgt[:1])


def test_param_count_of_base_preset_matches_the_paper():
    """Table 3 lists 65M parameters for the base model (37k shared vocabulary)."""
    with torch.device("meta"):
        from workbench import Transformer

        model = Transformer(presets.base())
    assert 60e6 < model.num_parameters() < 66e6


def test_per_stack_heads_and_ffn_widths_shape_the_modules_and_the_trace():
    cfg = presets.tiny(vocab=50, enc_heads=2, dec_heads=8, enc_d_ff=48, dec_d_ff=80)
    model = make_model(cfg)
    assert model.enc[0].self_attn.n_heads == 2 and model.enc[1].ffn.up_proj.out_features == 48
    assert model.dec[0].self_attn.n_heads == 8 and model.dec[1].cross_attn.n_heads == 8
    assert model.dec[0].ffn.down_proj.in_features == 80
    src, tgt = make_batch(cfg, batch=3, tgt_len=6, pad=True)
    _, trace = model.run_with_cache(src, tgt)
    assert trace.attention("enc_self", 0).shape[1] == 2
    assert trace.attention("dec_self", 1).shape[1] == 8 and trace.attention("cross", 0).shape[1] == 8
    _assert_incremental_equals_full(model, src, tgt)


def test_forward_without_projection_is_the_decoder_output_the_logits_come_from():
    cfg = presets.tiny(vocab=50, output_bias=True)
    model = make_model(cfg)
    src, tgt = make_batch(cfg, batch=3, tgt_len=6, pad=True)
    hidden = model(src, tgt, project=False)
    logits, trace = model.run_with_cache(src, tgt, names="hook_dec_out")
    torch.testing.assert_close(hidden, trace["hook_dec_out"])
    torch.testing.assert_close(model.output_proj(hidden), logits)


class _SoftmaxCount(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the attention-probability entries a forward computes: elements that go through a softmax."""

    def __init__(self):
        super().__init__()
        self.entries = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten._softmax, torch.ops.aten.softmax):
            self.entries += args[0].numel()
        return func(*args, **(kwargs or {}))


def _softmax_entries(run) -> int:
    with torch.inference_mode(), _SoftmaxCount() as counter:
        run()
    return counter.entries


def test_capturing_chosen_heads_computes_only_their_probabilities():
    """Work in proportion to the heads asked for: one head of one block costs B·Lq·Lk softmax entries, all heads
    the sum over blocks of B·H·Lq·Lk, the plain forward none (fused kernels)."""
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    (b, s), t, h = src.shape, tgt.size(1), cfg.n_heads
    per_head = {"enc_self": b * s * s, "dec_self": b * t * t, "cross": b * t * s}
    every = sum(per_head[kind] * h * 2 for kind in per_head)  # 2 layers of each kind
    assert _softmax_entries(lambda: model(src, tgt)) == 0
    assert _softmax_entries(lambda: model.run_with_cache(src, tgt)) == every
    assert _softmax_entries(lambda: model.run_with_cache(src, tgt, heads=["dec_self:1:2"])) == per_head["dec_self"]
    chosen = ["cross:0:1", "cross:0:3", "enc_self:1:0"]
    assert _softmax_entries(lambda: model.run_with_cache(src, tgt, heads=chosen)) == \
        2 * per_head["cross"] + per_head["enc_self"]


def test_chosen_heads_match_the_full_capture_and_leave_the_logits_alone():
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    with torch.inference_mode():
        plain = model(src, tgt)
        _, full = model.run_with_cache(src, tgt)
        logits, some = model.run_with_cache(src, tgt, heads=["cross:1:3", "cross:1:0", ("enc_self", 0, 2)])
    assert torch.equal(logits, plain)  # the blocks ran fused: capturing chose no other path
    assert some.meta["heads"] == {"enc.0.self_attn.hook_probs": [2], "dec.1.cross_attn.hook_probs": [0, 3]}
    assert some["dec.1.cross_attn.hook_probs"].shape == (src.size(0), 2, tgt.size(1), src.size(1))
    for kind, layer, head in [("cross", 1, 3), ("cross", 1, 0), ("enc_self", 0, 2)]:
        # upstream blocks ran fused here and explicitly in the full capture: equal to float rounding
        torch.testing.assert_close(some.attention(kind, layer, head), full.attention(kind, layer, head),
                                   rtol=0, atol=1e-6)


def test_chosen_heads_are_checked_and_read_only():
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    with pytest.raises(ValueError, match="does not exist"):
        model.run_with_cache(src, tgt, heads=["cross:1:4"])
    with pytest.raises(ValueError, match="not both"):
        model.run_with_cache(src, tgt, names="*.hook_q", heads=["cross:1:0"])
    with pytest.raises(ValueError, match="detach=False"):
        model.run_with_cache(src, tgt, heads=["cross:1:0"], detach=False)


def test_the_training_forward_compiles_as_one_graph(tiny_config):
    """`torch.compile` sees the whole training forward (dropout on, no hooks) without a graph break: the trainer's
    `compile = true` on a GPU depends on it. The input check's range read and the CPU dropout's `random_` each broke
    it (18 breaks) and now step aside while compiling. backend="eager": the tracing is what is tested."""
    torch._dynamo.reset()
    model = make_model(tiny_config).train()
    src, tgt = make_batch(tiny_config, batch=4, src_len=9, tgt_len=7)
    logits = torch.compile(model, fullgraph=True, backend="eager")(src, tgt)  # fullgraph: any break raises
    assert logits.shape == (4, 7, tiny_config.tgt_vocab)
    torch._dynamo.reset()

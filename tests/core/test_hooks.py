"""Hook points: documented names, scoping to a block/thread, edits, no leaks after exceptions."""

import threading

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.core import hooks as hooks_module

ATTN = ["hook_q_input", "hook_k_input", "hook_v_input",
        "hook_q", "hook_k", "hook_v", "hook_scores", "hook_probs", "hook_context", "hook_result", "hook_out"]
NORM = ["hook_in", "hook_scale"]  # on every layer norm: {module path}.hook_in / .hook_scale


def documented_names(enc_layers: int, dec_layers: int) -> set[str]:
    """The scheme in the README's table, written out independently of the code."""
    names = {"hook_src_tok", "hook_src_pos", "hook_src_embed", "hook_memory",
             "hook_tgt_tok", "hook_tgt_pos", "hook_tgt_embed", "hook_dec_out", "hook_logits"}
    for i in range(enc_layers):
        names |= {f"enc.{i}.self_attn.{a}" for a in ATTN}
        names |= {f"enc.{i}.ffn.hook_in", f"enc.{i}.ffn.hook_pre", f"enc.{i}.ffn.hook_hidden", f"enc.{i}.ffn.hook_out"}
        names |= {f"enc.{i}.hook_{r}" for r in
                  ("resid_in", "norm_self_attn", "resid_self_attn", "norm_ffn", "resid_ffn")}
        names |= {f"enc.{i}.{norm}.{n}" for norm in ("self_attn_norm", "ffn_norm") for n in NORM}
    for j in range(dec_layers):
        names |= {f"dec.{j}.{block}.{a}" for block in ("self_attn", "cross_attn") for a in ATTN}
        names |= {f"dec.{j}.ffn.hook_in", f"dec.{j}.ffn.hook_pre", f"dec.{j}.ffn.hook_hidden", f"dec.{j}.ffn.hook_out"}
        names |= {f"dec.{j}.hook_{r}" for r in ("resid_in", "norm_self_attn", "resid_self_attn", "norm_cross_attn",
                                                "resid_cross_attn", "norm_ffn", "resid_ffn")}
        names |= {f"dec.{j}.{norm}.{n}" for norm in ("self_attn_norm", "cross_attn_norm", "ffn_norm") for n in NORM}
    return names


def test_names_are_the_documented_set_for_unequal_depths():
    model = make_model(presets.tiny(vocab=50, enc_layers=3, dec_layers=1))
    assert set(model.hook_names()) == documented_names(3, 1)
    assert all(model.hook_points[n].name == n for n in model.hook_names())


def test_glob_list_and_predicate_filters():
    model = make_model(presets.tiny(vocab=50))
    cross = ["dec.0.cross_attn.hook_probs", "dec.1.cross_attn.hook_probs"]
    assert model.hook_names("dec.*.cross_attn.hook_probs") == cross
    ffn = {f"enc.1.ffn.{n}" for n in ("hook_in", "hook_pre", "hook_hidden", "hook_out")}
    assert set(model.hook_names(["hook_logits", "enc.1.ffn.*"])) == {"hook_logits", *ffn}
    assert len(model.hook_names(lambda n: n.endswith("hook_probs"))) == 2 + 2 * 2


def test_unknown_name_suggests_close_ones():
    model = make_model(presets.tiny(vocab=50))
    with pytest.raises(KeyError, match="enc.0.self_attn.hook_probs"):
        model.hook_names("enc.0.self_attn.hook_prob")
    with pytest.raises(KeyError):
        with model.hooks({"dec.7.*": lambda x, h: None}):
            pass


def test_edit_hook_changes_logits_and_only_inside_the_block(tiny_model, tiny_config):
    src, tgt = make_batch(tiny_config)
    before = tiny_model(src, tgt)
    with tiny_model.hooks({"dec.1.hook_resid_ffn": lambda x, h: torch.zeros_like(x)}):
        edited = tiny_model(src, tgt)
    after = tiny_model(src, tgt)
    assert not torch.allclose(before, edited)
    torch.testing.assert_close(before, after)


def test_hooks_are_gone_after_an_exception(tiny_model, tiny_config):
    src, tgt = make_batch(tiny_config)
    seen = []

    def boom(x, hook):
        seen.append(hook.name)
        raise RuntimeError("inside the traced forward")

    with pytest.raises(RuntimeError, match="inside the traced forward"):
        with tiny_model.capture("*"):
            with tiny_model.hooks({"enc.1.ffn.hook_out": boom}):
                tiny_model(src, tgt)
    assert seen == ["enc.1.ffn.hook_out"]
    assert hooks_module.active_hook_count() == 0 and hooks_module._ACTIVE_COUNT == 0
    tiny_model(src, tgt)  # no hook fires any more
    assert seen == ["enc.1.ffn.hook_out"]


def test_hook_must_return_tensor_of_same_shape(tiny_model, tiny_config):
    src, tgt = make_batch(tiny_config)
    with pytest.raises(ValueError, match="hook on hook_memory must return None or a tensor of shape"):
        with tiny_model.hooks({"hook_memory": lambda x, h: x[:, :1]}):
            tiny_model(src, tgt)


def test_nested_contexts_compose_in_order(tiny_model, tiny_config):
    src, tgt = make_batch(tiny_config)
    order = []
    with tiny_model.hooks({"hook_logits": lambda x, h: order.append("outer")}):
        with tiny_model.hooks({"hook_logits": lambda x, h: order.append("inner")}):
            tiny_model(src, tgt)
        tiny_model(src, tgt)
    assert order == ["outer", "inner", "outer"]


def test_threads_do_not_see_each_others_hooks(tiny_model, tiny_config):
    """One model shared by many sessions: an ablation in one thread never reaches another."""
    src, tgt = make_batch(tiny_config)
    clean = tiny_model(src, tgt)
    barrier = threading.Barrier(2)
    results = {}

    def edited():
        with tiny_model.hooks({"hook_memory": lambda x, h: torch.zeros_like(x)}):
            barrier.wait()
            results["edited"] = tiny_model(src, tgt)
            barrier.wait()

    def plain():
        barrier.wait()  # runs while the other thread's hooks are active
        results["plain"] = tiny_model(src, tgt)
        barrier.wait()

    threads = [threading.Thread(target=edited), threading.Thread(target=plain)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.testing.assert_close(results["plain"], clean)
    assert not torch.allclose(results["edited"], clean)


def test_a_trace_changes_neither_outputs_nor_gradients(tiny_config):
    model = make_model(presets.tiny(vocab=50, dropout=0.0)).train()
    src, tgt = make_batch(tiny_config)
    plain = model(src, tgt)
    plain.logsumexp(-1).mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    traced, trace = model.run_with_cache(src, tgt, names="*")
    traced.logsumexp(-1).mean().backward()
    torch.testing.assert_close(traced, plain, rtol=1e-5, atol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6, msg=n)
    assert len(trace) == len(model.hook_names()) and not any(t.requires_grad for t in trace.values())


@pytest.mark.slow
def test_torch_compile_full_graph_without_hooks_and_correct_with_them(tiny_config):
    """The no-hook path compiles as one graph; with hooks active the compiled model falls back to
    eager hook calls (graph breaks) and gives the same edited result."""
    model = make_model(tiny_config)
    model.check_inputs = False
    src, tgt = make_batch(tiny_config)
    torch._dynamo.reset()
    # backend="eager": what is tested is dynamo's capture (one graph, or breaks at active hooks);
    # inductor's code generation would only add minutes of compile time on CI's CPUs
    full = torch.compile(model, fullgraph=True, backend="eager")
    torch.testing.assert_close(full(src, tgt), model(src, tgt), rtol=1e-5, atol=1e-5)
    compiled = torch.compile(model, backend="eager")
    compiled(src, tgt)
    edit = {"enc.0.self_attn.hook_context": lambda x, h: x * 0, "dec.1.cross_attn.hook_probs": lambda x, h: None}
    with model.hooks(edit):
        expected = model(src, tgt)
        got = compiled(src, tgt)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(expected, model(src, tgt))


def test_hook_returning_another_dtype_is_named(tiny_model, tiny_config):
    src, tgt = make_batch(tiny_config)

    def to_double(x, hook):
        return x.double()

    with pytest.raises(ValueError, match=r"hook 'to_double' on enc.0.hook_resid_in returned a torch.float64 tensor "
                                         r"on cpu, but the activation is torch.float32 on cpu"):
        with tiny_model.hooks({"enc.0.hook_resid_in": to_double}):
            tiny_model(src, tgt)


def test_hook_returning_another_device_is_named(tiny_model, tiny_config):
    src, tgt = make_batch(tiny_config)
    with pytest.raises(ValueError, match=r"on hook_memory returned a torch.float32 tensor on meta"):
        with tiny_model.hooks({"hook_memory": lambda x, h: torch.empty_like(x, device="meta")}):
            tiny_model(src, tgt)


def test_thread_pool_jobs_carry_the_hooks_they_were_submitted_under(tiny_model, tiny_config):
    from concurrent.futures import ThreadPoolExecutor

    src, tgt = make_batch(tiny_config)
    with torch.no_grad():
        clean = tiny_model(src, tgt)
        with tiny_model.hooks({"hook_memory": lambda x, h: torch.zeros_like(x)}):
            edited = tiny_model(src, tgt)
    assert not torch.equal(clean, edited)
    gate = threading.Event()

    def job():
        gate.wait(timeout=30)  # runs after the with-block below has ended
        with torch.no_grad():
            return tiny_model(src, tgt)

    with ThreadPoolExecutor(max_workers=2) as pool:
        with tiny_model.hooks({"hook_memory": lambda x, h: torch.zeros_like(x)}):
            plain = pool.submit(job)  # a bare submit: the worker thread has no hooks
            carried = hooks_module.submit(pool, job)
        gate.set()
        torch.testing.assert_close(plain.result(), clean, rtol=0, atol=0)
        torch.testing.assert_close(carried.result(), edited, rtol=0, atol=0)
    assert hooks_module._ACTIVE_COUNT == 0
    with torch.no_grad():  # and nothing leaked into this thread
        torch.testing.assert_close(tiny_model(src, tgt), clean, rtol=0, atol=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_post_norm_norm_and_resid_hooks_hold_the_same_tensor(tiny_config, norm_first):
    # as the layers' docstrings say: post-norm normalises after the add, so the two names coincide
    import dataclasses

    cfg = dataclasses.replace(tiny_config, norm_first=norm_first)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    _, trace = model.run_with_cache(src, tgt, names=["*.hook_norm_*", "*.hook_resid_*"])
    pairs = [(n, n.replace("hook_norm_", "hook_resid_")) for n in trace if ".hook_norm_" in n]
    assert len(pairs) == 2 * cfg.enc_layers + 3 * cfg.dec_layers
    same = [torch.equal(trace[a], trace[b]) for a, b in pairs]
    assert all(same) if not norm_first else not any(same)


def test_wanted_heads_is_the_union_of_marked_listeners_and_none_for_any_other(tiny_model, tiny_config):
    point = tiny_model.enc[0].self_attn.hook_probs
    seen = []
    assert point.wanted_heads() == ()
    with tiny_model.hooks({point.name: [hooks_module.reads_heads(lambda x, h: seen.append(x.shape), [3]),
                                        hooks_module.reads_heads(lambda x, h: None, [1, 3])]}):
        assert point.wanted_heads() == (1, 3)
        tiny_model(*make_batch(tiny_config))
        with tiny_model.hooks({point.name: lambda x, h: None}):
            assert point.wanted_heads() is None  # an unmarked listener reads (and may edit) every head
    assert seen == [torch.Size([3, 2, 7, 7])]
    handle = point.register_forward_hook(lambda m, i, o: None)
    try:
        assert point.wanted_heads() is None
    finally:
        handle.remove()


def test_a_head_reading_hook_that_returns_a_tensor_is_refused(tiny_model, tiny_config):
    point = tiny_model.enc[0].self_attn.hook_probs
    with tiny_model.hooks({point.name: hooks_module.reads_heads(lambda x, h: x * 0, [0])}):
        with pytest.raises(ValueError, match="read them"):
            tiny_model(*make_batch(tiny_config))

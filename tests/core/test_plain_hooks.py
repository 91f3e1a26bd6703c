"""Plain PyTorch hooks and nnsight on the workbench model: every hook point and every projection fires,
reads what the workbench's own hooks read and edits as they edit; the fused path stays when nothing listens."""

from __future__ import annotations

import pytest
import torch
from model_helpers import make_batch, make_model
from torch.nn.modules.module import register_module_forward_hook

from workbench import presets
from workbench.core.attention import MultiHeadAttention
from workbench.core.hooks import HookPoint


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def model_and_batch(request):
    cfg = presets.tiny(vocab=50, norm_first=request.param)
    return make_model(cfg), *make_batch(cfg)


def _projections(model):
    return [(name, m) for name, m in model.named_modules()
            if name.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj", "out_proj")]


def test_forward_hook_fires_on_every_hook_point_with_the_cached_value(model_and_batch):
    model, src, tgt = model_and_batch
    _, trace = model.run_with_cache(src, tgt, names="*")
    seen: dict[str, torch.Tensor] = {}
    handles = [point.register_forward_hook(lambda mod, args, out: seen.setdefault(mod.name, out.detach()))
               for point in model.hook_points.values()]
    try:
        with torch.no_grad():
            model(src, tgt)
    finally:
        for h in handles:
            h.remove()
    assert set(seen) == set(model.hook_names())  # all of them (213 on a pre-norm 6+6 model), not 2 of 12
    for name, value in seen.items():
        torch.testing.assert_close(value, trace[name], atol=2e-6, rtol=1e-5, msg=name)


def test_forward_hook_fires_on_every_projection_and_sees_the_hooked_q_k_v(model_and_batch):
    model, src, tgt = model_and_batch
    _, trace = model.run_with_cache(src, tgt, names=["*.hook_q", "*.hook_k", "*.hook_v"])
    seen: dict[str, torch.Tensor] = {}
    handles = [m.register_forward_hook(lambda mod, args, out, name=name: seen.setdefault(name, out.detach()))
               for name, m in _projections(model)]
    try:
        with torch.no_grad():
            model(src, tgt)
    finally:
        for h in handles:
            h.remove()
    assert set(seen) == {name for name, _ in _projections(model)}
    for name, out in seen.items():
        block, proj = name.rsplit(".", 1)
        if proj == "out_proj":
            continue
        heads = model.get_submodule(block).n_heads
        split = out.view(out.size(0), out.size(1), heads, -1).transpose(1, 2)
        torch.testing.assert_close(split, trace[f"{block}.hook_{proj[0]}"], atol=2e-6, rtol=1e-5, msg=name)


def test_editing_through_a_projection_hook_equals_the_workbench_hook(model_and_batch):
    model, src, tgt = model_and_batch
    with torch.no_grad():
        clean = model(src, tgt)
        with model.hooks({"enc.0.self_attn.hook_q": lambda x, h: torch.zeros_like(x),
                          "dec.1.cross_attn.hook_v": lambda x, h: x * 2}):
            expected = model(src, tgt)
        handles = [model.enc[0].self_attn.q_proj.register_forward_hook(lambda m, a, out: torch.zeros_like(out)),
                   model.dec[1].cross_attn.v_proj.register_forward_hook(lambda m, a, out: out * 2)]
        try:
            edited = model(src, tgt)
        finally:
            for h in handles:
                h.remove()
        after = model(src, tgt)
    assert (expected - clean).abs().max() > 1e-2  # the edit matters
    torch.testing.assert_close(edited, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after, clean)  # removed: nothing stays behind


def test_pre_hook_edit_on_a_hook_point_equals_the_workbench_hook(model_and_batch):
    model, src, tgt = model_and_batch
    name = "dec.0.cross_attn.hook_probs"
    uniform = lambda x: torch.full_like(x, 1.0 / x.size(-1))  # noqa: E731
    with torch.no_grad():
        with model.hooks({name: lambda x, h: uniform(x)}):
            expected = model(src, tgt)
        handle = model.get_submodule(name).register_forward_pre_hook(lambda m, args: (uniform(args[0]),))
        try:
            edited = model(src, tgt)
        finally:
            handle.remove()
    torch.testing.assert_close(edited, expected)
    assert (expected - model(src, tgt)).abs().max() > 1e-3


def test_global_module_hooks_reach_hook_points():
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    names: list[str] = []
    handle = register_module_forward_hook(
        lambda m, a, out: names.append(m.name) if isinstance(m, HookPoint) else None)
    try:
        with torch.no_grad():
            model(src, tgt)
    finally:
        handle.remove()
    # every hook point but the per-head query/key/value inputs, which are computed only when asked for at the
    # point itself (`HookPoint.asked`): a process-wide hook watches every module and does not ask for them
    per_head = set(model.hook_names("*.hook_[qkv]_input"))
    assert set(names) == set(model.hook_names()) - per_head and per_head
    asked = model.enc[0].self_attn.hook_v_input.register_forward_hook(lambda m, a, out: None)
    handle = register_module_forward_hook(
        lambda m, a, out: names.append(m.name) if isinstance(m, HookPoint) else None)
    try:
        names.clear()
        with torch.no_grad():
            model(src, tgt)
    finally:
        handle.remove()
        asked.remove()
    assert {n for n in names if n.startswith("enc.0.self_attn.hook_")} >= {f"enc.0.self_attn.hook_{p}_input"
                                                                            for p in "qkv"}


def test_the_fused_path_stays_when_no_plain_hook_listens(monkeypatch):
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    calls = {"explicit": 0}
    original = MultiHeadAttention._explicit

    def counting(self, *args):
        calls["explicit"] += 1
        return original(self, *args)

    monkeypatch.setattr(MultiHeadAttention, "_explicit", counting)
    with torch.no_grad():
        model(src, tgt)
        assert calls["explicit"] == 0  # SDPA everywhere
        handle = model.dec[0].self_attn.hook_probs.register_forward_hook(lambda m, a, out: None)
        model(src, tgt)
        assert calls["explicit"] == 1  # only the watched block computes its probabilities
        handle.remove()
        model(src, tgt)
    assert calls["explicit"] == 1


def test_nnsight_reads_and_edits_a_projection_and_a_hook_point_as_the_workbench_does():
    import nnsight  # the dev extra installs it
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    q_name, p_name = "enc.0.self_attn.hook_q", "dec.1.cross_attn.hook_probs"
    with torch.no_grad():
        clean, trace = model.run_with_cache(src, tgt, names=[q_name, p_name])
        with model.hooks({q_name: lambda x, h: x * 0.5, p_name: lambda x, h: torch.full_like(x, 1 / x.size(-1))}):
            expected = model(src, tgt)
    wrapped = nnsight.NNsight(model)
    with torch.no_grad():
        with wrapped.trace(src, tgt):
            q = wrapped.enc[0].self_attn.q_proj.output.save()
            probs = wrapped.dec[1].cross_attn.hook_probs.output.save()
            logits = wrapped.output.save()
        with wrapped.trace(src, tgt):
            wrapped.enc[0].self_attn.q_proj.output[:] *= 0.5
            wrapped.dec[1].cross_attn.hook_probs.output[:] = 1 / src.size(1)
            edited = wrapped.output.save()
    heads = model.enc[0].self_attn.n_heads
    torch.testing.assert_close(q.view(*q.shape[:2], heads, -1).transpose(1, 2), trace[q_name])
    torch.testing.assert_close(probs, trace[p_name])
    torch.testing.assert_close(logits, clean, atol=1e-5, rtol=1e-5)
    assert (expected - clean).abs().max() > 1e-2
    torch.testing.assert_close(edited, expected, atol=1e-5, rtol=1e-5)

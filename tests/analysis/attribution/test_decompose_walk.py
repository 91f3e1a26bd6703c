"""The residual decomposition, per-key source attribution and ALTI+'s linearised blocks walk the layers' own
`compose` (issue 36 point 1: `decompose.walk`, norms frozen by hooks). They give the numbers the event walk they
replaced gave: that walk is kept below as the reference (each norm applied to every part so far with
`LayerNorm.linear`, pre- and post-norm told apart by `Sublayer.norm_on_stream`), and the two agree to float64
rounding on every norm placement: pre-norm, post-norm, final norms, an embedding norm, a decoder that starts with
the padding id."""

from __future__ import annotations

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.analysis.attribution.alti import alti, alti_hooks, block_terms
from workbench.analysis.attribution.decompose import (
    _capture_names,
    _events,
    decompose_resid,
    logit_direction,
    source_attribution,
    stream_components,
)
from workbench.core.heads import Head, stack_of
from workbench.core.hooks import path_of

CONFIGS = {
    "pre_norm": dict(norm_first=True),
    "post_norm": dict(norm_first=False),
    "post_norm_final_norms": dict(norm_first=False, enc_final_norm=True, dec_final_norm=True),
    "pre_norm_emb_norm_output_bias": dict(norm_first=True, emb_norm=True, output_bias=True),
    "post_norm_emb_norm_pad_start": dict(norm_first=False, emb_norm=True, decoder_start_id=0),
}


@pytest.fixture(params=sorted(CONFIGS), scope="module")
def model(request):
    model = make_model(presets.tiny(vocab=50, **CONFIGS[request.param]), seed=3)
    with torch.no_grad():  # non-trivial norm weights and biases, so every norm's part is tested
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.3)
    return model


# ------------------------------------------------------------------------------- the walks this change replaced


def _linear(x, norm, scale):
    return norm.linear(x.double(), scale.double())


def reference_components(model, trace, stack, layers, split_heads=True, before=None):
    """The event walk `stream_components` was until issue 36: every part so far through each norm, in event order."""
    shape = trace[model.stream(stack).hook_tok.name].shape
    labels, parts = [], []
    events = _events(model, stack, layers, trace)
    if before is not None:
        events = events[: next(n for n, ev in enumerate(events) if ev[0] == "write" and ev[1] == before)]
    for ev in events:
        if ev[0] == "norm":
            _, path, norm, scale = ev
            parts = [_linear(p, norm, scale) for p in parts]
            labels.append(f"{path}.bias")
            parts.append(norm.bias.detach().double().expand(shape))
            continue
        _, label, inf, x = ev
        if inf["head_index"] == "*":
            if split_heads:
                labels += [str(Head(inf["kind"], inf["layer"], h)) for h in range(x.size(1))]
                parts += [x[:, h].double() for h in range(x.size(1))]
            else:
                labels.append(f"{label}.heads")
                parts.append(x.double().sum(1))
        else:
            labels.append(label)
            parts.append(x.double().expand(shape))
    return labels, torch.stack(parts)


def reference_source_attribution(model, src, tgt, position, token, kind):
    block = "cross_attn" if kind == "cross" else "self_attn"
    attns = [getattr(layer, block) for layer in model.dec]
    names = _capture_names(model, "dec", len(model.dec)) + [p.name for a in attns for p in (a.hook_probs, a.hook_v)]
    _, trace = model.run_with_cache(src, tgt, names=names)
    events = _events(model, "dec", len(model.dec), trace)
    direction, _ = logit_direction(model, token)
    out = []
    for attn in attns:
        probs = trace[attn.hook_probs.name][0, :, position].double()
        v = trace[attn.hook_v.name][0].double()
        per_key = probs[..., None] * torch.einsum("hkd,hde->hke", v, attn.head_weights().detach().double())
        start = next(n for n, ev in enumerate(events) if ev[0] == "write" and ev[1] == path_of(attn))
        for ev in events[start + 1:]:
            if ev[0] == "norm":
                per_key = _linear(per_key, ev[2], ev[3][0, position])
        out.append(per_key @ direction)
    return torch.stack(out)


def reference_block_terms(model, trace, kind, layer):
    """ALTI's block, linearised by hand as `alti.block_terms` did: (per_key, per_head, residual, bias), float64."""
    sub = model.stream(stack_of(kind)).layers[layer].sublayer("cross_attn" if kind == "cross" else "self_attn")
    probs = trace[sub.block.hook_probs.name].double()
    f = torch.einsum("bhkd,hde->bhke", trace[sub.block.hook_v.name].double(),
                     sub.block.head_weights().detach().double())
    x = trace[sub.hook_resid_before.name].double()
    b_o = sub.block.out_proj.bias.detach().double()
    if not sub.norm_on_stream:
        inv, residual, bias = torch.ones_like(x[..., :1]), x, b_o.expand_as(x)
    else:
        sigma = trace[sub.norm.hook_scale.name].double()
        unit = torch.ones((), dtype=torch.float64)
        f, inv = _linear(f, sub.norm, unit), 1.0 / sigma
        residual = _linear(x, sub.norm, unit) / sigma
        bias = _linear(b_o, sub.norm, unit) / sigma + sub.norm.bias.detach().double()
    per_head = probs[..., None] * f[:, :, None] * inv[:, None, :, :, None]
    return per_head.sum(1), per_head, residual, bias


# ------------------------------------------------------------------------------------------------------- the tests


def _check_components(model, trace, stack, layers, **kw):
    labels, _, values = stream_components(model, trace, stack, layers, **kw)
    want_labels, want = reference_components(model, trace, stack, layers, **kw)
    assert labels == want_labels
    torch.testing.assert_close(values, want, rtol=0, atol=1e-12)
    return values


@pytest.mark.parametrize("stack", ["enc", "dec"])
def test_the_components_are_the_event_walk_s_on_every_norm_placement(model, stack):
    src, tgt = make_batch(model.cfg)  # padded, a batch of three
    depth = len(model.stream(stack).layers)
    _, trace = model.run_with_cache(src, tgt, names=[*_capture_names(model, stack, depth), "hook_dec_out"])
    for layers in range(1, depth + 1):
        for split_heads in (True, False):
            values = _check_components(model, trace, stack, layers, split_heads=split_heads)
    if stack == "dec":  # the whole stack: the parts sum to what the output layer reads
        torch.testing.assert_close(values.sum(0).float(), trace["hook_dec_out"], rtol=1e-5, atol=2e-5)
    for _, sub in model.stream(stack).sublayers():  # stopped where a block would write (score split, QK)
        _check_components(model, trace, stack, depth, before=path_of(sub.block))
    comps = decompose_resid(model, src, tgt, stack=stack, layer=0)
    _, want = reference_components(model, trace, stack, 1)
    torch.testing.assert_close(comps.values, want, rtol=0, atol=1e-12)


def test_source_attribution_is_the_event_walk_s(model):
    src, tgt = make_batch(model.cfg, batch=1, pad=False)
    for kind in ("cross", "dec_self"):
        for position in (0, tgt.size(1) - 1):
            got = source_attribution(model, src, tgt, position=position, token=7, kind=kind)
            torch.testing.assert_close(got, reference_source_attribution(model, src, tgt, position, 7, kind),
                                       rtol=0, atol=1e-12)


def test_alti_blocks_are_the_hand_linearised_ones(model):
    src, tgt = make_batch(model.cfg)
    _, trace = model.run_with_cache(src, tgt, names=alti_hooks(model))
    for kind, depth in (("enc_self", len(model.enc)), ("dec_self", len(model.dec)), ("cross", len(model.dec))):
        for layer in range(depth):
            t = block_terms(model, trace, kind, layer, dtype=torch.float64)
            for got, want in zip((t.per_key(), t.per_head(), t.residual, t.bias),
                                 reference_block_terms(model, trace, kind, layer)):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
            torch.testing.assert_close(t.per_key().sum(2) + t.residual + t.bias, t.output.double(),
                                       rtol=0, atol=1e-5)
    a = alti(model, src, tgt, dtype=torch.float64)
    rows = a.source.sum(-1) + a.target.sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows), rtol=0, atol=1e-12)

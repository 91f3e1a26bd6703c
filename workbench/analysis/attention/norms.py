"""Value-weighted attention norms (Kobayashi et al. 2020, "Attention is Not Only a Weight"):
‖α_ij · f(x_j)‖, where f(x_j) = W_O^h (W_V^h x_j + b_V^h) is what key j would write through head h.

    logits, trace = model.run_with_cache(src, tgt, names=NORM_HOOKS)
    n = value_norms(model, trace, "cross", 1)      # .per_head (B, H, Lq, Lk), .combined (B, Lq, Lk)

A weight on a token whose transformed value is small moves little; these norms show what attention
actually moves. `combined` is ‖Σ_h α_hij f_h(x_j)‖, the whole layer's vector from key j to query i.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.heads import AttentionKind, block_path, check_kind
from ...core.trace import Trace

NORM_HOOKS = ["*.hook_probs", "*.hook_v"]


@dataclass(frozen=True)
class ValueNorms:
    per_head: torch.Tensor  # (B, H, Lq, Lk): α_hij ‖f_h(x_j)‖
    combined: torch.Tensor  # (B, Lq, Lk): ‖Σ_h α_hij f_h(x_j)‖
    value_norm: torch.Tensor  # (B, H, Lk): ‖f_h(x_j)‖ alone


def _block(model, kind: AttentionKind, layer: int):
    check_kind(kind)
    stack = model.enc if kind == "enc_self" else model.dec
    if not 0 <= layer < len(stack):
        raise IndexError(f"layer {layer} out of range: the model has {len(stack)} {kind} layers")
    return model.get_submodule(block_path(kind, layer))


@torch.no_grad()
def value_norms(model, trace: Trace, kind: AttentionKind, layer: int) -> ValueNorms:
    """Norms for one block; the trace needs that block's hook_probs and hook_v (see NORM_HOOKS)."""
    attn = _block(model, kind, layer)
    probs = trace[attn.hook_probs.name].to(torch.float64)  # (B, H, Lq, Lk)
    v = trace[attn.hook_v.name].to(torch.float64)  # (B, H, Lk, Dh)
    h, dh = attn.n_heads, attn.d_head
    w_o = attn.out_proj.weight.detach().to(device=v.device, dtype=torch.float64)  # (D, H·Dh)
    w_o = w_o.view(w_o.size(0), h, dh).permute(1, 2, 0)  # (H, Dh, D)
    f = torch.einsum("bhkd,hde->bhke", v, w_o)  # (B, H, Lk, D): each head's output vector per key
    f_norm = f.norm(dim=-1)  # (B, H, Lk)
    per_head = probs * f_norm[:, :, None, :]
    combined = torch.einsum("bhqk,bhke->bqke", probs, f).norm(dim=-1)
    return ValueNorms(per_head, combined, f_norm)


def layer_output_from_norm_terms(model, trace: Trace, kind: AttentionKind, layer: int) -> torch.Tensor:
    """Σ_h Σ_j α_hij f_h(x_j) + b_O: the block's output rebuilt from the terms the norms measure
    (equals hook_out; the tests use it to check the decomposition)."""
    attn = _block(model, kind, layer)
    probs = trace[attn.hook_probs.name].to(torch.float64)
    v = trace[attn.hook_v.name].to(torch.float64)
    w_o = attn.out_proj.weight.detach().to(torch.float64)
    w_o = w_o.view(w_o.size(0), attn.n_heads, attn.d_head).permute(1, 2, 0)
    out = torch.einsum("bhqk,bhkd,hde->bqe", probs, v, w_o)
    if attn.out_proj.bias is not None:
        out = out + attn.out_proj.bias.detach().to(torch.float64)
    return out

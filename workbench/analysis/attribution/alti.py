"""ALTI+ (Ferrando et al. 2022): how much each input token contributes to each position, through the whole
encoder-decoder, and so how much an output token draws on the source rather than the target prefix.

    a = alti(model, src, tgt_in)          # tgt_in = [start, y_1, ..., y_n]
    a.source_share                        # (B, T): share of position t's state that comes from the source
    a.source, a.target                    # (B, T, S), (B, T, T): per source token / per target-prefix token
    a.enc, a.dec_self, a.cross            # per-layer block contributions (rows sum to 1)

One attention block writes y_i = N(x_i + Σ_h Σ_j α^h_ij W_O^h v^h_j + b_O) (post-norm; pre-norm has no N).
With the norm's scale σ_i frozen, N is affine, so y_i = Σ_j T_ij(x_j) + R_i + bias terms, where T_ij is what
key j writes through every head and R_i the residual (ALTI adds it to the diagonal in self-attention and keeps
it as an extra column, "the decoder stream", in cross-attention). Each term's contribution is
max(0, ‖y_i‖₁ - ‖y_i - T_ij‖₁) (ALTI's Manhattan-distance measure), normalised over the terms of the row
("min_sum"). The block contributions are rolled out as the ALTI+ repository does
(mt-upc/transformer-contributions-nmt, `get_contribution_rollout`): encoder layers multiply; in each
decoder layer the cross-attention row splits into source tokens (through the encoder rollout) and the
residual share, which is spread over the target prefix by that layer's self-attention contributions,
applied to the previous layer's rollout. Feed-forward layers act on each position alone and are taken
to keep the proportions, as ALTI does. Every row of [source | target] sums to 1 (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.heads import stack_of
from ...core.replacement import ReplacementModel
from .decompose import walk


@dataclass(frozen=True)
class BlockTerms:
    """One attention block, linearised: y_i = Σ_j Σ_h α^h_ij g^h_j / σ_i + residual_i + bias_i, held factorised
    (the (B, H, Lq, Lk, D) terms are built only when asked for)."""

    probs: torch.Tensor  # (B, H, Lq, Lk)
    values: torch.Tensor  # (B, H, Lk, D): g^h_j, what key j writes through head h (norm's linear part applied)
    inv_scale: torch.Tensor  # (B, Lq, 1): 1/σ_i of the norm after the block (ones for pre-norm)
    residual: torch.Tensor  # (B, Lq, D): the residual input as the block's output sees it
    bias: torch.Tensor  # (B, Lq, D): the output-projection bias and the norm's shift
    output: torch.Tensor  # (B, Lq, D): the block's real output (the hook), which the terms sum to

    def per_head(self) -> torch.Tensor:
        """(B, H, Lq, Lk, D): what head h moves from key j to query i."""
        return self.probs[..., None] * self.values[:, :, None] * self.inv_scale[:, None, :, :, None]

    def per_key(self) -> torch.Tensor:
        """(B, Lq, Lk, D): what key j writes to query i through all heads."""
        return torch.einsum("bhqk,bhkd->bqkd", self.probs, self.values) * self.inv_scale[:, :, None]


@dataclass(frozen=True)
class Alti:
    """ALTI+ for a batch: block contributions per layer and the rollout through the whole model."""

    enc: torch.Tensor  # (Le, B, S, S): encoder self-attention contributions, residual on the diagonal
    dec_self: torch.Tensor  # (Ld, B, T, T): decoder self-attention contributions
    cross: torch.Tensor  # (Ld, B, T, S + 1): cross-attention contributions; last column = decoder stream
    enc_rollout: torch.Tensor  # (B, S, S): encoder output position i from source token j
    source: torch.Tensor  # (B, T, S): decoder output position t from source token j (all layers)
    target: torch.Tensor  # (B, T, T): decoder output position t from decoder input token k

    @property
    def source_share(self) -> torch.Tensor:
        """(B, T): the share of each decoder position that comes from the source (the rest: target prefix)."""
        return self.source.sum(-1)


def alti_hooks(model, kinds=("enc_self", "dec_self", "cross")) -> list[str]:
    """The hook names `alti` and `block_terms` read."""
    names = []
    for kind in kinds:
        stack = model.enc if kind == "enc_self" else model.dec
        for i in range(len(stack)):
            names += _block_hooks(model, kind, i).values()
    return [n for n in names if n is not None]


def _block_hooks(model, kind: str, layer: int) -> dict[str, str | None]:
    sub = model.stream(stack_of(kind)).layers[layer].sublayer("cross_attn" if kind == "cross" else "self_attn")
    return {"probs": sub.block.hook_probs.name, "v": sub.block.hook_v.name, "resid": sub.hook_resid_before.name,
            "out": sub.hook_resid.name, "scale": sub.norm.hook_scale.name if sub.norm_on_stream else None}


def block_terms(model, trace, kind: str, layer: int, *, dtype=torch.float32) -> BlockTerms:
    """Linearise one attention block from a trace holding `alti_hooks(model)`: its residual line walked through the
    layer's own `compose` (`decompose.walk`), post-norm with the norm's scale frozen at the traced value, as ALTI
    does. The norm's frozen scale divides (`LayerNorm.linear`), so what each head writes from each key is walked
    once at scale 1 (`values`) and each query's 1/σ applied after the attention weights (`inv_scale`)."""
    stack = stack_of(kind)
    sub = model.stream(stack).layers[layer].sublayer("cross_attn" if kind == "cross" else "self_attn")
    hooks = _block_hooks(model, kind, layer)
    probs = trace[hooks["probs"]].to(dtype)  # (B, H, Lq, Lk)
    v = trace[hooks["v"]].to(dtype)  # (B, H, Lk, Dh), value bias included
    x = trace[hooks["resid"]].to(dtype)  # (B, Lq, D)
    w_o = sub.block.head_weights().detach().to(device=v.device, dtype=dtype)  # (H, Dh, D)
    f = torch.einsum("bhkd,hde->bhke", v, w_o)  # (B, H, Lk, D): what key k writes through head h
    b_o = sub.block.out_proj.bias
    b_o = torch.zeros(f.size(-1), dtype=dtype, device=f.device) if b_o is None else b_o.detach().to(dtype)

    def line(scales, rows: torch.Tensor, written: torch.Tensor, bias_rows=None) -> torch.Tensor:
        """`rows` (the stream the block reads, in parts) and `written` (the block's write, in parts) at its output."""
        return walk(model, stack, scales, rows, lambda i, s: written if s is sub else None, layers=layer + 1,
                    bias_rows=bias_rows, start=sub, stop=sub.hook_resid)

    clean = {} if hooks["scale"] is None else {hooks["scale"]: trace[hooks["scale"]]}
    # the residual and the constant (the output bias and, post-norm, the norm's), each on a row of its own
    residual, bias = line(clean, torch.stack([x, torch.zeros_like(x)]),
                          torch.stack([torch.zeros_like(x), b_o.expand_as(x)]), {id(sub.norm): 1})
    B, H, Lk, D = f.shape
    unit = {name: torch.ones_like(scale[:, :1]) for name, scale in clean.items()}
    rows = f.permute(1, 2, 0, 3).reshape(H * Lk, B, 1, D)  # each (head, key) write as one row, at scale 1
    values = line(unit, torch.zeros_like(rows), rows).view(H, Lk, B, D).permute(2, 0, 1, 3)
    inv_scale = torch.ones_like(x[..., :1]) if not clean else 1.0 / clean[hooks["scale"]].to(dtype)
    return BlockTerms(probs, values, inv_scale, residual, bias, trace[hooks["out"]].to(dtype))


def contributions(terms: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """ALTI's measure: max(0, ‖y‖₁ - ‖y - t‖₁) for terms (..., Lq, K, D) of outputs (..., Lq, D) ->
    (..., Lq, K), unnormalised."""
    y = output.unsqueeze(-2)
    return (y.abs().sum(-1) - (y - terms).abs().sum(-1)).clamp(min=0)


def _normalise(c: torch.Tensor) -> torch.Tensor:
    return c / c.sum(-1, keepdim=True).clamp(min=1e-30)


def self_contributions(t: BlockTerms) -> torch.Tensor:
    """(B, L, L): a self-attention block's ALTI contributions, the residual on the diagonal; rows sum to 1."""
    terms = t.per_key()  # (B, L, L, D)
    idx = torch.arange(terms.size(1), device=terms.device)
    terms[:, idx, idx] += t.residual
    return _normalise(contributions(terms, t.output))


def cross_contributions(t: BlockTerms, *, heads: bool = False) -> torch.Tensor:
    """Cross-attention ALTI contributions (B, T, S + 1), the decoder stream (residual) last; rows sum to 1.

    heads=True: (B, H, T, S), each head's own terms α^h_ij g^h_j measured against the same output and
    normalised over that head's source tokens (a per-head map comparable with the head's weights)."""
    if heads:
        out = t.output[:, None]
        return _normalise(contributions(t.per_head(), out))
    terms = torch.cat([t.per_key(), t.residual.unsqueeze(2)], dim=2)  # (B, T, S + 1, D)
    return _normalise(contributions(terms, t.output))


@torch.no_grad()
def alti(model, src: torch.Tensor, tgt: torch.Tensor, *, trace=None, dtype=torch.float32) -> Alti:
    """ALTI+ through the whole model for a batch (src (B, S), tgt = decoder input (B, T)); pass a `trace`
    holding `alti_hooks(model)` to skip the forward pass. Padded keys get no contribution."""
    if trace is None:
        trace = ReplacementModel(model, src, tgt, freeze=(), names=alti_hooks(model)).clean
    enc = torch.stack([self_contributions(block_terms(model, trace, "enc_self", i, dtype=dtype))
                       for i in range(len(model.enc))])
    dec_self = torch.stack([self_contributions(block_terms(model, trace, "dec_self", i, dtype=dtype))
                            for i in range(len(model.dec))])
    cross = torch.stack([cross_contributions(block_terms(model, trace, "cross", i, dtype=dtype))
                         for i in range(len(model.dec))])
    roll = enc[0]
    for layer in enc[1:]:
        roll = layer @ roll
    source = target = None
    for i in range(len(model.dec)):
        resid = cross[i, :, :, -1:]  # (B, T, 1): the share the decoder stream keeps through cross-attention
        from_src = cross[i, :, :, :-1] @ roll  # (B, T, S): source tokens, through the encoder
        spread = resid * dec_self[i]  # (B, T, T): the stream's share spread over the prefix by self-attention
        if source is None:
            source, target = from_src, spread
        else:
            source, target = spread @ source + from_src, spread @ target
    return Alti(enc, dec_self, cross, roll, source, target)

"""Feed-forward network and the encoder/decoder layers, one explicit residual line per sub-layer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .attention import KVCache, MultiHeadAttention
from .config import ModelConfig
from .dropout import dropout
from .hooks import HookPoint

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "swish": F.silu,
    "silu": F.silu,
}


class Dropout(nn.Dropout):
    """nn.Dropout whose CPU training mask costs a fifth (`core.dropout.dropout`: 16 random bits per element, not a
    Bernoulli draw); elsewhere nn.Dropout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training, self.inplace)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (same parameters and state-dict keys) with its input and scale observable.

    `hook_in` (B, L, D) is what the norm reads: for post-norm layers the pre-norm sum x + sublayer(x).
    `hook_scale` (B, L, 1) is sqrt(var + eps), the divisor; listening to it (to read it, or to freeze it
    at another run's value) takes an explicit path, otherwise the fused kernel runs.

    With its scale frozen the norm is affine: `linear(x, scale)` + bias. `linear` and its adjoint `linear_t`
    are the one home of the frozen norm: the explicit path, the replacement model, graphs, circuits, ALTI+ and
    the residual decompositions all use them.
    """

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__(d_model, eps=eps)
        self.hook_in = HookPoint()
        self.hook_scale = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hook_in(x)
        if not self.hook_scale.is_active():
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        dtype = x.dtype
        xf = x.float() if dtype in (torch.float16, torch.bfloat16) else x  # as the fused kernel: fp32 for halves
        centered = xf - xf.mean(-1, keepdim=True)
        scale = self.hook_scale(((centered.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()).to(dtype))
        out = self.linear(xf, scale.to(xf.dtype)) + self.bias.to(xf.dtype)
        return out.to(dtype)

    def linear(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The norm's linear part at a fixed `scale` (broadcast over the last axis): (x - mean x) / scale * weight,
        in x's dtype. The norm's output is this plus `bias`."""
        return (x - x.mean(-1, keepdim=True)) / scale * self.weight.to(x.dtype)

    def linear_t(self, g: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The adjoint of `linear` applied to `g` (a gradient at the norm's output): centre(g * weight / scale)."""
        y = g * self.weight.to(g.dtype) / scale
        return y - y.mean(-1, keepdim=True)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig, stack: str) -> None:
        super().__init__()
        width = cfg.ffn_dim(stack)
        self.up_proj = nn.Linear(cfg.d_model, width, bias=cfg.bias)
        self.down_proj = nn.Linear(width, cfg.d_model, bias=cfg.bias)
        self.activation = ACTIVATIONS[cfg.activation]
        self.act_dropout = Dropout(cfg.act_dropout)
        self.hook_in = HookPoint()  # (B, L, D): what the FFN reads (post-norm: the stream; pre-norm: its norm's output)
        self.hook_pre = HookPoint()  # (B, L, F): before the activation
        self.hook_hidden = HookPoint()  # (B, L, F): after the activation
        self.hook_out = HookPoint()  # (B, L, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.hook_hidden(self.activation(self.hook_pre(self.up_proj(self.hook_in(x)))))
        return self.hook_out(self.down_proj(self.act_dropout(hidden)))


@dataclass(frozen=True, eq=False)
class Sublayer:
    """One residual line of a layer, as the layer publishes it: the block that writes into the stream, its norm
    (pre-norm: before the block; post-norm: after the add) and the stream hook points around it. Analyses
    name hook points through these references (`sub.block.hook_out.name`), never by spelling paths."""

    name: str  # "self_attn", "cross_attn" or "ffn"
    block: nn.Module  # MultiHeadAttention or FeedForward
    norm: LayerNorm
    hook_norm: HookPoint
    hook_resid: HookPoint  # the stream after this sub-layer has written (and, post-norm, been normalised)
    hook_resid_before: HookPoint  # the stream before it writes: the layer's hook_resid_in or the last hook_resid
    hook_block_in: HookPoint  # what the block reads: pre-norm its norm's output; post-norm the stream before it
    norm_first: bool = False  # the layer's placement (see `_Layer.compose`)

    @property
    def is_attention(self) -> bool:
        return isinstance(self.block, MultiHeadAttention)

    @property
    def norm_on_stream(self) -> bool:
        """True when the norm maps the stream itself (post-norm: after the add, so every upstream write passes
        it); False when it maps only what the block reads (pre-norm). `_Layer.compose` is the definition."""
        return not self.norm_first


class _Layer(nn.Module):
    SUBLAYERS: tuple[str, ...] = ()
    norm_first: bool
    hook_resid_in: HookPoint

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        self.__dict__.pop("_sublayers", None)  # a block or norm replaced: describe the lines again

    def sublayers(self) -> list[Sublayer]:
        """The layer's residual lines in the order they write (described once, then kept: `compose` runs per
        decoding step)."""
        cached = self.__dict__.get("_sublayers")
        if cached is None:
            cached = self.__dict__["_sublayers"] = tuple(self._describe())
        return list(cached)

    def _describe(self) -> list[Sublayer]:
        out: list[Sublayer] = []
        before = self.hook_resid_in
        for name in self.SUBLAYERS:
            norm, hook_norm = getattr(self, f"{name}_norm"), getattr(self, f"hook_norm_{name}")
            out.append(Sublayer(name, getattr(self, name), norm, hook_norm, getattr(self, f"hook_resid_{name}"),
                                before, hook_norm if self.norm_first else before, self.norm_first))
            before = out[-1].hook_resid
        return out

    def sublayer(self, name: str) -> Sublayer:
        """The residual line of block `name` ("self_attn", "cross_attn" or "ffn")."""
        for sub in self.sublayers():
            if sub.name == name:
                return sub
        raise ValueError(f"{type(self).__name__} has no sub-layer {name!r}; it has {self.SUBLAYERS}")

    def compose(self, x: torch.Tensor, block: Callable[[Sublayer, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The layer's residual lines, in order: the one place that says how its blocks compose.

        `block(sub, h)` is what sub-layer `sub` writes given what it reads, `h`. Pre-norm (norm_first): the block
        reads its norm's output and its write is added to the stream. Post-norm (the paper's, Marian's, FSMT's):
        the block reads the stream, and the norm comes after the add (hook_norm_{sub} and hook_resid_{sub} then
        hold the same tensor; the norm hook runs first, so an edit there reaches the resid hook and the rest).
        The forward pass calls it with the real blocks; analyses call it with frozen or decomposed ones.
        """
        x = self.hook_resid_in(x)
        for sub in self.__dict__.get("_sublayers") or self.sublayers():
            if self.norm_first:
                x = sub.hook_resid(x + self.dropout(block(sub, sub.hook_norm(sub.norm(x)))))
            else:
                x = sub.hook_resid(sub.hook_norm(sub.norm(x + self.dropout(block(sub, x)))))
        return x


def _attention(cfg: ModelConfig, stack: str) -> MultiHeadAttention:
    return MultiHeadAttention(d_model=cfg.d_model, n_heads=cfg.heads(stack), bias=cfg.bias, dropout=cfg.attn_dropout)


class EncoderLayer(_Layer):
    """Self-attention then feed-forward, each one residual line.

    hook_norm_{sub} is the {sub} norm's output. Pre-norm (norm_first): that is the sub-layer's
    input, and hook_resid_{sub} is the stream after the sub-layer added to it. Post-norm (the
    paper's, Marian's, FSMT's): the norm comes after the add, so hook_norm_{sub} and
    hook_resid_{sub} hold the same tensor (the norm hook runs first; an edit there reaches the
    resid hook and the rest of the model).
    """

    SUBLAYERS = ("self_attn", "ffn")

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = _attention(cfg, "enc")
        self.self_attn_norm = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg, "enc")
        self.ffn_norm = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.dropout)
        self.hook_resid_in = HookPoint()  # (B, S, D)
        self.hook_norm_self_attn = HookPoint()  # (B, S, D): the self-attention norm's output (post-norm: = resid)
        self.hook_resid_self_attn = HookPoint()  # (B, S, D): after self-attention has written
        self.hook_norm_ffn = HookPoint()  # (B, S, D): the FFN norm's output (post-norm: = hook_resid_ffn)
        self.hook_resid_ffn = HookPoint()  # (B, S, D): the layer's output

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        def block(sub: Sublayer, h: torch.Tensor) -> torch.Tensor:
            return self.self_attn(h, mask=mask)[0] if sub.name == "self_attn" else self.ffn(h)

        return self.compose(x, block)


class DecoderLayer(_Layer):
    """Self-attention, cross-attention, feed-forward; hook_norm_* / hook_resid_* as in EncoderLayer
    (post-norm: each hook_norm_{sub} holds the same tensor as hook_resid_{sub})."""

    SUBLAYERS = ("self_attn", "cross_attn", "ffn")

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = _attention(cfg, "dec")
        self.self_attn_norm = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.cross_attn = _attention(cfg, "dec")
        self.cross_attn_norm = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg, "dec")
        self.ffn_norm = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.dropout)
        self.hook_resid_in = HookPoint()  # (B, T, D)
        self.hook_norm_self_attn = HookPoint()  # (B, T, D)
        self.hook_resid_self_attn = HookPoint()  # (B, T, D)
        self.hook_norm_cross_attn = HookPoint()  # (B, T, D)
        self.hook_resid_cross_attn = HookPoint()  # (B, T, D)
        self.hook_norm_ffn = HookPoint()  # (B, T, D)
        self.hook_resid_ffn = HookPoint()  # (B, T, D)

    def forward(
        self,
        x: torch.Tensor,
        *,
        cross_kv: KVCache,
        src_mask: torch.Tensor | None,
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, KVCache]:
        """`cross_kv`: the memory's keys/values for this layer; `cache`: earlier self-attention K/V."""
        new_cache = cache

        def block(sub: Sublayer, h: torch.Tensor) -> torch.Tensor:
            nonlocal new_cache
            if sub.name == "self_attn":
                out, new_cache = self.self_attn(h, causal=True, cache=cache)
                return out
            if sub.name == "cross_attn":
                return self.cross_attn(h, static_kv=cross_kv, mask=src_mask)[0]
            return self.ffn(h)

        x = self.compose(x, block)
        assert new_cache is not None
        return x, new_cache

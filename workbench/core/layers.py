"""Feed-forward network and the encoder/decoder layers, one explicit residual line per sub-layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .attention import KVCache, MultiHeadAttention
from .config import ModelConfig
from .hooks import HookPoint

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "swish": F.silu,
    "silu": F.silu,
}


class Dropout(nn.Dropout):
    """nn.Dropout whose CPU training mask costs a fifth: 16 random bits per element, not a Bernoulli draw.

    `torch.bernoulli_` draws one double per element on CPU (7.3 ms for 0.5M floats on 2 cores, 14 % of
    a Multi30k training step); here one 64-bit draw gives four 16-bit uniforms (1.4 ms, mask and scale
    included), so p is rounded to a multiple of 1/65536. Same RNG (torch's generator, so seeds and the
    trainer's RNG-state resume hold), same expectation (kept values scaled by 1/(1-p')). Elsewhere
    (eval, CUDA, p = 0 or 1) it is nn.Dropout.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        threshold = round(self.p * 65536)
        if not self.training or x.device.type != "cpu" or not 0 < threshold < 65536 or self.inplace:
            return super().forward(x)
        n = x.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
        keep = bits.view(torch.int16)[:n].view(x.shape) >= threshold - 32768
        return x * keep * (65536 / (65536 - threshold))


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (same parameters and state-dict keys) with its input and scale observable.

    `hook_in` (B, L, D) is what the norm reads: for post-norm layers the pre-norm sum x + sublayer(x).
    `hook_scale` (B, L, 1) is sqrt(var + eps), the divisor; listening to it (to read it, or to freeze it
    at another run's value) takes an explicit path, otherwise the fused kernel runs.
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
        xf = x.float()  # as the fused kernel, accumulate in fp32 for half types
        centered = xf - xf.mean(-1, keepdim=True)
        scale = self.hook_scale(((centered.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()).to(dtype)).float()
        out = centered / scale * self.weight.float() + self.bias.float()
        return out.to(dtype)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig, stack: str) -> None:
        super().__init__()
        width = cfg.ffn_dim(stack)
        self.up_proj = nn.Linear(cfg.d_model, width, bias=cfg.bias)
        self.down_proj = nn.Linear(width, cfg.d_model, bias=cfg.bias)
        self.activation = ACTIVATIONS[cfg.activation]
        self.act_dropout = Dropout(cfg.act_dropout)
        self.hook_hidden = HookPoint()  # (B, L, F): after the activation
        self.hook_out = HookPoint()  # (B, L, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.hook_hidden(self.activation(self.up_proj(x)))
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

    @property
    def is_attention(self) -> bool:
        return isinstance(self.block, MultiHeadAttention)


class _Layer(nn.Module):
    SUBLAYERS: tuple[str, ...] = ()
    norm_first: bool
    hook_resid_in: HookPoint

    def sublayers(self) -> list[Sublayer]:
        """The layer's residual lines in the order they write."""
        out: list[Sublayer] = []
        before = self.hook_resid_in
        for name in self.SUBLAYERS:
            norm, hook_norm = getattr(self, f"{name}_norm"), getattr(self, f"hook_norm_{name}")
            out.append(Sublayer(name, getattr(self, name), norm, hook_norm, getattr(self, f"hook_resid_{name}"),
                                before, hook_norm if self.norm_first else before))
            before = out[-1].hook_resid
        return out

    def sublayer(self, name: str) -> Sublayer:
        """The residual line of block `name` ("self_attn", "cross_attn" or "ffn")."""
        for sub in self.sublayers():
            if sub.name == name:
                return sub
        raise ValueError(f"{type(self).__name__} has no sub-layer {name!r}; it has {self.SUBLAYERS}")


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
        x = self.hook_resid_in(x)
        if self.norm_first:
            h = self.hook_norm_self_attn(self.self_attn_norm(x))
            x = self.hook_resid_self_attn(x + self.dropout(self.self_attn(h, mask=mask)[0]))
            h = self.hook_norm_ffn(self.ffn_norm(x))
            x = self.hook_resid_ffn(x + self.dropout(self.ffn(h)))
        else:
            x = x + self.dropout(self.self_attn(x, mask=mask)[0])
            x = self.hook_resid_self_attn(self.hook_norm_self_attn(self.self_attn_norm(x)))
            x = x + self.dropout(self.ffn(x))
            x = self.hook_resid_ffn(self.hook_norm_ffn(self.ffn_norm(x)))
        return x


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
        x = self.hook_resid_in(x)
        if self.norm_first:
            h = self.hook_norm_self_attn(self.self_attn_norm(x))
            a, cache = self.self_attn(h, causal=True, cache=cache)
            x = self.hook_resid_self_attn(x + self.dropout(a))
            h = self.hook_norm_cross_attn(self.cross_attn_norm(x))
            x = self.hook_resid_cross_attn(x + self.dropout(self.cross_attn(h, static_kv=cross_kv, mask=src_mask)[0]))
            h = self.hook_norm_ffn(self.ffn_norm(x))
            x = self.hook_resid_ffn(x + self.dropout(self.ffn(h)))
        else:
            a, cache = self.self_attn(x, causal=True, cache=cache)
            x = x + self.dropout(a)
            x = self.hook_resid_self_attn(self.hook_norm_self_attn(self.self_attn_norm(x)))
            x = x + self.dropout(self.cross_attn(x, static_kv=cross_kv, mask=src_mask)[0])
            x = self.hook_resid_cross_attn(self.hook_norm_cross_attn(self.cross_attn_norm(x)))
            x = x + self.dropout(self.ffn(x))
            x = self.hook_resid_ffn(self.hook_norm_ffn(self.ffn_norm(x)))
        assert cache is not None
        return x, cache

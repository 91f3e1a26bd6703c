"""OpenNMT-py's Transformer forward, written functionally over its own state-dict keys.

A second path for the parity tests, transcribed from OpenNMT-py 3.5.1 (encoders/transformer.py,
decoders/transformer.py, modules/multi_headed_attn.py, position_ffn.py, embeddings.py): pre-norm
layers, FFN with its own inner layer norm and residual, final stack norms, query scaled by
1/sqrt(d_head) before the dot product, masked scores filled with -1e18, embeddings x sqrt(d) plus the
stored `pe` buffer. scripts/check_opennmt_parity.py compares the importer with the real library.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def pe_table(max_len: int, dim: int, kind: str = "SinusoidalInterleaved") -> torch.Tensor:
    """OpenNMT-py's PositionalEncoding buffer, (max_len, 1, dim), computed in float32 as it does."""
    if kind == "SinusoidalInterleaved":
        pe = torch.zeros(max_len, dim)
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float) * -(math.log(10000.0) / dim))
        pe[:, 0::2] = torch.sin(position.float() * div_term)
        pe[:, 1::2] = torch.cos(position.float() * div_term)
    else:
        half = dim // 2
        freq = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))
        pe = torch.arange(max_len, dtype=torch.float).unsqueeze(1) * freq.unsqueeze(0)
        pe = torch.cat([torch.sin(pe), torch.cos(pe)], dim=1)
    return pe.unsqueeze(1)


def forward(sd, generator, src, tgt, *, heads: int, pad: int, eps: float = 1e-6):
    """(encoder output, logits) for right-padded (B, S) `src` and (B, T) decoder input `tgt`."""
    d = sd["encoder.layer_norm.weight"].numel()

    def ln(x, p):
        return F.layer_norm(x, (d,), sd[p + ".weight"], sd[p + ".bias"], eps)

    def lin(x, p):
        return F.linear(x, sd[p + ".weight"], sd.get(p + ".bias"))

    def mha(q_in, kv_in, p, blocked):
        b, dh = q_in.size(0), d // heads

        def split(x):
            return x.view(b, -1, heads, dh).transpose(1, 2)

        k, v = split(lin(kv_in, p + ".linear_keys")), split(lin(kv_in, p + ".linear_values"))
        q = split(lin(q_in, p + ".linear_query")) / math.sqrt(dh)
        scores = (q @ k.transpose(2, 3)).masked_fill(blocked, -1e18)
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, -1, d)
        return lin(ctx, p + ".final_linear")

    def ffn(x, p):
        return lin(F.relu(lin(ln(x, p + ".layer_norm"), p + ".w_1")), p + ".w_2") + x

    def embed(ids, p):
        emb = F.embedding(ids, sd[p + ".make_embedding.emb_luts.0.weight"]) * math.sqrt(d)
        return emb + sd[p + ".make_embedding.pe.pe"][: ids.size(1), 0]

    n_enc = len({k.split(".")[2] for k in sd if k.startswith("encoder.transformer.")})
    n_dec = len({k.split(".")[2] for k in sd if k.startswith("decoder.transformer_layers.")})
    src_blocked = (src == pad)[:, None, None, :]
    x = embed(src, "encoder.embeddings")
    for i in range(n_enc):
        p = f"encoder.transformer.{i}"
        h = ln(x, p + ".layer_norm")
        x = ffn(mha(h, h, p + ".self_attn", src_blocked) + x, p + ".feed_forward")
    memory = ln(x, "encoder.layer_norm")
    t = tgt.size(1)
    dec_blocked = (tgt == pad)[:, None, None, :] | torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    y = embed(tgt, "decoder.embeddings")
    for j in range(n_dec):
        p = f"decoder.transformer_layers.{j}"
        h = ln(y, p + ".layer_norm_1")
        y = mha(h, h, p + ".self_attn", dec_blocked) + y
        h = ln(y, p + ".layer_norm_2")
        y = ffn(mha(h, memory, p + ".context_attn", src_blocked) + y, p + ".feed_forward")
    y = ln(y, "decoder.layer_norm")
    weight = generator.get("weight", generator.get("0.weight"))
    bias = generator.get("bias", generator.get("0.bias"))
    return memory, F.linear(y, weight, bias)


def random_state(*, src_vocab: int, tgt_vocab: int, d: int, d_ff: int, enc: int, dec: int, qkv_bias: bool = True,
                 pe: str = "SinusoidalInterleaved", max_len: int = 64, seed: int = 0, pad: int = 1):
    """A random OpenNMT-py v2/v3 model state dict and generator (std 0.3: far from identity-like)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    sd: dict[str, torch.Tensor] = {}

    def attn(p):
        for name in ("linear_keys", "linear_values", "linear_query", "final_linear"):
            sd[f"{p}.{name}.weight"] = r(d, d)
            if qkv_bias:
                sd[f"{p}.{name}.bias"] = r(d)

    def norm(p):
        sd[p + ".weight"], sd[p + ".bias"] = 1 + r(d), r(d)

    def ffn(p):
        sd[p + ".w_1.weight"], sd[p + ".w_1.bias"] = r(d_ff, d), r(d_ff)
        sd[p + ".w_2.weight"], sd[p + ".w_2.bias"] = r(d, d_ff), r(d)
        norm(p + ".layer_norm")

    for side, vocab in (("encoder", src_vocab), ("decoder", tgt_vocab)):
        emb = r(vocab, d)
        emb[pad] = 0
        sd[f"{side}.embeddings.make_embedding.emb_luts.0.weight"] = emb
        sd[f"{side}.embeddings.make_embedding.pe.pe"] = pe_table(max_len, d, pe)
    for i in range(enc):
        attn(f"encoder.transformer.{i}.self_attn")
        norm(f"encoder.transformer.{i}.layer_norm")
        ffn(f"encoder.transformer.{i}.feed_forward")
    for j in range(dec):
        p = f"decoder.transformer_layers.{j}"
        attn(p + ".self_attn")
        attn(p + ".context_attn")
        norm(p + ".layer_norm_1")
        norm(p + ".layer_norm_2")
        ffn(p + ".feed_forward")
    norm("encoder.layer_norm")
    norm("decoder.layer_norm")
    generator = {"weight": r(tgt_vocab, d), "bias": r(tgt_vocab)}
    return sd, generator

"""How much of a first-layer head's attention scores comes from positions rather than tokens.

With additive positional encodings the first layer reads x = e + p (token embedding + position). The
attention input h is linear in (e, p) except for a pre-norm LayerNorm, which is linear too once its
per-token scale σ(x) is fixed: LN(x) = γ⊙(e - μ_e)/σ + γ⊙(p - μ_p)/σ + β. So q = q_e + q_p + q_c and
k = k_e + k_p + k_c (c: biases and β), and each head's scaled score splits exactly into
token·token, token·position, position·token, position·position and a bias term (sum checked against
`hook_scores`). Deeper layers mix tokens and positions non-linearly, so only layer 0 is decomposed.

    share = positional_share(model, src, tgt)      # DataFrame: kind, head, mean |term| of each, pos_share
"""

from __future__ import annotations

import math

import torch

from ...core.heads import Head
from ...core.masks import causal_mask, real_positions

TERMS = ("token·token", "token·position", "position·token", "position·position", "bias")


def _split_input(model, tok: torch.Tensor, pos: torch.Tensor, norm) -> tuple[torch.Tensor, ...]:
    """(token part, position part, constant part) of the first attention block's input."""
    pos = pos.expand_as(tok)
    if not model.cfg.norm_first:
        return tok, pos, torch.zeros_like(tok)
    x = tok + pos
    sigma = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    w = norm.weight if norm.weight is not None else torch.ones_like(x[0, 0])
    b = norm.bias if norm.bias is not None else torch.zeros_like(x[0, 0])
    t = w * (tok - tok.mean(-1, keepdim=True)) / sigma
    p = w * (pos - pos.mean(-1, keepdim=True)) / sigma
    return t, p, b.expand_as(tok)


def score_terms(model, src: torch.Tensor, tgt: torch.Tensor, kind: str = "enc_self") -> dict[str, torch.Tensor]:
    """{term: (B, H, L, L)} for layer 0 of `kind` (enc_self or dec_self); the terms sum to the scores."""
    cfg = model.cfg
    if cfg.positions == "none":
        raise ValueError("the model has no positional encodings (positions='none'): nothing to decompose")
    if cfg.emb_norm:
        raise ValueError("emb_norm normalises e + p before layer 0, which this exact split does not cover")
    if kind not in ("enc_self", "dec_self"):
        raise ValueError(f"kind must be 'enc_self' or 'dec_self' (cross keys are encoder states), got {kind!r}")
    stream = model.stream("enc" if kind == "enc_self" else "dec")
    layer = stream.layers[0]
    with torch.no_grad():
        _, trace = model.run_with_cache(src, tgt, names=[stream.hook_tok.name, stream.hook_pos.name])
        parts = _split_input(model, trace[stream.hook_tok.name], trace[stream.hook_pos.name], layer.self_attn_norm)
        attn = layer.self_attn
        wq, wk = attn.q_proj.weight, attn.k_proj.weight
        bq = attn.q_proj.bias if attn.q_proj.bias is not None else torch.zeros(wq.size(0))
        bk = attn.k_proj.bias if attn.k_proj.bias is not None else torch.zeros(wk.size(0))
        q = [attn._heads(x @ wq.T) for x in parts]  # token, position, constant: (B, H, L, Dh)
        k = [attn._heads(x @ wk.T) for x in parts]
        q[2] = q[2] + bq.view(1, attn.n_heads, 1, attn.d_head)
        k[2] = k[2] + bk.view(1, attn.n_heads, 1, attn.d_head)
        scale = 1.0 / math.sqrt(attn.d_head)

        def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return (a @ b.transpose(-2, -1)) * scale

        terms = {"token·token": dot(q[0], k[0]), "token·position": dot(q[0], k[1]),
                 "position·token": dot(q[1], k[0]), "position·position": dot(q[1], k[1])}
        terms["bias"] = dot(q[2], k[0] + k[1] + k[2]) + dot(q[0] + q[1], k[2])
    return terms


def positional_share(model, src: torch.Tensor, tgt: torch.Tensor, kinds=("enc_self", "dec_self")):
    """Per first-layer head: mean |term| over visible (query, key) pairs, and the positional share
    (|token·position| + |position·token| + |position·position|) / Σ |terms|."""
    import pandas as pd

    rows = []
    for kind in kinds:
        terms = score_terms(model, src, tgt, kind)
        ids = src if kind == "enc_self" else tgt
        real = real_positions(ids, model.cfg.pad_id, decoder=kind == "dec_self")  # (B, L); a pad start is real
        vis = real[:, None, :, None] & real[:, None, None, :]
        if kind == "dec_self":
            n = ids.size(1)
            vis = vis & causal_mask(n, device=ids.device)
        count = vis.sum((0, 2, 3)).clamp(min=1)  # per head (broadcast H=1)
        means = {t: ((v.abs() * vis).sum((0, 2, 3)) / count).double() for t, v in terms.items()}
        total = sum(means.values())
        pos = means["token·position"] + means["position·token"] + means["position·position"]
        for h in range(next(iter(terms.values())).size(1)):
            rows.append({"head_id": str(Head(kind, 0, h)), "kind": kind, "layer": 0, "head_index": h,
                         **{t: float(m[h]) for t, m in means.items()},
                         "pos_share": float(pos[h] / total[h])})
    return pd.DataFrame(rows)

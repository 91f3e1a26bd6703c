"""Small random reference models for the importer parity tests (no downloads)."""

from __future__ import annotations

import torch

ODD = dict(d_model=16, encoder_layers=3, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
           encoder_ffn_dim=24, decoder_ffn_dim=24, max_position_embeddings=64)


def fsmt_model(seed: int = 0, **changes):
    from transformers import FSMTConfig, FSMTForConditionalGeneration

    torch.manual_seed(seed)
    cfg = FSMTConfig(**{"langs": ["en", "de"], "src_vocab_size": 53, "tgt_vocab_size": 47, **ODD, **changes})
    return FSMTForConditionalGeneration(cfg).eval()


def marian_model(seed: int = 0, **changes):
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    cfg = MarianConfig(**{"vocab_size": 53, "decoder_vocab_size": 47, "share_encoder_decoder_embeddings": False,
                          "tie_word_embeddings": False, "pad_token_id": 46, "eos_token_id": 0,
                          "decoder_start_token_id": 46, "scale_embedding": True, "activation_function": "swish",
                          **ODD, **changes})
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_()  # zeros would hide a missing bias
    return model


def padded_batch(*, src_vocab: int, tgt_vocab: int, pad: int, eos: int, start: int, low: int, seed: int = 1,
                 batch: int = 3, src_len: int = 7, tgt_len: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """EOS-terminated sources and start-token targets with ids in [low, vocab) other than the specials;
    row 0 has a padded source, row 1 a padded target."""
    g = torch.Generator().manual_seed(seed)
    hi = min(src_vocab, tgt_vocab)
    src = torch.randint(low, hi, (batch, src_len), generator=g)
    tgt = torch.randint(low, hi, (batch, tgt_len), generator=g)
    for t in (src, tgt):
        t[(t == pad) | (t == eos) | (t == start)] = low
    src[:, -1] = eos
    src[0, src_len - 3] = eos
    src[0, src_len - 2:] = pad
    tgt[:, 0] = start
    tgt[1, tgt_len - 2:] = pad
    return src, tgt


def fsmt_to_fairseq(sd: dict[str, torch.Tensor], *, fused: bool, old_norms: bool) -> dict[str, torch.Tensor]:
    """FSMT's state dict in fairseq's own key layout (FSMT is transformers' port of fairseq's transformer).

    fused/old_norms produce the 2018 layout: one in_proj_weight/bias per attention block and
    layer_norms.{0,1}/{0,1,2}; otherwise the fairseq >= 0.7 layout with decoder.output_projection.
    """
    out: dict[str, torch.Tensor] = {}
    renames = {"self_attn_layer_norm": 0, "encoder_attn_layer_norm": 1, "final_layer_norm": 2}
    for key, value in sd.items():
        key = key.removeprefix("model.")
        if "embed_positions" in key:
            continue
        if key == "decoder.output_projection.weight" and old_norms:
            key = "decoder.embed_out"
        if old_norms:
            for name, n in renames.items():
                if f".{name}." in key:
                    n = 1 if key.startswith("encoder.") and n == 2 else n
                    key = key.replace(f".{name}.", f".layer_norms.{n}.")
        out[key] = value.clone()
    if fused:
        for key in [k for k in out if k.endswith(".q_proj.weight")]:
            base = key[: -len(".q_proj.weight")]
            for w in ("weight", "bias"):
                out[f"{base}.in_proj_{w}"] = torch.cat([out.pop(f"{base}.{p}_proj.{w}") for p in "qkv"])
    out["encoder.version"] = torch.tensor([3.0])
    out["decoder.version"] = torch.tensor([3.0])
    out["encoder.embed_positions._float_tensor"] = torch.zeros(1)
    out["decoder.embed_positions._float_tensor"] = torch.zeros(1)
    return out

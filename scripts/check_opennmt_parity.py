"""Compare the OpenNMT-py importer with the real OpenNMT-py library (not a test dependency).

    pip install OpenNMT-py==3.5.1   # or unpack its wheel and put it on PYTHONPATH
    python scripts/check_opennmt_parity.py

Builds OpenNMT-py's own Embeddings / TransformerEncoder / TransformerDecoder with odd settings
(3 encoder and 2 decoder layers, vocabularies of 37 and 41, both position layouts, with and without
attention biases), converts their state dicts with workbench.importers.opennmt and prints the
largest encoder-output and logit differences over a padded batch. Only onmt's model modules are
imported, so its data-pipeline dependencies (pyonmttok, spacy, ...) may be stubbed.
"""

from __future__ import annotations

import argparse
import sys
import types

import torch


def import_onmt():
    try:
        import onmt  # noqa: F401
    except ImportError:
        # load only the model modules when onmt's package __init__ pulls in missing data tools
        spec = __import__("importlib.util").util.find_spec("onmt")
        if spec is None:
            sys.exit("OpenNMT-py is not installed: pip install OpenNMT-py==3.5.1")
        pkg = types.ModuleType("onmt")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["onmt"] = pkg
    from onmt.decoders.transformer import TransformerDecoder
    from onmt.encoders.transformer import TransformerEncoder
    from onmt.modules.embeddings import Embeddings

    return Embeddings, TransformerEncoder, TransformerDecoder


def main() -> int:
    from workbench.importers.opennmt import convert_opennmt

    Embeddings, TransformerEncoder, TransformerDecoder = import_onmt()
    torch.manual_seed(0)
    d, heads, d_ff, n_src, n_tgt = 16, 4, 24, 37, 41
    specials = ["<unk>", "<blank>", "<s>", "</s>"]
    src_itos = specials + [f"s{i}" for i in range(n_src - 4)]
    tgt_itos = specials + [f"t{i}" for i in range(n_tgt - 4)]
    worst = 0.0
    for pe_type in ("SinusoidalInterleaved", "SinusoidalConcat"):
        for qkv_bias in (True, False):
            emb_s = Embeddings(d, n_src, 1, position_encoding=True, position_encoding_type=pe_type)
            emb_t = Embeddings(d, n_tgt, 1, position_encoding=True, position_encoding_type=pe_type)
            enc = TransformerEncoder(3, d, heads, d_ff, 0.0, 0.0, emb_s, 0, 0, add_qkvbias=qkv_bias)
            dec = TransformerDecoder(2, d, heads, d_ff, False, "scaled-dot", 0.0, 0.0, emb_t, 0, 0, False, False,
                                     -3, 0, add_qkvbias=qkv_bias)
            gen = torch.nn.Linear(d, n_tgt)
            for module in (enc, dec, gen):
                for p in module.parameters():
                    torch.nn.init.normal_(p, std=0.3)
            enc.eval()
            dec.eval()
            sd = {**{"encoder." + k: v for k, v in enc.state_dict().items()},
                  **{"decoder." + k: v for k, v in dec.state_dict().items()}}
            opt = argparse.Namespace(heads=heads, transformer_ff=d_ff, position_encoding=True, hidden_size=d,
                                     position_encoding_type=pe_type, norm_eps=1e-6, add_qkvbias=qkv_bias,
                                     share_decoder_embeddings=False, share_embeddings=False)
            ckpt = {"model": sd, "generator": gen.state_dict(), "opt": opt,
                    "vocab": {"src": src_itos, "tgt": tgt_itos}}
            model, report, _, _ = convert_opennmt(ckpt)
            g = torch.Generator().manual_seed(1)
            src = torch.randint(4, n_src, (3, 7), generator=g)
            src[0, 5:] = 1
            src_len = torch.tensor([5, 7, 7])
            tgt = torch.randint(4, n_tgt, (3, 6), generator=g)
            tgt[:, 0] = 2
            tgt[1, 4:] = 1
            with torch.no_grad():
                enc_out, _, _ = enc(src.unsqueeze(-1), src_len)
                dec.init_state(src.unsqueeze(-1), enc_out, None)
                dec_out, _ = dec(tgt.unsqueeze(-1), enc_out, src_len=src_len)
                ref = gen(dec_out)
                ours, memory = model(src, tgt), model.encode(src).memory
            d_mem = (memory - enc_out)[src != 1].abs().max().item()
            d_log = (ours - ref)[tgt != 1].abs().max().item()
            worst = max(worst, d_mem, d_log)
            print(f"{pe_type:<22} qkv_bias={qkv_bias!s:<5} max|memory diff|={d_mem:.2e} max|logit diff|={d_log:.2e}")
    print("OK" if worst < 1e-5 else "MISMATCH")
    return 0 if worst < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())

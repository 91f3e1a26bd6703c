"""Largest logit difference between each importer and its reference, over the parity tests' cases.

    python scripts/measure_importer_parity.py      (needs the `dev` and `import` extras; CPU, ~10 s)

The figures in docs/importers.md come from this script.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "importers"), str(ROOT / "tests"), str(ROOT)]


def worst(ours: torch.Tensor, ref: torch.Tensor, real: torch.Tensor) -> float:
    return (ours - ref)[real].abs().max().item()


def main() -> None:
    import test_fairseq
    import test_fsmt
    import test_marian
    import test_opennmt
    from importer_helpers import PER_STACK, fsmt_model, fsmt_to_fairseq, marian_model
    from onmt_reference import forward

    from workbench.importers.fairseq import convert_fairseq
    from workbench.importers.fsmt import convert_fsmt
    from workbench.importers.marian import convert_marian
    from workbench.importers.opennmt import convert_opennmt

    rows: dict[str, float] = {}
    with torch.no_grad():
        for name, changes in test_marian.VARIANTS.items():
            hf = marian_model(seed=3, **changes)
            model, _ = convert_marian(hf.state_dict(), hf.config.to_dict())
            src, tgt = test_marian._batch(hf)
            pad = hf.config.pad_token_id
            ref = hf(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt).logits
            rows[f"marian/{name}"] = worst(model(src, tgt), ref, tgt != pad)
        for name, changes in test_fsmt.VARIANTS.items():
            hf = fsmt_model(seed=2, **changes)
            model, _ = convert_fsmt(hf.state_dict(), hf.config.to_dict())
            src, tgt = test_fsmt._batch(hf)
            ref = hf(input_ids=src, attention_mask=(src != 1).long(), decoder_input_ids=tgt, use_cache=False).logits
            rows[f"fsmt/{name}"] = worst(model(src, tgt), ref, tgt != 1)
        for old in (True, False):
            for sizes, changes in (("", {}), ("/per_stack", PER_STACK)):
                hf = fsmt_model(seed=7, **changes)
                sd = fsmt_to_fairseq(hf.state_dict(), fused=old, old_norms=old)
                model, _ = convert_fairseq(sd, vars(test_fairseq._args(hf)))
                src, tgt = test_fairseq._batch(hf)
                ref = hf(input_ids=src, attention_mask=(src != 1).long(), decoder_input_ids=tgt,
                         use_cache=False).logits
                rows[f"fairseq/{'2018_fused' if old else 'current'}{sizes}"] = worst(model(src, tgt), ref, tgt != 1)
        for name, kw in test_opennmt.CASES.items():
            ckpt, sd, gen = test_opennmt._checkpoint(**kw)
            model, *_ = convert_opennmt(ckpt)
            src, tgt = test_opennmt._batch(model.cfg.tgt_vocab)
            ref = forward(sd, gen, src, tgt, heads=4, pad=1)[1]
            rows[f"opennmt/{name}"] = worst(model(src, tgt), ref, tgt != 1)
    for name, value in rows.items():
        print(f"{name:<32} {value:.2e}")


if __name__ == "__main__":
    main()

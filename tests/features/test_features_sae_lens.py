"""SAELens loads every dictionary the workbench writes, the shipped ones included: its own classes for SAEs and ReLU
transcoders, and for TopK transcoders (with and without the skip term) the classes that
`workbench.features.sae_lens_classes.register()` adds through SAELens's `register_sae_class`. Encode and forward are
SAELens's code and must equal the workbench's, on random inputs and on the shipped model's own activations."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workbench import load
from workbench.features import DictionaryConfig, SparseDictionary, capture_site, resolve_site

sae_lens = pytest.importorskip("sae_lens")
from workbench.features.sae_lens_classes import register  # noqa: E402  (imports sae_lens)

CKPT = Path(__file__).resolve().parents[2] / "checkpoints" / "multi30k-de-en"
SHIPPED = sorted(p for p in (CKPT / "features").iterdir() if (p / "cfg.json").is_file())


@pytest.mark.parametrize("skip", [False, True])
def test_a_topk_transcoder_loads_in_sae_lens_with_the_same_maths(tmp_path, skip):
    torch.manual_seed(0)
    cfg = DictionaryConfig("dec.1.hook_resid_cross_attn", d_in=16, d_sae=64, architecture="topk", k=5, d_out=12,
                           hook_name_out="dec.1.ffn.hook_out", model_name="tiny", skip=skip)
    dic = SparseDictionary(cfg)
    with torch.no_grad():
        for p in dic.parameters():
            p.normal_(0, 0.3)
    dic.save(tmp_path / "d")
    register()
    register()  # idempotent
    sae = sae_lens.SAE.load_from_disk(tmp_path / "d")
    assert type(sae).__name__ == ("TopKSkipTranscoder" if skip else "TopKTranscoder")
    assert sae.cfg.k == 5 and sae.cfg.d_out == 12 and sae.cfg.metadata.hook_name_out == "dec.1.ffn.hook_out"
    x = torch.randn(40, 16) * 3
    with torch.no_grad():
        ours, theirs = dic.encode(x), sae.encode(x)
        assert torch.allclose(ours, theirs, atol=1e-6)
        assert int((theirs > 0).sum(-1).max()) <= 5
        assert torch.allclose(dic(x), sae(x), atol=1e-5)
        if skip:  # the skip term is in SAELens's forward, not in its decode
            assert not torch.allclose(sae(x), sae.decode(theirs), atol=1e-3)


@pytest.mark.parametrize("directory", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_dictionary_loads_in_sae_lens_and_agrees_on_real_activations(directory):
    register()
    ours = SparseDictionary.load(directory)
    theirs = sae_lens.SAE.load_from_disk(directory)
    tm = load(CKPT)
    site = resolve_site(tm.model, ours.cfg.extra.get("site", ours.cfg.hook_name))
    batch = tm.encode_batch(["Zwei Hunde spielen im Schnee.", "Eine Frau mit einem roten Hut liest ein Buch."],
                            ["Two dogs play in the snow.", "A woman in a red hat reads a book."])
    x = capture_site(tm.model, batch.src, batch.tgt_in, site)[site.hook_in]
    x = x.reshape(-1, x.shape[-1])  # padding rows included: both sides must agree on any input
    with torch.no_grad():
        assert torch.allclose(ours.encode(x), theirs.encode(x), atol=1e-5)
        assert torch.allclose(ours(x), theirs(x), atol=1e-4)

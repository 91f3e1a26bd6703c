"""scripts/feature_graph_report.py's --features folders: a dictionary there replaces the shipped one of its site or
adds its site (a transcoder on an FFN the checkpoint ships none for), later folders winning."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from dictionary_helpers import random_dictionary

from workbench.features.dictionary import DictionaryConfig

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "feature_graph_report.py"
spec = importlib.util.spec_from_file_location("feature_graph_report", SCRIPT)
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


def sae(site: str, seed: int):
    return random_dictionary(DictionaryConfig(site, 8, 12, "topk", 3), seed)


def transcoder(layer: int, seed: int):
    return random_dictionary(DictionaryConfig(f"enc.{layer}.hook_resid_self_attn", 8, 12, "topk", 3, d_out=8,
                                              hook_name_out=f"enc.{layer}.ffn.hook_out", skip=True), seed)


def test_features_folders_replace_a_shipped_site_or_add_one(tmp_path):
    checkpoint = tmp_path / "ckpt"
    sae("hook_memory", 1).save(checkpoint / "features" / "hook_memory")
    transcoder(0, 2).save(checkpoint / "features" / "enc.0.ffn")
    first, second = tmp_path / "first", tmp_path / "second"
    sae("hook_memory", 3).save(first / "hook_memory")
    transcoder(1, 4).save(first / "enc.1.ffn" / "dictionary")  # a training run's out-dir
    transcoder(1, 5).save(second / "enc.1.ffn")
    (second / "enc.1.ffn.log").write_text("a training log beside the folders\n")

    def sites(dicts):
        return [d.cfg.hook_name_out or d.cfg.hook_name for d in dicts]

    shipped = report.load_dictionaries(checkpoint, [])
    assert sites(shipped) == ["enc.0.ffn.hook_out", "hook_memory"]
    one = report.load_dictionaries(checkpoint, [first])
    assert sites(one) == ["enc.0.ffn.hook_out", "enc.1.ffn.hook_out", "hook_memory"]
    assert torch.equal(one[0].W_enc, shipped[0].W_enc)  # a site the folder lacks keeps the shipped dictionary
    assert not torch.equal(one[2].W_enc, shipped[1].W_enc)  # the folder's replaces the shipped one
    both = report.load_dictionaries(checkpoint, [first, second])
    assert sites(both) == sites(one)
    assert torch.equal(both[1].W_enc, transcoder(1, 5).W_enc)  # the later folder wins
    assert not torch.equal(both[1].W_enc, one[1].W_enc)

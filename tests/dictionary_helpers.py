"""Small random dictionaries for a tiny model (the feature-graph and replacement-model tests): an SAE on hook_memory,
an SAE on a cross-attention block's output and a skip transcoder on a decoder FFN, every bias random and non-zero;
and `site_with_a_dead_feature`, for the export tests that skip dead features of a shipped dictionary."""

from __future__ import annotations

import os
import signal

import torch

from workbench.features.dictionary import DictionaryConfig, SparseDictionary
from workbench.features.sites import ffn_input_hook
from workbench.features.stats import FeatureStats


def random_dictionary(cfg: DictionaryConfig, seed: int) -> SparseDictionary:
    d = SparseDictionary(cfg)
    g = torch.Generator().manual_seed(seed)
    d.reset_parameters(generator=g)
    with torch.no_grad():
        d.b_enc.copy_(0.1 * torch.randn(cfg.d_sae, generator=g))
        d.b_dec.copy_(0.1 * torch.randn(cfg.out_dim, generator=g))
        if cfg.skip:
            d.W_skip.copy_(0.2 * torch.randn(cfg.out_dim, cfg.d_in, generator=g))
        if cfg.architecture in ("jumprelu", "batchtopk"):
            d.threshold.fill_(0.05)
    return d.eval()


def tiny_dictionaries(model, *, d_sae: int = 24, k: int = 4, architecture: str = "topk") -> dict[str, SparseDictionary]:
    """{site: dictionary}: hook_memory and dec.1.cross_attn.hook_out SAEs, a dec.0.ffn skip transcoder."""
    d = model.cfg.d_model
    cross = model.dec[1].cross_attn.hook_out.name
    ffn = model.dec[0].ffn
    return {
        model.hook_memory.name: random_dictionary(DictionaryConfig(model.hook_memory.name, d, d_sae, architecture,
                                                                   k), 11),
        cross: random_dictionary(DictionaryConfig(cross, d, d_sae, architecture, k), 12),
        "dec.0.ffn": random_dictionary(DictionaryConfig(ffn_input_hook(model, "dec", 0), d, d_sae, architecture, k,
                                                        d_out=d, hook_name_out=ffn.hook_out.name, skip=True), 13),
    }


def site_with_a_dead_feature(features_dir) -> tuple[str, list[int], int]:
    """A shipped site (a folder of `features_dir`) whose statistics hold a dead feature: the site, two consecutive
    live features and the first dead one, picked by count, not by id (dec.1.ffn, trained with --rare-floor, has no
    dead feature)."""
    for site in ("dec.1.ffn", "hook_memory"):
        count = FeatureStats.load(features_dir / site / "stats.safetensors").count
        dead = (count == 0).nonzero()[:, 0].tolist()
        pairs = [f for f in range(count.numel() - 1) if int(count[f]) > 0 and int(count[f + 1]) > 0]
        if dead and pairs:
            return site, [pairs[0], pairs[0] + 1], dead[0]
    raise AssertionError("no shipped dictionary has a dead feature: the skipped list is untested")


def fit_interrupted_after(trainer, steps: int) -> None:
    """Run `trainer.fit()` with a Ctrl-C (SIGINT) arriving during step `steps`: the loop stops after it and saves."""
    step = trainer.train_step

    def interrupted(*args):
        out = step(*args)
        if trainer.step == steps:
            os.kill(os.getpid(), signal.SIGINT)
        return out
    trainer.train_step = interrupted
    trainer.fit()

"""What an intervention does to the translation: head importance by ablation over a test set.

    table = head_importance(model, sources, targets, detokenize=tok.decode, references=ref_texts)
    effect = intervention_effect(model, ablate_heads({("cross", 2): [1]}), sources, targets)
    effect = patch_effect(model, "hook_memory", src, tgt, donor_src, donor_tgt)

For each intervention (ablate one head, or a whole block's heads with `units="block"`) it reports,
against the unedited model: the mean change in log-probability of the reference (teacher-forced, EOS
included), the share of sentences whose greedy output changes and the share of output tokens that
change (1 - difflib ratio), and, given a detokenizer and reference texts, the BLEU and chrF change
(sacrebleu, as `workbench evaluate`). Michel et al. 2019 and Voita et al. 2019 prune heads this way.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ...core.batching import corpus_batches
from ...core.config import DecodeConfig
from ...core.heads import KINDS, Head
from ...core.heads import n_heads as heads_of
from ...core.interventions import ablate_heads, patch
from ...decoding.evaluate import score
from ...decoding.search import decode_config, generate
from ..attention.head_stats import fit_to_positions
from ..generation.generation_trace import decoding_setup

UNITS = ("head", "block")


@dataclass
class Outcome:
    """One run over the test set (edited or not)."""

    ref_log_prob: np.ndarray  # (N,) summed log-probability of each reference
    outputs: list[list[int]] = field(default_factory=list)  # greedy outputs (EOS included), if decoded
    bleu: float | None = None
    chrf: float | None = None
    skipped: list[int] = field(default_factory=list)  # corpus ids left out: longer than the model's positions


@torch.no_grad()
def run_outcome(model, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *, hooks=None,
                decode: bool = True, detokenize: Callable[[list[int]], str] | None = None,
                references: Sequence[str] | None = None, batch_size: int = 64, config: DecodeConfig | None = None,
                **decode_options) -> Outcome:
    """Reference log-probabilities and (optionally) decoded outputs and scores, under `hooks`.

    `model`: a Transformer or a `TranslationModel`. Decoding follows `config`, else a TranslationModel's own
    settings (greedy or beam, its length penalty and repetition guard: what `tm.translate` does), else greedy
    search with the defaults; `decode_options` override single fields."""
    model, config = decoding_setup(model, config)
    search = decode_config(config or DecodeConfig(beam=1), decode_options)

    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    if references is not None and len(references) != len(sources):
        raise ValueError(f"{len(references)} reference texts for {len(sources)} sources")
    cfg = model.cfg
    # whole sentences only: a cut reference would change its log-probability and BLEU
    fitted = fit_to_positions(cfg.max_positions, sources, targets, cut_targets=False)
    if fitted.report():
        warnings.warn(fitted.report("run_outcome"), stacklevel=2)
    sources, targets = fitted.sources, fitted.targets
    if references is not None:
        references = [references[i] for i in fitted.ids]
    lp = np.zeros(len(sources))
    outputs: list[list[int]] = []
    with model.hooks(hooks or {}):
        for idx, b in corpus_batches(sources, targets, pad_id=cfg.pad_id, start_id=cfg.start_id,
                                     batch_size=batch_size, order=range(len(sources)), device=model.device):
            logp = model(b.src, b.tgt_in).float().log_softmax(-1).gather(-1, b.tgt_out[..., None])[..., 0]
            lp[idx] = (logp * (b.tgt_out != cfg.pad_id)).sum(1).double().cpu().numpy()
            if decode:
                outputs += [h.tokens for h in generate(model, b.src, search).best]
    out = Outcome(lp, outputs, skipped=fitted.skipped)
    if decode and detokenize is not None and references is not None:
        s = score([detokenize(o) for o in outputs], [list(references)])
        out.bleu, out.chrf = s.bleu, s.chrf
    return out


def compare(base: Outcome, edited: Outcome) -> dict[str, float]:
    """The deltas one table row holds."""
    row = {"d_ref_log_prob": float((edited.ref_log_prob - base.ref_log_prob).mean())}
    if base.outputs and edited.outputs:
        changed = [a != b for a, b in zip(base.outputs, edited.outputs)]
        tok = [1.0 - difflib.SequenceMatcher(a=a, b=b, autojunk=False).ratio()
               for a, b in zip(base.outputs, edited.outputs)]
        row["changed_sentences"] = float(np.mean(changed))
        row["changed_tokens"] = float(np.mean(tok))
    if base.bleu is not None and edited.bleu is not None:
        row["d_bleu"] = edited.bleu - base.bleu
        row["d_chrf"] = edited.chrf - base.chrf
    return row


def intervention_effect(model, hooks: dict, sources, targets, *, baseline: Outcome | None = None,
                        **options) -> dict[str, float]:
    """Deltas of one intervention (a {hook name: fn} dict, e.g. from `ablate_heads`) against the model."""
    base = baseline or run_outcome(model, sources, targets, **options)
    return compare(base, run_outcome(model, sources, targets, hooks=hooks, **options))


def head_importance(model, sources, targets, *, kinds: Sequence[str] = KINDS, units: str = "head", **options):
    """One ablation per head (or per block with units="block") over the test set; DataFrame sorted by
    the drop in reference log-probability, most important first. `options` go to `run_outcome`
    (decode, detokenize, references, batch_size, config, max_len_a/max_len_b ...); a `TranslationModel`
    decodes with its own settings."""
    import pandas as pd

    model, config = decoding_setup(model, options.pop("config", None))
    options["config"] = config
    if units not in UNITS:
        raise ValueError(f"units must be one of {UNITS}, got {units!r}")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown kinds {bad}; known: {KINDS}")
    base = run_outcome(model, sources, targets, **options)
    rows = []
    for kind in kinds:
        n_layers = len(model.enc) if kind == "enc_self" else len(model.dec)
        n_heads = heads_of(model.cfg, kind)  # encoder and decoder may differ
        for layer in range(n_layers):
            groups = [[h] for h in range(n_heads)] if units == "head" else [list(range(n_heads))]
            for heads in groups:
                edited = run_outcome(model, sources, targets, hooks=ablate_heads({(kind, layer): heads}), **options)
                one = units == "head"
                rows.append({"head_id": str(Head(kind, layer, heads[0])) if one else None, "kind": kind,
                             "layer": layer, "head_index": heads[0] if one else "all", **compare(base, edited)})
    df = pd.DataFrame(rows)
    df.attrs["baseline"] = {"ref_log_prob": float(base.ref_log_prob.mean()), "bleu": base.bleu, "chrf": base.chrf}
    return df.sort_values("d_ref_log_prob", kind="stable").reset_index(drop=True)


@torch.no_grad()
def patch_effect(model, name: str, src: torch.Tensor, tgt: torch.Tensor, donor_src: torch.Tensor,
                 donor_tgt: torch.Tensor, *, positions=None, heads=None) -> dict[str, torch.Tensor]:
    """Activation patching: run (src, tgt) with `name` replaced by its value on (donor_src, donor_tgt).

    Returns the clean, donor and patched log-probabilities (B, T, V) so callers can measure any token.
    Shapes must agree where the activation lives (same batch, same lengths along that tensor).
    """
    _, donor = model.run_with_cache(donor_src, donor_tgt, names=[name])
    clean = model(src, tgt).float().log_softmax(-1)
    donor_lp = model(donor_src, donor_tgt).float().log_softmax(-1)
    with model.intervene({name: patch(donor[name], positions=positions, heads=heads)}):
        patched = model(src, tgt).float().log_softmax(-1)
    return {"clean": clean, "donor": donor_lp, "patched": patched}

"""Feature dashboards as Neuronpedia's dashboard batches: the `batch-N.json` files SAEDashboard's NeuronpediaRunner
writes and Neuronpedia imports, in their field names, offline.

    fd = FeatureData.load(tm, "checkpoints/multi30k-de-en/features/hook_memory")
    paths = export_dashboards(fd, "np/hook_memory", model_id="multi30k-de-en", features=range(100))
    # np/hook_memory/batch-0.json (features 0..99 but the dead ones), np/hook_memory/skipped_indexes.json

The schema (`schemas/neuronpedia_batch.schema.json`) is written from SAEDashboard's
`sae_dashboard/neuronpedia/neuronpedia_dashboard.py` at db4839a; `tests/features/test_neuronpedia.py` validates
against it.
What each field holds here, from the dashboard (`FeatureData`) the app draws:

    activations      the top-activating examples (bin_min -1, bin_max the top value, bin_contains -1: how SAEDashboard
                     marks "TOP ACTIVATIONS"), then examples across equal-count activation bands (`quantile_contexts`;
                     bin_min / bin_max: the band's lowest and highest sampled activation, bin_contains: its share of
                     the sampled firings); each with its pieces (`tokens`, the feature's side: source pieces with
                     EOS, or the decoder input), the feature's activation at every piece (`values`, recomputed) and
                     the firing piece (`qualifying_token_index`)
    pos_str / pos_values, neg_str / neg_values
                     the direct logit effect of the decoder direction (`direct_effects`: tokens raised and lowered,
                     centred logits per unit activation); logits_hist_data_*: a 50-bin histogram of it over the
                     whole target vocabulary (SAEDashboard's HistogramData: bar values are bin centres)
    frac_nonzero     the share of corpus tokens it fires on; freq_hist_data_*: its non-zero activations' histogram
                     (`FeatureData.histogram`: log-spaced bins, 4 per octave; bar values are bin centres)
    n_prompts_total  sentences of the statistics corpus (`dataset`) that any feature's examples come from;
                     n_tokens_in_prompt: the longest of them on the feature's side, in pieces
    left empty       neuron alignment, correlated neurons and features, decoder_weights_dist (SAEDashboard leaves
                     them empty too when it does not compute its feature tables)

Dead features (no firing in the statistics) are not written; `skipped_indexes.json` lists them, as SAEDashboard does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ..core.batching import teacher_forced
from ..core.protocols import Progress
from .dashboard import Context, FeatureData
from .sites import capture_site

SCHEMA = Path(__file__).with_name("schemas") / "neuronpedia_batch.schema.json"
LOGIT_BINS = 50  # SAEDashboard's histograms


def histogram(values: torch.Tensor, bins: int = LOGIT_BINS) -> tuple[list[float], list[int]]:
    """(bin centres, counts) of `values` on `bins` equal bins from their min to their max (SAEDashboard's
    HistogramData.from_data)."""
    values = values.float().flatten()
    if values.numel() == 0:
        return [], []
    lo, hi = float(values.min()), float(values.max())
    edges = torch.linspace(lo, hi, bins + 1)
    centres = (edges[:-1] + (hi - lo) / bins / 2).tolist()
    return centres, torch.histc(values, bins=bins, min=lo, max=hi).int().tolist()


def _bands(fd: FeatureData, feature: int, bands: int) -> list[tuple[str, float, float, float]]:
    """(label, lowest, highest, share) of each non-empty equal-count band of the sampled firings, weakest first: the
    bands `FeatureData.quantile_contexts` draws from."""
    found = fd.stats.samples(feature)
    n = len(found)
    out = []
    for b in range(bands):
        lo, hi = n * b // bands, n * (b + 1) // bands
        if hi > lo:
            out.append((f"{100 * b // bands}-{100 * (b + 1) // bands} %", found[lo][0], found[hi - 1][0],
                        (hi - lo) / n))
    return out


@torch.no_grad()
def _values(fd: FeatureData, feature: int, contexts: list[Context]) -> list[list[float]]:
    """The feature's activation at every piece of each context's sentence (its side), one forward pass."""
    s, cfg = fd.stats, fd.tm.model.cfg
    row = {int(cid): j for j, cid in enumerate(s.sentence_ids)}
    rows = [row[c.sentence] for c in contexts]
    batch = teacher_forced([[*s.sentences_src[j], cfg.eos_id] for j in rows],
                           [[*s.sentences_tgt[j], cfg.eos_id] for j in rows], pad_id=cfg.pad_id,
                           start_id=cfg.start_id, device=fd.tm.device)
    acts = capture_site(fd.tm.model, batch.src, batch.tgt_in, fd.site)[fd.site.hook_in]
    feats = fd.d.encode(acts.float())[..., feature]  # (B, L): only this feature's column is kept
    return [feats[i, : len(c.pieces)].tolist() for i, c in enumerate(contexts)]


def _activation(context: Context, values: list[float], bin_min: float, bin_max: float,
                bin_contains: float) -> dict[str, Any]:
    return {"bin_min": bin_min, "bin_max": bin_max, "bin_contains": bin_contains, "tokens": list(context.pieces),
            "values": values, "qualifying_token_index": context.position}


def feature_dashboard(fd: FeatureData, feature: int, *, logits: int = 10, bands: int = 5, per_band: int = 2,
                      n_tokens_in_prompt: int | None = None) -> dict[str, Any]:
    """One feature's dashboard as a Neuronpedia batch's feature entry (see the module docstring)."""
    f = fd.check(feature)
    summary = fd.summary(f)
    s = fd.stats
    top = fd.contexts(f, aligned=False)  # Neuronpedia shows no aligned output word: no forward pass for it
    quantile = fd.quantile_contexts(f, bands=bands, per_band=per_band, aligned=False)
    values = _values(fd, f, top + quantile) if top or quantile else []
    activations = [_activation(c, v, -1, top[0].value, -1) for c, v in zip(top, values)]
    by_label = {label: (lo, hi, share) for label, lo, hi, share in _bands(fd, f, bands)}
    for c, v in zip(quantile, values[len(top):]):
        lo, hi, share = by_label[c.band]
        activations.append(_activation(c, v, lo, hi, share))

    effects = fd.direct_effects(f, top=logits)
    hist_values, hist_heights = histogram(effects["logits"]) if effects["logits"] is not None else ([], [])
    left, right, counts = fd.histogram(f)
    if n_tokens_in_prompt is None:
        n_tokens_in_prompt = longest_sentence(fd)
    return {
        "feature_index": f,
        "neuron_alignment_indices": [], "neuron_alignment_values": [], "neuron_alignment_l1": [],
        "correlated_neurons_indices": [], "correlated_neurons_l1": [], "correlated_neurons_pearson": [],
        "correlated_features_indices": [], "correlated_features_l1": [], "correlated_features_pearson": [],
        "neg_str": [e["token"] for e in effects["lowers"]], "neg_values": [e["logit"] for e in effects["lowers"]],
        "pos_str": [e["token"] for e in effects["raises"]], "pos_values": [e["logit"] for e in effects["raises"]],
        "frac_nonzero": summary["frequency"],
        "freq_hist_data_bar_values": [(a + b) / 2 for a, b in zip(left, right)],
        "freq_hist_data_bar_heights": counts,
        "logits_hist_data_bar_heights": hist_heights, "logits_hist_data_bar_values": hist_values,
        "n_prompts_total": len(s.sentence_ids), "n_tokens_in_prompt": n_tokens_in_prompt,
        "dataset": summary["corpus"], "decoder_weights_dist": [], "activations": activations,
    }


def longest_sentence(fd: FeatureData) -> int:
    """Pieces of the longest statistics sentence on the feature's side (source with EOS, or start + target)."""
    rows = fd.stats.sentences_src if fd.site.side == "src" else fd.stats.sentences_tgt
    return max((len(r) + 1 for r in rows), default=0)


def site_layer(name: str) -> int:
    """The layer a site sits in (enc.N... / dec.N...); 0 for the stacks' top hooks (embeddings, hook_memory)."""
    m = re.match(r"^(?:enc|dec)\.(\d+)\.", name + ".")
    return int(m.group(1)) if m else 0


def export_dashboards(fd: FeatureData, out_dir: str | Path, *, model_id: str, sae_set: str | None = None,
                      layer: int | None = None, features: Iterable[int] | None = None, batch_size: int = 128,
                      logits: int = 10, bands: int = 5, per_band: int = 2,
                      progress: Progress | None = None) -> list[Path]:
    """Write `batch-N.json` files of `batch_size` features each (default: every feature) and
    `skipped_indexes.json` (the dead ones) into `out_dir`; returns the batch files. `sae_set` defaults to the
    dictionary's name, `layer` to the site's layer."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    s = fd.stats
    if s is None:
        raise ValueError(f"{fd.name} has no stats.safetensors: run `workbench features stats` first")
    wanted = [fd.check(f) for f in (range(fd.n_features) if features is None else features)]
    live = [f for f in wanted if int(s.count[f]) > 0]
    dead = [f for f in wanted if int(s.count[f]) == 0]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sae_set = sae_set or fd.name
    layer = site_layer(fd.site.name) if layer is None else layer
    longest = longest_sentence(fd)
    paths = []
    for start in range(0, len(live), batch_size):
        entries = []
        for f in live[start : start + batch_size]:
            entries.append(feature_dashboard(fd, f, logits=logits, bands=bands, per_band=per_band,
                                             n_tokens_in_prompt=longest))
            if progress is not None:
                progress(start + len(entries), len(live))
        batch = {"model_id": model_id, "layer": layer, "sae_set": sae_set, "features": entries}
        path = out_dir / f"batch-{len(paths)}.json"
        path.write_text(json.dumps(batch, ensure_ascii=False) + "\n", encoding="utf-8")
        paths.append(path)
    skipped = {"model_id": model_id, "layer": str(layer), "sae_set": sae_set, "skipped_indexes": dead}
    (out_dir / "skipped_indexes.json").write_text(json.dumps(skipped) + "\n", encoding="utf-8")
    return paths


def validate_batch(batch: dict[str, Any]) -> None:
    """Raise `jsonschema.ValidationError` unless `batch` matches Neuronpedia's batch schema, and ValueError when an
    example's tokens and values differ in length or its qualifying token lies outside them."""
    import jsonschema  # optional: only validation needs it (it comes with altair)

    jsonschema.validate(batch, json.loads(SCHEMA.read_text(encoding="utf-8")))
    for feature in batch["features"]:
        for a in feature["activations"]:
            if len(a["tokens"]) != len(a["values"]) or not 0 <= a["qualifying_token_index"] < len(a["tokens"]):
                raise ValueError(f"feature {feature['feature_index']}: an example has {len(a['tokens'])} tokens, "
                                 f"{len(a['values'])} values, qualifying token {a['qualifying_token_index']}")

"""Dictionary features as circuit-tracer's feature files: what its graph viewer loads, as `SCAN/INDEX.json`, to show
a feature node's examples, top and bottom tokens and activation histogram.

    fd = FeatureData.load(tm, "checkpoints/multi30k-de-en/features/hook_memory")
    export_circuit_tracer_features(fd, "graph_files/features/hook_memory", features=[17, 905])
    # a graph file whose feature nodes name this folder: circuit_tracer_graph(..., feature_scans={"hook_memory":
    #     "./data/features/hook_memory"}) (circuit-tracer's server maps ./data/ to its --graph_file_dir)

The schema (`schemas/circuit_tracer_feature.schema.json`) is generated from circuit-tracer's
`frontend/feature_models.py` at d797c82. The content is the Neuronpedia entry's (`features.neuronpedia`):

    examples_quantiles  "Top activations" (the top contexts), then each activation band of `quantile_contexts`,
                        strongest first, named by its range; an example whose sentence appeared in an earlier group is
                        marked `is_repeated_datapoint` (the viewer fades it)
    top_logits, bottom_logits    the direct logit effect's tokens (`direct_effects`)
    histogram           the corpus activation counts (the statistics' log-spaced bins, each counted in the equal-width
                        bin from 0 to `act_max` that holds its geometric centre: the viewer draws equal-width bins)
    quantile_values     the activation below which 1 %, 2 %, ..., 100 % of the firings fall (the upper edge of the
                        log-spaced bin where the share is reached, at most the maximum): the viewer's "NNpct"
    act_min, act_max    0 and the maximum activation on the corpus
    activation_frequency         the share of tokens it fires on

Dead features get no file: the viewer then shows the feature as dead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ..core.protocols import Progress
from .dashboard import FeatureData
from .neuronpedia import feature_dashboard, longest_sentence
from .stats import BIN_EDGES

SCHEMA = Path(__file__).with_name("schemas") / "circuit_tracer_feature.schema.json"
HISTOGRAM_BINS = 40


def _linear_histogram(counts: torch.Tensor, act_max: float, bins: int) -> list[float]:
    """Log-spaced bin counts moved to `bins` equal-width bins over [0, act_max], each by its geometric centre."""
    centres = (BIN_EDGES[:-1] * BIN_EDGES[1:]).sqrt()
    where = (centres / max(act_max, 1e-30) * bins).long().clamp(0, bins - 1)
    out = torch.zeros(bins, dtype=torch.float64)
    out.index_add_(0, where, counts.double())
    return out.tolist()


def _quantile_values(counts: torch.Tensor, act_max: float) -> list[float]:
    """For q = 1..100 %, the upper edge of the log-spaced bin where the firings' cumulative share reaches q."""
    cum = counts.double().cumsum(0) / counts.sum().clamp(min=1)
    steps = torch.arange(1, 101, dtype=torch.float64) / 100
    idx = torch.searchsorted(cum, steps - 1e-12).clamp(max=len(counts) - 1)
    return [min(float(BIN_EDGES[i + 1]), act_max) for i in idx.tolist()]


def circuit_tracer_feature(fd: FeatureData, feature: int, *, entry: dict[str, Any] | None = None,
                           bins: int = HISTOGRAM_BINS) -> dict[str, Any]:
    """One feature's circuit-tracer feature file (see the module docstring); `entry`: its Neuronpedia entry, when
    already computed (`feature_dashboard`)."""
    f = fd.check(feature)
    if entry is None:
        entry = feature_dashboard(fd, f, n_tokens_in_prompt=longest_sentence(fd))
    s = fd.stats
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for a in entry["activations"]:
        key = ("top",) if a["bin_contains"] == -1 else (a["bin_min"], a["bin_max"])
        groups.setdefault(key, []).append(a)
    ordered = [k for k in groups if k == ("top",)] + sorted((k for k in groups if k != ("top",)), reverse=True)
    seen: set[tuple[str, ...]] = set()
    quantiles = []
    for key in ordered:
        examples = []
        for a in groups[key]:
            tokens = tuple(a["tokens"])
            examples.append({"tokens_acts_list": a["values"], "train_token_ind": a["qualifying_token_index"],
                             "is_repeated_datapoint": tokens in seen, "tokens": list(tokens)})
            seen.add(tokens)
        name = "Top activations" if key == ("top",) else f"Activations {key[0]:.3g} to {key[1]:.3g}"
        quantiles.append({"quantile_name": name, "examples": examples})
    act_max = float(s.max[f])
    counts = s.hist[f]
    return {"transcoder_id": fd.name, "index": f, "examples_quantiles": quantiles, "top_logits": entry["pos_str"],
            "bottom_logits": entry["neg_str"], "act_min": 0.0, "act_max": act_max,
            "quantile_values": _quantile_values(counts, act_max), "histogram": _linear_histogram(counts, act_max, bins),
            "activation_frequency": entry["frac_nonzero"]}


def export_circuit_tracer_features(fd: FeatureData, out_dir: str | Path, *, features: Iterable[int] | None = None,
                                   progress: Progress | None = None) -> list[Path]:
    """Write `INDEX.json` for each live feature of `features` (default: all) into `out_dir`; returns the files."""
    if fd.stats is None:
        raise ValueError(f"{fd.name} has no stats.safetensors: run `workbench features stats` first")
    wanted = [fd.check(f) for f in (range(fd.n_features) if features is None else features)]
    live = [f for f in wanted if int(fd.stats.count[f]) > 0]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    longest = longest_sentence(fd)
    paths = []
    for n, f in enumerate(live, 1):
        data = circuit_tracer_feature(fd, f, entry=feature_dashboard(fd, f, n_tokens_in_prompt=longest))
        path = out_dir / f"{f}.json"
        path.write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")
        paths.append(path)
        if progress is not None:
            progress(n, len(live))
    return paths


def validate_feature(data: dict[str, Any]) -> None:
    """Raise `jsonschema.ValidationError` unless `data` matches circuit-tracer's feature schema."""
    import jsonschema  # optional: only validation needs it (it comes with altair)

    jsonschema.validate(data, json.loads(SCHEMA.read_text(encoding="utf-8")))

"""Dictionary features as circuit-tracer's feature files, on the shipped de->en model's dictionaries: the files
validate against the schema generated from circuit-tracer's pydantic models, hold the Neuronpedia entry's examples
and tokens, a histogram and quantiles that account for every firing of the corpus statistics, and dead features get
no file (the viewer shows them as dead)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from dictionary_helpers import site_with_a_dead_feature
from model_helpers import ROOT

from workbench.features.circuit_tracer import (
    SCHEMA,
    circuit_tracer_feature,
    export_circuit_tracer_features,
    validate_feature,
)
from workbench.features.dashboard import FeatureData
from workbench.features.neuronpedia import feature_dashboard
from workbench.features.stats import BIN_EDGES

CKPT = ROOT / "checkpoints" / "multi30k-de-en"


@pytest.fixture(scope="module")
def tm():
    from workbench.decoding.translator import load

    return load(CKPT)


@pytest.mark.parametrize("site", ["hook_memory", "dec.1.ffn"])
def test_feature_files_hold_the_dashboards_examples_and_the_corpus_counts(tm, site, tmp_path):
    fd = FeatureData.load(tm, CKPT / "features" / site)
    s = fd.stats
    live = [f for f in range(fd.n_features) if int(s.count[f]) > 0][:2]
    dead = [f for f in range(fd.n_features) if int(s.count[f]) == 0][:1]  # (none in dec.1.ffn: --rare-floor)
    assert dead or site != "hook_memory", "hook_memory has dead features: their skipping is tested on one"
    paths = export_circuit_tracer_features(fd, tmp_path, features=[*live, *dead])
    assert [p.name for p in paths] == [f"{f}.json" for f in live]
    assert not any((tmp_path / f"{f}.json").exists() for f in dead)
    for f, path in zip(live, paths):
        data = json.loads(path.read_text(encoding="utf-8"))
        validate_feature(data)
        entry = feature_dashboard(fd, f)
        assert (data["transcoder_id"], data["index"]) == (site, f)
        assert (data["top_logits"], data["bottom_logits"]) == (entry["pos_str"], entry["neg_str"])
        assert data["activation_frequency"] == entry["frac_nonzero"] and data["act_max"] == float(s.max[f])
        examples = [e for q in data["examples_quantiles"] for e in q["examples"]]
        assert [(e["tokens"], e["tokens_acts_list"], e["train_token_ind"]) for e in examples] == [
            (a["tokens"], a["values"], a["qualifying_token_index"]) for a in _strongest_first(entry["activations"])]
        assert data["examples_quantiles"][0]["quantile_name"] == "Top activations"
        firsts = {}
        for e in examples:  # an example is "repeated" exactly when its sentence came earlier
            assert e["is_repeated_datapoint"] == (tuple(e["tokens"]) in firsts)
            firsts.setdefault(tuple(e["tokens"]), e)
        assert sum(data["histogram"]) == int(s.count[f]) and len(data["histogram"]) == 40
        q = data["quantile_values"]
        assert len(q) == 100 and q == sorted(q) and q[-1] == pytest.approx(data["act_max"])
        # the share of firings in the log-spaced bins up to a quantile value reaches that quantile
        cum = s.hist[f].double().cumsum(0) / int(s.count[f])
        for pct in (10, 50, 90):
            upto = int((BIN_EDGES[1:] <= q[pct - 1] * (1 + 1e-6)).sum())
            assert float(cum[upto - 1]) >= pct / 100 - 1e-9 or q[pct - 1] == pytest.approx(data["act_max"])


def _strongest_first(activations):
    top = [a for a in activations if a["bin_contains"] == -1]
    bands = {}
    for a in activations:
        if a["bin_contains"] != -1:
            bands.setdefault((a["bin_min"], a["bin_max"]), []).append(a)
    return top + [a for key in sorted(bands, reverse=True) for a in bands[key]]


def test_the_schema_is_circuit_tracers_and_catches_a_broken_file(tm):
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert "d797c824c0ffe3a0274071e32d92962a36656212" in schema["$comment"]
    fd = FeatureData.load(tm, CKPT / "features" / "dec.1.ffn")
    f = next(f for f in range(fd.n_features) if int(fd.stats.count[f]) > 0)
    good = json.loads(json.dumps(circuit_tracer_feature(fd, f)))
    for breaking in (lambda d: d.pop("histogram"), lambda d: d.update(index="7"),
                     lambda d: d["examples_quantiles"][0]["examples"][0].pop("train_token_ind")):
        bad = json.loads(json.dumps(good))
        breaking(bad)
        with pytest.raises(jsonschema.ValidationError):
            validate_feature(bad)
    with pytest.raises(ValueError, match="stats"):
        export_circuit_tracer_features(FeatureData(tm, fd.d), "unused")
    assert torch.equal(fd.stats.hist[f].sum(), fd.stats.count[f])


def test_the_export_command(tmp_path, capsys):
    from workbench.cli import main

    site, live, dead = site_with_a_dead_feature(CKPT / "features")  # picked by count
    assert main(["features", "export-circuit-tracer", str(CKPT / "features" / site), "--checkpoint",
                 str(CKPT), "--out", str(tmp_path), "--features", f"{live[0]},{dead}"]) == 0
    assert "1 feature files" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{live[0]}.json"]  # the dead one has no file
    validate_feature(json.loads((tmp_path / f"{live[0]}.json").read_text(encoding="utf-8")))

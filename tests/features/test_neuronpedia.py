"""Feature dashboards as Neuronpedia dashboard batches, on the shipped de->en model's dictionaries (an SAE on
hook_memory, a transcoder on dec.1.ffn): the files validate against the schema written from SAEDashboard's
Neuronpedia classes (which a trimmed feature of SAEDashboard's own acceptance output passes), hold the dashboard's
own numbers (logit effects, density, histogram, examples, bands) and per-token activations that agree with the
values the corpus statistics recorded, and list the dead features as skipped."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest
import torch
from dictionary_helpers import site_with_a_dead_feature
from model_helpers import ROOT

from workbench.features.dashboard import FeatureData
from workbench.features.neuronpedia import (
    SCHEMA,
    export_dashboards,
    feature_dashboard,
    histogram,
    site_layer,
    validate_batch,
)

CKPT = ROOT / "checkpoints" / "multi30k-de-en"


@pytest.fixture(scope="module")
def tm():
    from workbench.decoding.translator import load

    return load(CKPT)


@pytest.mark.parametrize("site", ["hook_memory", "dec.1.ffn"])
def test_shipped_dictionary_exports_the_dashboards_numbers(tm, site, tmp_path):
    fd = FeatureData.load(tm, CKPT / "features" / site)
    s = fd.stats
    # live features with firings enough for all five quantile bands (two examples each)
    live = [f for f in range(fd.n_features) if int(s.count[f]) >= 10][:3]
    dead = [f for f in range(fd.n_features) if int(s.count[f]) == 0][:1]  # none in dec.1.ffn (--rare-floor)
    assert dead or site != "hook_memory", "hook_memory has dead features: the skip list is tested on one"
    paths = export_dashboards(fd, tmp_path, model_id="multi30k-de-en", features=[*live, *dead], batch_size=2)
    assert [p.name for p in paths] == ["batch-0.json", "batch-1.json"]
    batches = [json.loads(p.read_text(encoding="utf-8")) for p in paths]
    for b in batches:
        validate_batch(b)
        assert (b["model_id"], b["layer"], b["sae_set"]) == ("multi30k-de-en", site_layer(site), site)
    skipped = json.loads((tmp_path / "skipped_indexes.json").read_text(encoding="utf-8"))
    assert skipped["skipped_indexes"] == dead and skipped["layer"] == str(site_layer(site))
    entries = [e for b in batches for e in b["features"]]
    assert [e["feature_index"] for e in entries] == live

    for e in entries:
        f = e["feature_index"]
        summary, de = fd.summary(f), fd.direct_effects(f)
        assert e["pos_str"] == [x["token"] for x in de["raises"]] and e["pos_values"] == [x["logit"]
                                                                                           for x in de["raises"]]
        assert e["neg_str"] == [x["token"] for x in de["lowers"]] and e["neg_values"] == [x["logit"]
                                                                                           for x in de["lowers"]]
        assert e["pos_values"] == sorted(e["pos_values"], reverse=True) and max(e["neg_values"]) < 0
        # both sites have a direct path to the logits (hook_memory: the cross-attention OV circuits): the
        # histogram holds the whole target vocabulary
        assert sum(e["logits_hist_data_bar_heights"]) == tm.model.cfg.tgt_vocab
        assert len(e["logits_hist_data_bar_values"]) == 50
        centres = e["logits_hist_data_bar_values"]
        half = (centres[1] - centres[0]) / 2  # the histogram spans the effect's range: its ends are the top lists'
        assert centres[0] - half == pytest.approx(e["neg_values"][0], rel=1e-4)
        assert centres[-1] + half == pytest.approx(e["pos_values"][0], rel=1e-4)
        assert e["frac_nonzero"] == summary["frequency"] > 0
        left, right, counts = fd.histogram(f)
        assert e["freq_hist_data_bar_heights"] == counts and sum(counts) == int(s.count[f])
        assert all(a < v < b for a, v, b in zip(left, e["freq_hist_data_bar_values"], right))
        assert (e["n_prompts_total"], e["dataset"]) == (len(s.sentence_ids), "multi30k:train")

        top, quantile = fd.contexts(f), fd.quantile_contexts(f)
        plain = fd.contexts(f, aligned=False) + fd.quantile_contexts(f, aligned=False)  # what the export reads
        assert [(c.pieces, c.position, c.value, c.band) for c in plain] == [(c.pieces, c.position, c.value, c.band)
                                                                           for c in top + quantile]
        if fd.site.side == "src":
            assert {(c.aligned, c.aligned_position) for c in plain} == {("", -1)}
            assert all(c.aligned and c.aligned_position >= 0 for c in top)
        acts = e["activations"]
        assert len(acts) == len(top) + len(quantile) > 0
        for a, c in zip(acts, top + quantile):
            assert a["tokens"] == c.pieces and a["qualifying_token_index"] == c.position
            assert len(a["values"]) == len(a["tokens"]) <= e["n_tokens_in_prompt"]
            # recomputed per token, against the value the corpus pass stored for the firing token
            assert a["values"][c.position] == pytest.approx(c.value, rel=1e-4, abs=1e-5)
            assert min(a["values"]) >= 0
        for a in acts[: len(top)]:
            assert (a["bin_min"], a["bin_max"], a["bin_contains"]) == (-1, top[0].value, -1)
        shares = {}
        for a, c in zip(acts[len(top):], quantile):
            assert a["bin_min"] <= c.value <= a["bin_max"]
            shares[c.band] = a["bin_contains"]
        assert len(shares) == 5 and math.isclose(sum(shares.values()), 1.0)  # every band drawn; their shares
        bands = sorted({(a["bin_min"], a["bin_max"]) for a in acts[len(top):]})  # weakest first, none overlapping
        assert all(lo <= hi <= next_lo for (lo, hi), (next_lo, _) in zip(bands, bands[1:]))


def test_histogram_is_saedashboards():
    """SAEDashboard's HistogramData.from_data: equal bins from the min to the max, bars at the bin centres,
    torch.histc counts (the max lands in the last bin)."""
    centres, counts = histogram(torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 4.0]), bins=4)
    assert centres == pytest.approx([0.5, 1.5, 2.5, 3.5]) and counts == [1, 1, 1, 3]
    assert histogram(torch.tensor([])) == ([], [])


# a feature of SAEDashboard's acceptance output (tests/acceptance/test_simple/batch-1.json at db4839a, MIT
# licence), its lists cut to three entries and its examples to one of five tokens
SAEDASHBOARD_FEATURE = {
    "feature_index": 2, "neuron_alignment_indices": [88, 171, 27], "neuron_alignment_values": [0.109, 0.107, 0.103],
    "neuron_alignment_l1": [0.005, 0.005, 0.005], "correlated_neurons_indices": [480, 266, 87],
    "correlated_neurons_l1": [0.014, 0.014, 0.014], "correlated_neurons_pearson": [0.024, 0.023, 0.023],
    "correlated_features_indices": [2, 3], "correlated_features_l1": [0.0, 0.0],
    "correlated_features_pearson": [0.0, -0.0], "neg_str": ["ivil", " evasion", "chie"],
    "neg_values": [-0.724, -0.716, -0.711], "pos_str": [" MRI", "MRI", " ultrasound"],
    "pos_values": [3.121, 2.635, 2.313], "frac_nonzero": 0.00036, "freq_hist_data_bar_values": [0.008, 0.024, 0.04],
    "freq_hist_data_bar_heights": [14, 11, 13], "logits_hist_data_bar_heights": [11, 30, 120],
    "logits_hist_data_bar_values": [-0.704, -0.627, -0.55], "n_prompts_total": 5000, "n_tokens_in_prompt": 128,
    "dataset": "Skylion007/openwebtext", "decoder_weights_dist": [],
    "activations": [{"bin_min": -1, "bin_max": 0.8, "bin_contains": -1,
                     "tokens": [" under", " the", " microscope", ".", " The"], "values": [0.0, 0.0, 0.8, 0.0, 0.0],
                     "qualifying_token_index": 2, "dfa_values": [], "dfa_maxValue": 0, "dfa_targetIndex": -1}],
}


def test_the_schema_is_saedashboards_and_catches_broken_batches(tm, tmp_path):
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert "db4839a41116d729fc9f43c1878e7b8b157748ea" in schema["$comment"]
    validate_batch({"model_id": "gpt2-small", "layer": 0, "sae_set": "res-jb", "features": [SAEDASHBOARD_FEATURE]})

    fd = FeatureData.load(tm, CKPT / "features" / "dec.1.ffn")
    f = next(f for f in range(fd.n_features) if int(fd.stats.count[f]) > 0)
    good = {"model_id": "m", "layer": 1, "sae_set": "s", "features": [feature_dashboard(fd, f)]}
    validate_batch(json.loads(json.dumps(good)))
    for breaking in (lambda b: b["features"][0].pop("pos_str"), lambda b: b["features"][0].update(extra=1),
                     lambda b: b.update(layer="1"), lambda b: b["features"][0]["activations"][0].update(values="x")):
        bad = json.loads(json.dumps(good))
        breaking(bad)
        with pytest.raises(jsonschema.ValidationError):
            validate_batch(bad)
    bad = json.loads(json.dumps(good))
    bad["features"][0]["activations"][0]["values"].append(0.0)
    with pytest.raises(ValueError, match="tokens"):
        validate_batch(bad)
    with pytest.raises(ValueError, match="batch_size"):
        export_dashboards(fd, tmp_path, model_id="m", batch_size=0)
    with pytest.raises(ValueError, match="stats"):
        export_dashboards(FeatureData(tm, fd.d), tmp_path, model_id="m")
    with pytest.raises(ValueError, match="does not exist"):
        export_dashboards(fd, tmp_path, model_id="m", features=[fd.n_features])


def test_site_layer():
    assert [site_layer(s) for s in ("dec.1.ffn", "hook_memory", "enc.3.hook_resid_ffn", "dec.2.cross_attn.hook_out",
                                    "hook_tgt_embed")] == [1, 0, 3, 2, 0]


def test_the_export_command(tmp_path, capsys):
    from workbench.cli import main
    from workbench.cli.features import feature_list

    assert feature_list("0-2,7") == [0, 1, 2, 7] and feature_list(None) is None
    with pytest.raises(ValueError, match="ranges"):
        feature_list("3-1")
    site, live, dead = site_with_a_dead_feature(CKPT / "features")  # picked by count
    assert main(["features", "export-neuronpedia", str(CKPT / "features" / site), "--checkpoint", str(CKPT),
                 "--out", str(tmp_path), "--features", f"{live[0]}-{live[1]},{dead}", "--batch-size", "5",
                 "--layer", "7"]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "batch-0.json")]
    batch = json.loads((tmp_path / "batch-0.json").read_text(encoding="utf-8"))
    validate_batch(batch)
    assert [f["feature_index"] for f in batch["features"]] == live and batch["model_id"] == "multi30k-de-en"
    assert (batch["layer"], batch["sae_set"]) == (7, site)
    assert json.loads((tmp_path / "skipped_indexes.json").read_text(encoding="utf-8"))["skipped_indexes"] == [dead]

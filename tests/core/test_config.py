import dataclasses
import json

import pytest
from model_helpers import ROOT

from workbench import ModelConfig, presets
from workbench.core.config import override


def test_json_round_trip_keeps_every_field():
    cfg = presets.tiny(
        activation="swish", norm_first=True, positions="sinusoidal_t2t", position_offset=2,
        tie_embeddings="none", src_vocab=50, tgt_vocab=70, output_bias=True, layer_norm_eps=1e-6,
        decoder_start_id=2, emb_norm=True, attn_dropout=0.2, enc_layers=3, dec_layers=1,
    )
    again = ModelConfig.from_json(cfg.to_json())
    assert again == cfg
    assert json.loads(again.to_json()) == json.loads(cfg.to_json())


def test_json_ints_for_floats_round_trip():
    cfg = ModelConfig.from_dict({**presets.tiny().to_dict(), "dropout": 0})
    assert isinstance(cfg.dropout, float) and ModelConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(d_model=30, n_heads=4), "d_model (30) must be divisible by n_heads (4)"),
        (dict(tie_embeddings="all", src_vocab=10, tgt_vocab=12), "shared vocabulary"),
        (dict(activation="tanh"), "activation"),
        (dict(dropout=1.5), "dropout (1.5)"),
        (dict(pad_id=500), "pad_id (500)"),
        (dict(enc_layers="2"), "enc_layers"),
    ],
)
def test_invalid_configs_name_the_values(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        dataclasses.replace(presets.tiny(), **changes)


def test_unknown_keys_are_an_error():
    data = presets.tiny().to_dict() | {"n_layers": 3}
    with pytest.raises(ValueError, match="unknown ModelConfig keys \\['n_layers'\\]"):
        ModelConfig.from_dict(data)


def test_presets_match_the_paper():
    base, big = presets.base(), presets.big()
    assert (base.d_model, base.d_ff, base.n_heads, base.enc_layers, base.dropout) == (512, 2048, 8, 6, 0.1)
    assert (big.d_model, big.d_ff, big.n_heads, big.enc_layers, big.dropout) == (1024, 4096, 16, 6, 0.3)
    assert not base.norm_first and base.positions == "sinusoidal"


def test_override_parses_types_and_rejects_unknown_keys():
    cfg = override(presets.tiny(), ["--model.dropout=0.3", "--model.norm_first=True", "--train.lr=2"], "model")
    assert cfg.dropout == 0.3 and cfg.norm_first is True
    with pytest.raises(ValueError, match="unknown key 'dropuot'"):
        override(presets.tiny(), ["--dropuot=0.3"])
    with pytest.raises(ValueError, match="activation"):
        override(presets.tiny(), ["--activation=tanh"])


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_committed_training_config_loads_and_names_known_data(path):
    from workbench.corpus.data import DATASETS, MIXTURES
    from workbench.training.config import TrainConfig

    cfg = TrainConfig.load(path)
    assert cfg.dataset in {"copy", "files"} | set(DATASETS) | set(MIXTURES)
    from workbench.training import model_config

    model = model_config(cfg, cfg.vocab_size, cfg.vocab_size)
    assert model.d_model % model.n_heads == 0 and model.src_vocab == cfg.vocab_size


def test_per_stack_heads_and_ffn_width_default_to_the_shared_values():
    cfg = presets.tiny()
    assert [cfg.heads(s) for s in ("enc", "enc_self", "dec", "dec_self", "cross")] == [4] * 5
    assert (cfg.ffn_dim("encoder"), cfg.ffn_dim("decoder")) == (64, 64)
    odd = presets.tiny(enc_heads=2, dec_heads=8, enc_d_ff=48, dec_d_ff=80)
    assert (odd.heads("enc_self"), odd.heads("dec_self"), odd.heads("cross"), odd.heads("dec.1.cross_attn")) == (
        2, 8, 8, 8)
    assert (odd.head_dim("enc"), odd.head_dim("dec")) == (16, 4)
    assert (odd.ffn_dim("enc"), odd.ffn_dim("dec")) == (48, 80)
    with pytest.raises(ValueError, match="unknown stack 'middle'"):
        odd.heads("middle")


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(dec_heads=3), "d_model (32) must be divisible by dec_heads (3)"),
        (dict(enc_heads=0), "enc_heads (0) must be positive"),
        (dict(dec_d_ff=-4), "dec_d_ff (-4) must be positive"),
        (dict(enc_d_ff=2.5), "enc_d_ff = 2.5 does not fit"),
    ],
)
def test_invalid_per_stack_values_name_the_values(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        dataclasses.replace(presets.tiny(), **changes)


def test_per_stack_values_round_trip_and_old_config_json_still_loads():
    cfg = presets.tiny(enc_heads=2, dec_heads=8, enc_d_ff=48, dec_d_ff=80)
    saved = json.loads(cfg.to_json())
    assert (saved["enc_heads"], saved["dec_heads"], saved["enc_d_ff"], saved["dec_d_ff"]) == (2, 8, 48, 80)
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    old = {k: v for k, v in presets.tiny().to_dict().items() if k not in ("enc_heads", "dec_heads", "enc_d_ff",
                                                                          "dec_d_ff")}
    loaded = ModelConfig.from_dict(old)
    assert loaded == presets.tiny() and loaded.heads("dec") == 4 and loaded.ffn_dim("enc") == 64


# -------------------------------------------------------------------- old names: read from files only


def test_shipped_configs_use_current_names_only(recwarn):
    from workbench.training.config import TrainConfig

    for path in sorted((ROOT / "configs").glob("*.toml")):
        TrainConfig.load(path)
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)]


def test_old_train_key_loads_from_a_file_only(tmp_path, recwarn):
    from workbench.training.config import TrainConfig

    path = tmp_path / "old.toml"
    path.write_text("[train]\nmax_len = 120\nmax_steps = 5\n", encoding="utf-8")
    cfg = TrainConfig.load(path)
    assert cfg.max_pair_len == 120 and "max_len" not in cfg.to_dict() and not recwarn.list
    assert not hasattr(cfg, "max_len")
    with pytest.raises(ValueError, match="unknown key 'max_len' for TrainConfig"):
        override(cfg, ["--max_len=7"])
    with pytest.raises(TypeError, match="max_len"):
        TrainConfig(max_steps=5, max_len=1)
    both = tmp_path / "both.json"  # both spellings in one file: an error, not a silent choice
    both.write_text(json.dumps({"max_len": 1, "max_pair_len": 2, "max_steps": 5}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"unknown TrainConfig keys \['max_len'\]"):
        TrainConfig.load(both)


def test_decode_token_budget_has_the_training_name():
    from workbench.core.config import DecodeConfig

    assert DecodeConfig.from_dict({"batch_tokens": 7}).max_tokens == 7  # checkpoints' meta.json from before
    with pytest.raises(TypeError, match="batch_tokens"):
        DecodeConfig(batch_tokens=100)
    assert not hasattr(DecodeConfig(), "batch_tokens")


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), -0.5])
def test_alpha_must_be_finite_and_not_negative(alpha):
    from workbench.core.config import DecodeConfig

    with pytest.raises(ValueError, match=rf"alpha \({alpha}\) must be a finite number >= 0"):
        DecodeConfig(alpha=alpha)


def test_noam_factor_is_its_own_setting():
    from workbench.training.config import TrainConfig

    with pytest.raises(ValueError, match=r"schedule 'noam' needs noam_factor"):
        TrainConfig(max_steps=5, schedule="noam", lr=2.0)
    old = TrainConfig.from_dict({"max_steps": 5, "schedule": "noam", "lr": 2.0})  # a file from before noam_factor
    assert old.noam_factor == 2.0
    new = TrainConfig(max_steps=5, schedule="noam", noam_factor=1.5)
    assert new.noam_factor == 1.5
    with pytest.raises(ValueError, match=r"noam_factor \(0.0\) must be a positive number"):
        TrainConfig(max_steps=5, schedule="noam", noam_factor=0.0)


def test_one_override_parser_for_the_training_command_line():
    from workbench.training.config import TrainConfig

    cfg = TrainConfig(max_steps=5, model={"dropout": 0.1})
    out = override(cfg, ["--lr=1e-3", "--train.warmup=10", "--model.d_model=64", "--model.dropout=0.2",
                         "--out_dir=runs/x"], prefix="train")
    assert (out.lr, out.warmup, out.out_dir) == (1e-3, 10, "runs/x")
    assert out.model == {"dropout": 0.2, "d_model": 64} and cfg.model == {"dropout": 0.1}  # a copy, not an edit
    with pytest.raises(ValueError, match="unknown key 'lrate' for TrainConfig"):
        override(cfg, ["--lrate=1"], prefix="train")
    with pytest.raises(ValueError, match="must look like --key=value"):
        override(cfg, ["lr=1"], prefix="train")

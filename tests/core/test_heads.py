"""One home for attention kinds, their hook paths and a head's spelling."""

import pytest

from workbench import presets
from workbench.core.heads import KINDS, Head, block_path, hook_name, kind_of
from workbench.core.model import Transformer


def test_every_kind_names_real_hook_points():
    model = Transformer(presets.tiny(src_vocab=20, tgt_vocab=20))
    names = set(model.hook_names())
    for kind in KINDS:
        for layer in range(2):
            assert hook_name(kind, layer, "hook_probs") in names
            assert hook_name(kind, layer, "hook_context") in names
    probs = model.hook_names("*.hook_probs")
    assert [kind_of(n) for n in probs].count("enc_self") == model.cfg.enc_layers
    assert {kind_of(n) for n in probs} == set(KINDS)
    assert kind_of("hook_memory") is None and kind_of("enc.0.ffn.hook_out") is None
    assert block_path("cross", "*") == "dec.*.cross_attn"
    with pytest.raises(ValueError, match=r"kind must be one of \('enc_self', 'dec_self', 'cross'\), got 'self'"):
        block_path("self", 0)


@pytest.mark.parametrize("spelled", ["cross:1:0", " cross:1:0", ("cross", 1, 0), ["cross", "1", "0"],
                                     Head("cross", 1, 0)])
def test_a_head_has_one_spelling(spelled):
    head = Head.parse(spelled)
    assert head == Head("cross", 1, 0)
    assert str(head) == "cross:1:0"
    assert (head.kind, head.layer, head.head) == ("cross", 1, 0)
    with pytest.raises(TypeError):  # a Head is not a tuple: no unpacking by position
        tuple(head)
    assert head.hook_name() == "dec.1.cross_attn.hook_context"
    assert Head.parse(str(head)) == head


@pytest.mark.parametrize("bad", ["cross:1", "cross:a:0", "crossx:1:0", "cross:-1:0", ("cross", -1, 0), 5])
def test_misspelled_heads_are_refused(bad):
    with pytest.raises(ValueError, match="head"):
        Head.parse(bad)


def test_check_names_the_missing_head():
    cfg = presets.tiny(src_vocab=20, tgt_vocab=20)
    assert Head("enc_self", 0, 1).check(cfg) == Head("enc_self", 0, 1)
    with pytest.raises(ValueError, match=f"head cross:9:0 does not exist: this model has {cfg.dec_layers} cross "
                                         f"layers of {cfg.heads('dec')} heads"):
        Head("cross", 9, 0).check(cfg)


def test_ablation_reads_every_head_spelling():
    from workbench.analysis.circuits.ablation import check_heads

    cfg = presets.tiny(src_vocab=20, tgt_vocab=20)
    assert check_heads(cfg, ["cross:1:0", ("cross", 1, 2), Head("enc_self", 0, 3)]) == {("cross", 1): [0, 2],
                                                                                        ("enc_self", 0): [3]}
    with pytest.raises(ValueError, match="head cross:7:0 does not exist"):
        check_heads(cfg, ["cross:7:0"])

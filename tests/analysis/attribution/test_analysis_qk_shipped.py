"""QK attribution on the shipped multi30k-de-en: exact with the shipped dictionaries, and its alignment head
(cross:0:2, the one head `workbench heads` gives the alignment role) attends to a source piece because of that
piece: the top term of its argmax edges involves the piece's own parts far more often than at a random piece of
the same row or at other heads' argmax edges (docs/analysis.md §10 has the figures on 50 sentences)."""

from __future__ import annotations

import pytest
import torch
from model_helpers import ROOT

from workbench.analysis.attribution.qk_attribution import GROUPS, OWN, own_word_check, qk_attribution
from workbench.core.batching import decoder_input
from workbench.decoding.translator import load
from workbench.features.dictionary import SparseDictionary
from workbench.features.stats import FeatureStats

CKPT = ROOT / "checkpoints" / "multi30k-de-en"
FEATURES = CKPT / "features"
PAIRS = [  # Multi30k test2016, lines 1-6
    ("Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.", "A man in an orange hat starring at something."),
    ("Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
     "A Boston Terrier is running on lush green grass in front of a white fence."),
    ("Ein Mädchen in einem Karateanzug bricht ein Brett mit einem Tritt.",
     "A girl in karate uniform breaking a stick with a front kick."),
    ("Fünf Leute in Winterjacken und mit Helmen stehen im Schnee mit Schneemobilen im Hintergrund.",
     "Five people wearing winter jackets and helmets stand in the snow, with snowmobiles in the background."),
    ("Leute Reparieren das Dach eines Hauses.", "People are fixing the roof of a house."),
    ("Eine Gruppe von Menschen steht vor einem Iglu.", "A group of people standing in front of an igloo."),
]


@pytest.fixture(scope="module")
def tm():
    return load(CKPT)


def _sentences(tm):
    cfg = tm.model.cfg
    for de, en in PAIRS:
        yield tm.encode_source(de)[0], decoder_input([*tm.tgt_tokenizer.encode(en), cfg.eos_id], cfg.start_id)


def test_exact_on_the_shipped_model_with_its_dictionaries(tm):
    model = tm.model
    src_ids, tgt_ids = next(_sentences(tm))
    src, tgt = torch.tensor([src_ids]), torch.tensor([tgt_ids])
    dicts = [SparseDictionary.load(d) for d in sorted(FEATURES.iterdir())]  # memory, cross outputs, dec.1.ffn
    name = model.dec[3].cross_attn.hook_scores.name
    _, trace = model.run_with_cache(src, tgt, names=[name])
    for head, t, s in ((0, 0, 0), (2, 5, 3), (3, 9, len(src_ids) - 1)):
        qk = qk_attribution(model, src, tgt, layer=3, head=head, t=t, s=s, dictionaries=dicts)
        score = float(trace[name][0, head, t, s])
        assert abs(qk.total - score) <= 1e-5 * max(1.0, abs(score))
        assert qk.meta["unused"] == [model.dec[3].cross_attn.hook_out.name]
        sites = {i.get("site") for i in qk.query_info if i["kind"] == "feature"}
        assert sites == {model.dec[i].cross_attn.hook_out.name for i in range(3)} | {"dec.1.ffn"}
        assert {i["kind"] for i in qk.key_info} == {"feature", "dict_bias", "dict_error", "qk_bias"}


def test_the_alignment_head_attends_for_the_piece_itself(tm):
    check = own_word_check(tm.model, _sentences(tm), layer=0, head=2)
    aligned, random_piece, other_heads = (check.share(g, OWN) for g in GROUPS)
    assert check.edges[GROUPS[0]] >= 50
    assert aligned > 0.5 and aligned > 2.5 * random_piece and aligned > 2.5 * other_heads
    token = [check.share(g, ("source token at s",)) for g in GROUPS]
    assert token[0] > 2 * max(token[1:])
    # the softmax's view: what raises the argmax piece above the row's other pieces is that piece's own parts
    contrast = [check.share(g, OWN, "contrast") for g in GROUPS]
    assert contrast[0] > 0.9 and contrast[0] > contrast[1] + 0.2


def test_with_the_memory_dictionary_the_top_feature_is_the_words_own_beyond_chance(tm):
    path = FEATURES / "hook_memory"
    check = own_word_check(tm.model, _sentences(tm), layer=0, head=2, dictionary=SparseDictionary.load(path),
                           stats=FeatureStats.load(path / "stats.safetensors"), contrast=False)
    reading = "key total, biases aside"
    aligned, random_piece, other_heads = (check.share(g, ("word feature",), reading) for g in GROUPS)
    # the k-16 dictionary has fewer active features per piece than the k-64 one the study ran on, so chance is higher
    # (0.23 on these sentences, against 0.06): twice chance is the bar, and above the two controls
    assert aligned > 2 * check.feature_chance and aligned > random_piece and aligned > other_heads

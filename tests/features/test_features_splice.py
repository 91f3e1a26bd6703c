"""A spliced dictionary's activations, reconstruction and error as hook points (core.splice, features.splice), and
steering translations with them: bit-identical outputs while nothing edits, the same values through the workbench's
hooks, plain PyTorch hooks and nnsight, edits equal to the plain replacement, and steering during greedy and beam
search equal to the same edit written as a hook."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_helpers import make_batch, make_model

from workbench import presets
from workbench.core.splice import FeatureEdit, edits_features, parse_steer, splice_at, steering_hooks
from workbench.decoding.translator import load
from workbench.features import DictionaryConfig, SparseDictionary, site_of, splice, splice_hooks, unsplice
from workbench.features.sites import capture_site

CKPT = Path(__file__).resolve().parents[2] / "checkpoints" / "multi30k-de-en"
SOURCES = ["Ein Mann mit einem roten Hut sitzt auf einer Bank.", "Zwei Hunde spielen im Schnee.",
           "Eine Frau liest ein Buch im Park."]


def _dictionary(model, transcoder: bool, seed: int = 0, n: int = 48, k: int = 6) -> SparseDictionary:
    d = model.cfg.d_model
    site_in = model.stream("dec").layers[1].sublayer("ffn").hook_block_in.name
    cfg = DictionaryConfig(site_in if transcoder else "hook_memory", d_in=d, d_sae=n, k=k,
                           d_out=d if transcoder else None, skip=transcoder,
                           hook_name_out=model.dec[1].ffn.hook_out.name if transcoder else None)
    torch.manual_seed(seed)
    dic = SparseDictionary(cfg)
    with torch.no_grad():
        dic.b_enc.normal_(0, 0.1)
        dic.b_dec.normal_(0, 0.3)
        if transcoder:
            dic.W_skip.normal_(0, 0.2)
    return dic.eval()


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def model_and_batch(request):
    cfg = presets.tiny(vocab=50, norm_first=request.param)
    return make_model(cfg), *make_batch(cfg)


def _add_zero(x, hook):
    return x + 0.0


@pytest.mark.parametrize("transcoder", [False, True], ids=["sae", "transcoder"])
def test_a_splice_is_part_of_the_tree_and_leaves_outputs_bit_identical(model_and_batch, transcoder):
    model, src, tgt = model_and_batch
    d = _dictionary(model, transcoder)
    names, keys = model.hook_names(), set(model.state_dict())
    with torch.no_grad():
        clean = model(src, tgt)
        with splice(model, d) as sae:
            site = site_of(d).name
            assert model.get_submodule(site).sae is sae
            new = set(model.hook_names()) - set(names)
            assert new == {f"{site}.sae.hook_acts", f"{site}.sae.hook_recons", f"{site}.sae.hook_error"}
            assert set(model.state_dict()) == keys  # the dictionary's weights are not the model's
            assert torch.equal(model(src, tgt), clean)
            # every point listened to, each edit adding an exact zero: still the clean output, bit for bit
            with model.hooks({f"{site}.sae.*": _add_zero}):
                assert torch.equal(model(src, tgt), clean)
    assert model.hook_names() == names and splice_at(model, site_of(d).name) is None


@pytest.mark.parametrize("transcoder", [False, True], ids=["sae", "transcoder"])
def test_the_hook_points_hold_the_dictionary_s_values_and_zeroing_the_error_is_the_replacement(
        model_and_batch, transcoder):
    model, src, tgt = model_and_batch
    d = _dictionary(model, transcoder)
    site = site_of(d)
    acts = capture_site(model, src, tgt, site)
    x, y = acts[site.hook_in], acts[site.hook_out or site.hook_in]
    with torch.no_grad():
        with model.hooks(splice_hooks(site, d)):
            replaced = model(src, tgt)
        with splice(model, d) as sae:
            _, trace = model.run_with_cache(src, tgt, names=f"{site.name}.sae.*")
            with model.hooks({sae.hook_error.name: lambda e, h: torch.zeros_like(e)}):
                no_error = model(src, tgt)
    torch.testing.assert_close(trace[sae.hook_acts.name], d.encode(x))
    torch.testing.assert_close(trace[sae.hook_recons.name], d(x))
    torch.testing.assert_close(trace[sae.hook_error.name], y - d(x))
    assert (no_error - model(src, tgt)).abs().max() > 1e-3  # the random dictionary is a poor one: a real change
    torch.testing.assert_close(no_error, replaced, atol=1e-5, rtol=1e-5)


def test_a_feature_edit_adds_its_decoder_direction_and_plain_hooks_edit_as_the_workbench_s(model_and_batch):
    model, src, tgt = model_and_batch
    d = _dictionary(model, transcoder=False)

    def add_to_7(acts, hook):
        acts[..., 7] += 2.5
        return acts

    with torch.no_grad():
        with model.hooks({"hook_memory": lambda x, h: x + 2.5 * d.W_dec[7]}):
            direction = model(src, tgt)
        with splice(model, d) as sae:
            with model.hooks({sae.hook_acts.name: add_to_7}):
                edited = model(src, tgt)
            seen = {}
            handle = sae.hook_acts.register_forward_hook(lambda m, a, out: add_to_7(out, m))
            read = sae.hook_recons.register_forward_hook(lambda m, a, out: seen.setdefault("recons", out.clone()))
            try:
                plain = model(src, tgt)
            finally:
                handle.remove()
                read.remove()
            assert torch.equal(model(src, tgt), model(src, tgt))  # the plain hooks are gone, the splice stays
    assert torch.equal(plain, edited)
    torch.testing.assert_close(edited, direction, atol=1e-5, rtol=1e-5)
    x = model.encode(src).memory
    torch.testing.assert_close(seen["recons"], d(x) + 2.5 * d.W_dec[7], atol=1e-5, rtol=1e-5)


def test_nnsight_reads_and_edits_the_features():
    nnsight = pytest.importorskip("nnsight")
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    src, tgt = make_batch(cfg)
    d = _dictionary(model, transcoder=True)
    with splice(model, d) as sae:
        name = sae.hook_acts.name
        with torch.no_grad():
            _, trace = model.run_with_cache(src, tgt, names=name)
            with model.hooks({name: lambda a, h: a * 0.0}):
                expected = model(src, tgt)
        wrapped = nnsight.NNsight(model)
        with torch.no_grad():
            with wrapped.trace(src, tgt):
                acts = wrapped.dec[1].ffn.sae.hook_acts.output.save()
            with wrapped.trace(src, tgt):
                wrapped.dec[1].ffn.sae.hook_acts.output[:] = 0.0
                edited = wrapped.output.save()
    torch.testing.assert_close(acts, trace[name])
    torch.testing.assert_close(edited, expected)


def test_splices_are_shared_counted_and_refused_when_they_clash():
    cfg = presets.tiny(vocab=50)
    model = make_model(cfg)
    d, other = _dictionary(model, False), _dictionary(model, False, seed=1)
    with splice(model, d) as first, splice(model, d) as second:
        assert first is second and first.users == 2
        with pytest.raises(ValueError, match="already carries another dictionary"):
            splice(model, other)
    assert splice_at(model, "hook_memory") is None
    kept = splice(model, d)  # permanent until unsplice
    assert splice_at(model, "hook_memory") is kept.splice
    unsplice(model, d)
    assert splice_at(model, "hook_memory") is None
    with pytest.raises(ValueError, match="no dictionary is spliced at hook_memory"):
        unsplice(model, "hook_memory")
    wide = SparseDictionary(DictionaryConfig("hook_memory", d_in=cfg.d_model + 1, d_sae=8, k=2))
    with pytest.raises(ValueError, match="belongs to another model"):
        splice(model, wide)


def test_steering_specs_parse_and_bad_ones_say_what_is_wrong():
    assert parse_steer({"hook_memory": {3: 5, 4: "+2", 5: "-1.5", 6: "=-2"}}) == {"hook_memory": {
        3: FeatureEdit(5.0), 4: FeatureEdit(2.0, add=True), 5: FeatureEdit(-1.5, add=True), 6: FeatureEdit(-2.0)}}
    for bad, match in [({"s": {1: "five"}}, "signed number"), ({"s": {"1": 2.0}}, "feature ids are ints"),
                       ({"s": 2.0}, "must map feature ids"), ({"s": {1: "+nan"}}, "finite")]:
        with pytest.raises(ValueError, match=match):
            parse_steer(bad)
    model = make_model(presets.tiny(vocab=50))
    with pytest.raises(ValueError, match="needs a dictionary spliced there"):
        steering_hooks(model, {"hook_memory": {1: 2.0}})
    with pytest.raises(ValueError, match="no site 'hook_memroy'.*closest: \\['hook_memory'"):
        steering_hooks(model, {"hook_memroy": {1: 2.0}})
    with splice(model, _dictionary(model, False, n=48)):
        with pytest.raises(ValueError, match=r"features \[48\] are out of range; its dictionary has 48"):
            steering_hooks(model, {"hook_memory": {48: 2.0}})


@pytest.fixture(scope="module")
def shipped():
    tm = load(CKPT)
    features = CKPT / "features"
    return tm, {name: SparseDictionary.load(features / name) for name in ("hook_memory", "dec.1.cross_attn.hook_out",
                                                                          "dec.1.ffn")}


@pytest.mark.parametrize("beam", [1, 4], ids=["greedy", "beam"])
def test_steering_at_zero_is_bit_identical_and_equals_the_edit_written_as_a_hook(shipped, beam):
    tm, dicts = shipped
    plain = tm.translate(SOURCES, beam=beam, return_scores=True)
    with splice(tm.model, dicts["hook_memory"]) as enc, splice(tm.model, dicts["dec.1.cross_attn.hook_out"]) as dec, \
            splice(tm.model, dicts["dec.1.ffn"]) as ffn:
        zero = tm.translate(SOURCES, beam=beam, return_scores=True,
                            steer={"hook_memory": {5: "+0"}, "dec.1.cross_attn.hook_out": {9: "+0"},
                                   "dec.1.ffn": {3: "-0"}})
        steer = {"hook_memory": {100: 1.0}, "dec.1.cross_attn.hook_out": {9: "+20"}, "dec.1.ffn": {3: 4.0}}
        steered = tm.translate(SOURCES, beam=beam, return_scores=True, steer=steer)

        def clamp(feature, value, add=False):
            def fn(acts, hook):  # handed the one declared feature, or all of them
                col = 0 if acts.size(-1) == 1 else feature
                acts[..., col] = acts[..., col] + value if add else value
            return fn

        hooks = {enc.hook_acts.name: (clamp(100, 1.0), [100]), dec.hook_acts.name: (clamp(9, 20.0, add=True), [9]),
                 ffn.hook_acts.name: (clamp(3, 4.0), [3])}
        with tm.model.hooks({name: edits_features(fn, f) for name, (fn, f) in hooks.items()}):
            by_declared_hook = tm.translate(SOURCES, beam=beam, return_scores=True)
        with tm.model.hooks({name: fn for name, (fn, _) in hooks.items()}):  # the dense features
            by_hook = tm.translate(SOURCES, beam=beam, return_scores=True)
    assert [(r.tokens, r.score) for r in zero] == [(r.tokens, r.score) for r in plain]
    assert [(r.tokens, r.score) for r in steered] == [(r.tokens, r.score) for r in by_declared_hook]
    assert [r.tokens for r in steered] == [r.tokens for r in by_hook]
    torch.testing.assert_close([r.score for r in steered], [r.score for r in by_hook], rtol=0, atol=1e-5)
    assert [r.text for r in steered] != [r.text for r in plain]


def test_steered_search_agrees_with_steered_teacher_forcing(shipped):
    """The KV cache: each step's steered decoder site equals the steered full recompute over the same prefix."""
    tm, dicts = shipped
    steer = {"dec.1.cross_attn.hook_out": {9: "+10"}, "hook_memory": {100: 1.0}}  # ends by EOS, not max length
    with splice(tm.model, dicts["hook_memory"]), splice(tm.model, dicts["dec.1.cross_attn.hook_out"]):
        r = tm.translate(SOURCES[2:], beam=1, return_tokens=True, steer=steer)[0]
        b = tm.encode_batch(SOURCES[2:], [r.tokens])
        with torch.no_grad(), tm.model.hooks(steering_hooks(tm.model, steer)):
            logits = tm.model(b.src, b.tgt_in)
    assert logits[0].argmax(-1).tolist() == r.tokens
    with splice(tm.model, dicts["hook_memory"]) as sae, torch.no_grad():  # the narrow encoder on 4096 TopK features
        x = tm.model.encode(tm.encode_batch(SOURCES).src).memory
        features = torch.tensor([100, 204, 4000])
        some, dense = sae.dictionary.encode_features(x, features), dicts["hook_memory"].encode(x)[..., features]
    assert torch.equal(some == 0, dense == 0) and bool((dense > 0).any())
    torch.testing.assert_close(some, dense, rtol=1e-5, atol=1e-6)
    assert r.text != tm.translate(SOURCES[2:], beam=1)[0]  # the steering changed the output


def test_translate_lines_steers_chunk_by_chunk_and_leaves_no_hook_behind(shipped):
    tm, dicts = shipped
    steer = {"hook_memory": {100: 1.0}}
    with splice(tm.model, dicts["hook_memory"]):
        whole = tm.translate(SOURCES, steer=steer)
        streamed = tm.translate_lines(iter(SOURCES), chunk=2, steer=steer)
        first = next(streamed)
        assert tm.model.hook_memory.sae.hook_acts.is_active() is False  # between lines, nothing listens
        assert [first, *streamed] == whole
        with pytest.raises(ValueError, match="out of range"):
            tm.translate(SOURCES, steer={"hook_memory": {8192: 1.0}})


def test_the_cli_steers_as_translate_does_and_refuses_bad_flags(shipped, tmp_path, capsys):
    from workbench.cli import main

    tm, dicts = shipped
    src = tmp_path / "in.de"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    out = tmp_path / "out.en"
    base = ["translate", "--checkpoint", str(CKPT), "--input", str(src), "--output", str(out)]
    assert main(base + ["--steer", "hook_memory:100=1", "--steer", "dec.1.ffn:3=+2"]) == 0
    with splice(tm.model, dicts["hook_memory"]), splice(tm.model, dicts["dec.1.ffn"]):
        expected = tm.translate(SOURCES, steer={"hook_memory": {100: 1.0}, "dec.1.ffn": {3: "+2"}})
    assert out.read_text(encoding="utf-8").splitlines() == expected != tm.translate(SOURCES)
    for flags, message in [(["--steer", "hook_memory:8192=1"], "features [8192] are out of range"),
                           (["--steer", "hook_memory=1"], "expected SITE:FEATURE=VALUE"),
                           (["--steer", "hook_memory:a=1"], "the feature must be an integer id"),
                           (["--steer", "dec.0.ffn:1=1"], "no dictionary for that site"),
                           (["--steer", "hook_memory:1=x"], "signed number"),
                           (["--dictionary", str(CKPT / "features" / "dec.1.ffn")], "for --steer only")]:
        assert main(base + flags) == 2
        assert message in capsys.readouterr().err


def test_steering_a_woman_feature_moves_translations_toward_women_more_than_random_features(shipped):
    """The notebook's steering figures (notebook 08, section 5) on a small set: the hook_memory feature most selective
    for Frau/Frauen/Mädchen, clamped at every source position of sentences about men, moves more translations
    toward female words than random features of the same decoder norm do."""
    import re

    from workbench.corpus.data import load_dataset
    from workbench.features.steering import FEMALE, MALE, direction, selective_feature, steering_effect

    tm, dicts = shipped
    d = dicts["hook_memory"]
    corpus, _ = load_dataset("multi30k", "valid", "de", "en", limit=100)
    feature = selective_feature(tm, d, corpus, {"frau", "frauen", "mädchen"})
    test, _ = load_dataset("multi30k", "test2016", "de", "en")
    male = [s for s in test if re.search(r"\b(Mann|Männer|Junge)\b", s)][:24]
    r = steering_effect(tm, d, feature, male, 0.3, toward=FEMALE, away=MALE, controls=3, examples=2)
    assert r.sentences == 24 and len(r.control_toward) == 3 and feature not in r.control_features
    assert r.toward > max(r.control_toward)
    for source, plain, steered in r.examples:
        assert source in male and direction(steered, FEMALE, MALE) > direction(plain, FEMALE, MALE)
    assert direction("A Woman, her dog and two men.", FEMALE, MALE) == 1  # woman, her - men
    with pytest.raises(ValueError, match="out of range"):
        steering_effect(tm, d, d.cfg.d_sae, male, 0.3, toward=FEMALE)


@pytest.mark.parametrize("architecture", ["topk", "relu"])
def test_a_declared_edit_takes_the_narrow_path_and_gives_the_dense_path_s_bits(model_and_batch, architecture):
    """`edits_features`: the splice encodes only the declared features (`encode_features`: encode's columns within
    float rounding, zero where they are) and hands the hook those; logits equal the same edit made on the dense
    (B, L, d_sae) features within rounding, and a plain hook beside it brings the dense path back."""
    model, src, tgt = model_and_batch
    d = _dictionary(model, transcoder=False)
    if architecture == "relu":
        d = SparseDictionary(DictionaryConfig("hook_memory", d_in=model.cfg.d_model, d_sae=48, architecture="relu"))
    seen = []

    def bump(acts, hook):
        seen.append(acts.size(-1))
        cols = [0, 1] if acts.size(-1) == 2 else [3, 7]
        acts[..., cols] = acts[..., cols] * 3 + 0.25
        return acts

    with torch.no_grad(), splice(model, d) as sae:
        x = model.encode(src).memory
        some, dense = sae.dictionary.encode_features(x, torch.tensor([3, 7])), d.encode(x)[..., [3, 7]]
        torch.testing.assert_close(some, dense, rtol=1e-5, atol=1e-6)
        assert torch.equal(some == 0, dense == 0)
        with model.hooks({sae.hook_acts.name: bump}):
            dense = model(src, tgt)
        with model.hooks({sae.hook_acts.name: edits_features(bump, [7, 3])}):
            narrow = model(src, tgt)
        handle = sae.hook_acts.register_forward_hook(lambda m, a, out: None)  # a plain hook: the dense path again
        try:
            with model.hooks({sae.hook_acts.name: edits_features(bump, [3, 7])}):
                mixed = model(src, tgt)
        finally:
            handle.remove()
    assert seen == [48, 2, 48]
    assert torch.equal(mixed, dense)
    torch.testing.assert_close(narrow, dense, rtol=1e-5, atol=1e-5)
    assert (dense - model(src, tgt)).abs().max() > 1e-3


def test_a_session_steering_through_a_splice_leaves_another_session_s_translations_alone(shipped):
    """The app's case: one shared model, one thread splicing and steering while another translates plainly."""
    import threading

    tm, dicts = shipped
    plain = tm.translate(SOURCES, beam=2)
    seen, errors, stop = [], [], threading.Event()

    def other_session():
        try:
            while not stop.is_set():
                seen.append(tm.translate(SOURCES, beam=2))
        except Exception as exc:  # reported below: an assertion in a thread would be lost
            errors.append(exc)

    thread = threading.Thread(target=other_session)
    thread.start()
    try:
        for _ in range(4):
            with splice(tm.model, dicts["hook_memory"]):
                steered = tm.translate(SOURCES, beam=2, steer={"hook_memory": {204: 0.5}})
    finally:
        stop.set()
        thread.join()
    assert not errors and seen and all(out == plain for out in seen)
    assert steered != plain and splice_at(tm.model, "hook_memory") is None


def test_the_features_read_during_greedy_search_are_the_teacher_forced_ones_and_plain_hooks_steer_too(shipped):
    """Issue 36 point 2 during search: `<site>.sae.hook_acts` read at each greedy step (one new position per step,
    the KV cache) equals the teacher-forced read over the output; a plain `register_forward_hook` edit there steers
    beam search exactly as `steer=` does."""
    tm, dicts = shipped
    d = dicts["dec.1.cross_attn.hook_out"]
    with splice(tm.model, d) as sae, torch.no_grad():
        with tm.model.capture(sae.hook_acts.name) as store:
            r = tm.translate(SOURCES[:1], beam=1, return_tokens=True)[0]
        steps = torch.cat(store[sae.hook_acts.name], dim=1)  # (1, T, d_sae): one call per step
        b = tm.encode_batch(SOURCES[:1], [r.tokens])
        _, trace = tm.model.run_with_cache(b.src, b.tgt_in, names=sae.hook_acts.name)
        steered = tm.translate(SOURCES, beam=3, return_scores=True, steer={"dec.1.cross_attn.hook_out": {9: "+20"}})

        def add(module, args, acts):
            acts[..., 9] += 20.0

        handle = sae.hook_acts.register_forward_hook(add)
        try:
            by_plain_hook = tm.translate(SOURCES, beam=3, return_scores=True)
        finally:
            handle.remove()
    assert steps.shape == trace[sae.hook_acts.name].shape
    torch.testing.assert_close(steps, trace[sae.hook_acts.name], rtol=1e-4, atol=1e-5)
    assert [r.tokens for r in by_plain_hook] == [r.tokens for r in steered]
    torch.testing.assert_close([r.score for r in by_plain_hook], [r.score for r in steered], rtol=0, atol=1e-5)


def test_a_float64_model_keeps_its_digits_through_a_listened_splice():
    """A splice adds the edits' change in the site's own precision: a float64 model read through a listened splice
    with nothing edited is the float64 model, bit for bit (it was rounded through float32)."""
    from model_helpers import graph_model, one_sentence

    from workbench.core.splice import attach
    from workbench.features.dictionary import DictionaryConfig, SparseDictionary

    model = graph_model(norm_first=False).double()
    src, tgt = one_sentence(model.cfg)
    d = SparseDictionary(DictionaryConfig("hook_memory", d_in=model.cfg.d_model, d_sae=64, k=4))
    plain = model(src, tgt)
    with attach(model, "hook_memory", d) as s, model.hooks({s.hook_acts.name: lambda x, h: x}):
        read = model(src, tgt)
    assert plain.dtype == torch.float64 and torch.equal(read, plain)

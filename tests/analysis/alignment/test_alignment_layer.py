"""The trained alignment layer (Garg et al. 2019) and Shift-Att (Chen et al. 2020): targets, rows, storage, resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from model_helpers import make_model

from workbench import presets
from workbench.analysis.alignment.alignment_layer import (
    AlignmentLayer,
    check_extraction,
    layer_from_config,
    load_alignment_layer,
    load_any_layer,
    piece_targets,
    save_alignment_layer,
    train_alignment_layer,
)
from workbench.analysis.alignment.word_align import (
    AlignmentSpec,
    Words,
    aligner,
    alignment_maps,
    encode_words,
    hooks_for,
    shift_att_spec,
)


class OneCharTokenizer:
    """Each character one piece (ids 4..23): "a b c" is three one-piece words."""

    def encode(self, text):
        return [4 + (ord(c) % 20) for c in text]


def _pairs():
    tok = OneCharTokenizer()
    src = [encode_words(tok, s) for s in ("a b c", "ab c", "c a b d")]
    tgt = [encode_words(tok, t) for t in ("x y z", "x yz", "z x")]
    return src, tgt


def test_piece_targets_spread_over_the_linked_words_pieces():
    src = Words(["ab", "c", "d"], [1, 2, 3, 4], [0, 0, 1, 2])
    tgt = Words(["x", "yz", "w"], [5, 6, 7, 8], [0, 1, 1, 2])
    g = piece_targets(src, tgt, {(0, 0), (2, 0), (1, 1)})  # x -> ab, d; yz -> c; w unlinked
    expected = np.zeros((4, 5), dtype=np.float32)
    expected[0, [0, 1, 3]] = 1 / 3  # x: the pieces of "ab" and "d"
    expected[1, 2] = expected[2, 2] = 1.0  # both pieces of "yz": "c"
    np.testing.assert_allclose(g, expected)  # w's row stays zero: not trained; the EOS column (4) unused


def test_shift_semantics_by_hand_on_three_words():
    """Target word j (0-based) is read by decoder position j + 1 (AWI, Shift-Att): with three one-piece words,
    word j's row is row j + 1 of the layer's (or the heads' mean) probabilities, taken by hand from the trace."""
    model = make_model(presets.tiny(vocab=30))
    cfg = model.cfg
    src, tgt = _pairs()
    s, t = src[0], tgt[0]
    layer = AlignmentLayer(cfg.d_model, source_layer=1, n_heads=2, dropout=0.0).eval()
    maps = alignment_maps(model, [s], [t], method="layer", shift="awi", layer=layer)[0]
    names = [*hooks_for(model, "layer", layer), *hooks_for(model, "weights")]
    _, trace = model.run_with_cache(torch.tensor([[*s.ids, cfg.eos_id]]), torch.tensor([[cfg.start_id, *t.ids]]),
                                    names=names)
    memory = trace[model.hook_memory.name]
    states = trace[model.stream("dec").resid(1).name]
    with torch.no_grad():
        p = layer(states, memory, torch.zeros(1, 4, dtype=torch.bool), torch.zeros(1, 4, dtype=torch.bool))[0]
    assert maps.layers.shape == (1, 3, 4)  # one "layer", 3 target words, 3 source words + EOS
    for j in range(3):
        np.testing.assert_allclose(maps.layers[0, j], p[j + 1].numpy(), atol=1e-6)
    att = alignment_maps(model, [s], [t], method="weights", shift="awi", heads=False)[0]
    probs = trace["dec.0.cross_attn.hook_probs"][0].mean(0)  # (T, S) heads averaged
    for j in range(3):
        np.testing.assert_allclose(att.layers[0, j], probs[j + 1].numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="AWI"):
        AlignmentSpec("layer", "awo", "drop", ((0, None),))


def test_save_load_round_trip_and_the_aligner_loads_it(tmp_path):
    model = make_model(presets.tiny(vocab=30))
    src, tgt = _pairs()
    layer = AlignmentLayer(model.cfg.d_model, source_layer=2, n_heads=2)
    save_alignment_layer(layer, tmp_path, {"note": "test"})
    back = load_alignment_layer(tmp_path)
    a = alignment_maps(model, src, tgt, method="layer", shift="awi", layer=layer.eval())
    b = alignment_maps(model, src, tgt, method="layer", shift="awi", layer=back)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.layers, y.layers, atol=1e-6)
    stored = {"method": "layer", "shift": "awi", "eos": "null", "symmetrize": "intersect", "units": [[0, None]]}
    spec, _ = aligner(model, stored, directory=tmp_path)
    assert spec.layer is not None and spec.eos == "null" and spec.symmetrize == "intersect"
    with pytest.raises(ValueError, match="directory"):
        aligner(model, stored)
    with pytest.raises(FileNotFoundError, match="no trained alignment layer"):
        aligner(model, stored, directory=tmp_path / "missing")
    with pytest.raises(ValueError, match="method must be one of"):
        aligner(model, stored, "gradients")


def test_a_broken_or_foreign_stored_layer_is_a_one_line_error(tmp_path):
    """What the CLI and the Evidence tab say when alignment_layer.* beside a checkpoint cannot serve its model: a
    truncated or non-safetensors file, a config that is not one, tensors of other shapes than the config says, a
    layer of another width or reading a decoder stream the model lacks (a partner's too) — each a ValueError
    naming the problem, never a traceback from deep inside the forward pass."""
    model = make_model(presets.tiny(vocab=30))  # d_model 32, 2 decoder layers
    stored = {"method": "layer", "shift": "awi", "eos": "drop", "symmetrize": "grow-diag", "units": [[0, None]]}
    d = model.cfg.d_model

    def refused(layer=None, tensors: bytes | None = None, config: str | None = None) -> str:
        if layer is not None:
            save_alignment_layer(layer, tmp_path, {})
        if tensors is not None:
            (tmp_path / "alignment_layer.safetensors").write_bytes(tensors)
        if config is not None:
            (tmp_path / "alignment_layer.json").write_text(config, encoding="utf-8")
        with pytest.raises(ValueError) as caught:
            aligner(model, stored, directory=tmp_path)
        assert "\n" not in str(caught.value)
        return str(caught.value)

    good = AlignmentLayer(d, source_layer=1, n_heads=2)
    save_alignment_layer(good, tmp_path, {})
    assert aligner(model, stored, directory=tmp_path)[0].layer is not None
    whole = (tmp_path / "alignment_layer.safetensors").read_bytes()
    assert "not a readable safetensors file" in refused(tensors=whole[:200])
    assert "not a readable safetensors file" in refused(tensors=b"\x80\x04pickle")
    assert "not a stored alignment layer's config" in refused(tensors=whole, config="{not json")
    assert "not a stored alignment layer's config" in refused(config='{"d_model": 32}')
    assert "does not match" in refused(config=json.dumps({**good.config(), "d_ff": 4 * d}))
    assert "is 16 wide, the model 32" in refused(AlignmentLayer(16, source_layer=1, n_heads=2))
    assert "after 3 layers; the model has 2" in refused(AlignmentLayer(d, source_layer=3, n_heads=2))
    joined = AlignmentLayer(d, source_layer=1, n_heads=2).join([AlignmentLayer(d, source_layer=5, n_heads=2)])
    assert "after 5 layers" in refused(joined)


def test_shift_att_preset_uses_the_stored_choice_else_the_middle_layer():
    model = make_model(presets.tiny(vocab=30))
    spec = shift_att_spec(model)
    assert (spec.method, spec.shift, spec.symmetrize, spec.units) == ("weights", "awi", "grow-diag",
                                                                       ((max(len(model.dec) // 2 - 1, 0), None),))
    stored = {"method": "norms", "shift": "awi", "units": [[0, 0]], "shift-att": {"layer": 1, "symmetrize": "none"}}
    chosen, origin = aligner(model, stored, "shift-att")
    assert chosen.units == ((1, None),) and chosen.symmetrize == "none" and "Shift-Att" in origin


@pytest.mark.parametrize("both_ways", [False, True])
def test_training_learns_its_targets_and_resumes_exactly(tmp_path, both_ways):
    """Targets: each target word linked to the source word at the same index. Four steps straight equal two, a
    stop, and two more resumed from the saved state (weights and Adam moments). `both_ways` also trains the
    columns and scores a link by the product of both directions' probabilities."""
    model = make_model(presets.tiny(vocab=30))
    src, tgt = _pairs()
    links = [{(j, j) for j in range(min(len(s.words), len(t.words)))} for s, t in zip(src, tgt)]
    labels = [piece_targets(s, t, x) for s, t, x in zip(src, tgt, links)]

    def fresh():
        torch.manual_seed(3)
        return AlignmentLayer(model.cfg.d_model, source_layer=1, n_heads=2, dropout=0.0, both_ways=both_ways)

    quiet = lambda *_: None  # noqa: E731
    straight = fresh()
    r = train_alignment_layer(straight, model, src, tgt, labels, directory=tmp_path / "a", steps=4, batch_size=2,
                              lr=1e-2, log=quiet)
    assert r["step"] == 4
    split = fresh()
    train_alignment_layer(split, model, src, tgt, labels, directory=tmp_path / "b", steps=2, batch_size=2, lr=1e-2,
                          log=quiet)
    resumed = fresh()
    train_alignment_layer(resumed, model, src, tgt, labels, directory=tmp_path / "b", steps=4, batch_size=2,
                          lr=1e-2, log=quiet)
    for (k, v), w in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(v, w, msg=k)
    long = fresh()
    first = train_alignment_layer(long, model, src, tgt, labels, directory=tmp_path / "c", steps=5, batch_size=3,
                                  lr=1e-2, log=quiet)
    more = train_alignment_layer(long, model, src, tgt, labels, directory=tmp_path / "c", steps=60, batch_size=3,
                                 lr=1e-2, log=quiet)
    assert more["step"] == 60 and first["loss"] is not None
    maps = alignment_maps(model, src, tgt, method="layer", shift="awi", layer=long)
    hits = sum((j, j) in m.links(0, None) for m, x in zip(maps, links) for (j, _) in x)
    assert hits == sum(len(x) for x in links)  # it learned the diagonal it was taught
    if both_ways:  # the product of rows and columns: each row sums to at most 1, position 0 reads no word
        with torch.no_grad():
            x = long(torch.randn(1, 4, model.cfg.d_model), torch.randn(1, 5, model.cfg.d_model),
                     torch.zeros(1, 4, dtype=torch.bool), torch.zeros(1, 5, dtype=torch.bool))
        assert float(x[0, 0].sum()) == 0.0 and bool((x.sum(-1) <= 1 + 1e-6).all())


def test_continued_training_with_decay_resumes_exactly_and_starts_from_a_stored_layer(tmp_path):
    """A further round starts from a layer trained before, loaded from a checkpoint directory or a run directory
    (`load_any_layer`, as `--init-from` and `--teacher-run` do); with `decay` the learning rate is a function of
    the step (lr -> lr / 10 over `decay` steps), so 2 + 2 resumed steps equal 4 straight, and decayed steps move
    the weights less than undecayed ones from the same start."""
    model = make_model(presets.tiny(vocab=30))
    src, tgt = _pairs()
    labels = [piece_targets(s, t, {(0, 0), (1, 1)}) for s, t in zip(src, tgt)]
    quiet = lambda *_: None  # noqa: E731
    torch.manual_seed(5)
    base = AlignmentLayer(model.cfg.d_model, source_layer=1, n_heads=2, dropout=0.0, both_ways=True)
    train_alignment_layer(base, model, src, tgt, labels, directory=tmp_path / "run0", steps=3, batch_size=2,
                          lr=1e-2, log=quiet)
    (tmp_path / "ckpt").mkdir()
    save_alignment_layer(base, tmp_path / "ckpt")
    from_run, from_ckpt = load_any_layer(tmp_path / "run0"), load_any_layer(tmp_path / "ckpt")
    for (k, v), w in zip(from_run.state_dict().items(), from_ckpt.state_dict().values()):
        torch.testing.assert_close(v, w, msg=k)
    assert from_ckpt.both_ways and from_ckpt.source_layer == 1

    def further(name, steps, decay):
        layer = load_any_layer(tmp_path / "ckpt")
        train_alignment_layer(layer, model, src, tgt, labels, directory=tmp_path / name, steps=steps, batch_size=2,
                              lr=1e-2, decay=decay, log=quiet)
        return layer

    straight = further("straight", 4, 4)
    further("split", 2, 4)  # stopped half way through the same schedule
    resumed = further("split", 4, 4)
    for (k, v), w in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(v, w, msg=k)
    plain = further("plain", 4, None)
    start = from_ckpt.state_dict()
    moved = lambda layer: sum(float((v - start[k]).norm()) for k, v in layer.state_dict().items())  # noqa: E731
    assert 0 < moved(straight) < moved(plain)


def test_extraction_prior_target_max_and_raw_rows_by_hand(tmp_path):
    """An extraction (stored in the layer's JSON) multiplies the layer's piece probabilities by a cross-attention
    head's value-weighted norms (rows scaled to sum to 1) to a power, takes a target word's row as its pieces'
    largest scores, and leaves the word rows unnormalised for the argmax: all three by hand on "ab c" -> "x yz"."""
    model = make_model(presets.tiny(vocab=30))
    cfg = model.cfg
    src, tgt = _pairs()
    s, t = src[1], tgt[1]  # source pieces a, b, c (+ EOS); target pieces x | y z: "yz" is one word of two pieces
    torch.manual_seed(1)
    layer = AlignmentLayer(cfg.d_model, source_layer=1, n_heads=2, dropout=0.0, both_ways=True).eval()
    plain = alignment_maps(model, [s], [t], method="layer", shift="awi", layer=layer)[0]
    extraction = {"prior": [0, 1, 0.5], "target_pieces": "max", "normalize_rows": False}
    layer.extraction = check_extraction(extraction)
    maps = alignment_maps(model, [s], [t], method="layer", shift="awi", layer=layer)[0]
    _, trace = model.run_with_cache(torch.tensor([[*s.ids, cfg.eos_id]]), torch.tensor([[cfg.start_id, *t.ids]]),
                                    names=hooks_for(model, "layer", layer))
    with torch.no_grad():
        p = layer(trace[model.stream("dec").resid(1).name], trace[model.hook_memory.name],
                  torch.zeros(1, 4, dtype=torch.bool), torch.zeros(1, 4, dtype=torch.bool))[0].double()
    probs = trace["dec.0.cross_attn.hook_probs"][0, 1].double()  # head 1 of layer 0: (T, S)
    v = trace["dec.0.cross_attn.hook_v"][0, 1].double()  # (S, Dh)
    attn = model.dec[0].cross_attn
    w_o = attn.out_proj.weight.detach().double()[:, attn.d_head: 2 * attn.d_head]  # head 1's columns of W_O
    norms = probs * (v @ w_o.T).norm(dim=-1)[None, :]  # Kobayashi et al.: alpha * |f(x)|
    q = (p * (norms / norms.sum(-1, keepdim=True)) ** 0.5).numpy()  # rows 1..3 read x, y, z (AWI)
    by_hand = np.stack([q[1], np.maximum(q[2], q[3])])  # x; yz = the larger of its pieces' scores
    by_hand = np.concatenate([by_hand[:, :2].sum(1, keepdims=True), by_hand[:, 2:]], 1)  # "ab" sums a and b
    np.testing.assert_allclose(maps.layers[0], by_hand, atol=1e-6)
    np.testing.assert_allclose(maps.combined([(0, None)]), by_hand, atol=1e-6)  # rows left as they are
    assert plain.normalize and not maps.normalize
    np.testing.assert_allclose(plain.combined([(0, None)]).sum(-1), 1.0, atol=1e-6)  # the default normalises
    save_alignment_layer(layer, tmp_path)
    assert load_alignment_layer(tmp_path).extraction == extraction  # the JSON records it; the loaded layer uses it
    np.testing.assert_allclose(alignment_maps(model, [s], [t], method="layer", shift="awi",
                                              layer=load_alignment_layer(tmp_path))[0].layers, maps.layers, atol=1e-6)
    for bad in ({"prior": [0, 0]}, {"target_pieces": "sum"}, {"normalize_rows": "no"}, {"threshold": 0.1}):
        with pytest.raises(ValueError, match="extraction"):
            check_extraction(bad)


def test_the_extraction_grid_holds_the_default_and_valid_distinct_extractions():
    """scripts/alignment_methods.py --extraction-grid scores the shipped behaviour (no prior, target pieces averaged,
    rows normalised) among 20 distinct extractions that all pass `check_extraction`."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "scripts" / "alignment_methods.py"
    spec = importlib.util.spec_from_file_location("alignment_methods", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    grid = module.extraction_grid((0, 0))
    assert len(grid) == 20 and len({repr(sorted(e.items())) for e in grid}) == 20
    assert all(check_extraction(e) == e for e in grid)
    layer = AlignmentLayer(8, source_layer=1, n_heads=2, extraction={"target_pieces": "mean", "normalize_rows": True})
    assert {"target_pieces": "mean", "normalize_rows": True} in grid and layer.config()["extraction"] == grid[0]
    assert {"prior": [0, 0, 0.5], "target_pieces": "max", "normalize_rows": False} in grid


def test_partners_join_by_geometric_mean_before_the_prior_and_round_trip(tmp_path):
    """A layer with a partner (another trained layer, its own query stream) gives per piece the exp of the two
    layers' mean log probability, then the first layer's extraction; stored and loaded as one file pair, refused
    by training. By hand from each layer alone on "ab c" -> "x yz"."""
    model = make_model(presets.tiny(vocab=30))
    src, tgt = _pairs()
    torch.manual_seed(2)
    first = AlignmentLayer(model.cfg.d_model, source_layer=1, n_heads=2, dropout=0.0, both_ways=True).eval()
    second = AlignmentLayer(model.cfg.d_model, source_layer=2, n_heads=2, dropout=0.0).eval()
    alone = [alignment_maps(model, src, tgt, method="layer", shift="awi", layer=x) for x in (first, second)]
    joined = AlignmentLayer(model.cfg.d_model, source_layer=1, n_heads=2, dropout=0.0, both_ways=True,
                            extraction={"target_pieces": "max"}, partners=[second]).eval()
    joined.load_state_dict({**first.state_dict(), **{f"partners.0.{k}": v for k, v in second.state_dict().items()}})
    assert hooks_for(model, "layer", joined) == [model.hook_memory.name, model.stream("dec").resid(1).name,
                                                 model.stream("dec").resid(2).name]
    for j, (s, t) in enumerate(zip(src, tgt)):
        _, trace = model.run_with_cache(torch.tensor([[*s.ids, model.cfg.eos_id]]),
                                        torch.tensor([[model.cfg.start_id, *t.ids]]),
                                        names=hooks_for(model, "layer", joined))
        pad = torch.zeros(1, len(t.ids) + 1, dtype=torch.bool), torch.zeros(1, len(s.ids) + 1, dtype=torch.bool)
        with torch.no_grad():
            p = [x(trace[model.stream("dec").resid(x.source_layer).name], trace[model.hook_memory.name], *pad)[0]
                 for x in (first, second)]
        q = (p[0].double() * p[1].double()).sqrt().numpy()[1:]  # AWI rows: the geometric mean of the two
        rows = [q[k] for k in range(len(t.ids))]
        by_word = np.stack([np.max([rows[k] for k, w in enumerate(t.word_of) if w == word], 0)
                            for word in range(len(t.words))])  # target pieces: max (the extraction)
        want = np.stack([by_word[:, [k for k, w in enumerate(s.word_of) if w == word]].sum(1)
                         for word in range(len(s.words))] + [by_word[:, -1]], 1)  # source pieces summed, EOS
        got = alignment_maps(model, [s], [t], method="layer", shift="awi", layer=joined)[0]
        np.testing.assert_allclose(got.layers[0], want, atol=1e-6)
        assert not np.allclose(got.layers, alone[0][j].layers, atol=1e-3)  # the partner changes the map
    save_alignment_layer(joined, tmp_path)
    back = load_alignment_layer(tmp_path)
    assert back.config() == joined.config() and len(back.partners) == 1 and back.partners[0].source_layer == 2
    for x, y in zip(alignment_maps(model, src, tgt, method="layer", shift="awi", layer=back),
                    alignment_maps(model, src, tgt, method="layer", shift="awi", layer=joined)):
        np.testing.assert_allclose(x.layers, y.layers, atol=1e-6)
    with pytest.raises(ValueError, match="read, not trained"):
        train_alignment_layer(joined, model, src, tgt, [], directory=tmp_path / "run", steps=1)
    with pytest.raises(ValueError, match="single layer"):
        AlignmentLayer(model.cfg.d_model, source_layer=1, partners=[joined])
    with pytest.raises(ValueError, match="single layer"):
        second.join([second])
    cfg = back.config()
    for bad in ({**cfg, "partners": [cfg]}, {**cfg, "partners": "layer"}):  # nested, or not a list: one line
        with pytest.raises(ValueError, match="partners"):
            layer_from_config(bad)


def test_two_directions_combine_and_teach_a_layer_from_a_links_file(tmp_path, capsys):
    """`scripts/combine_alignments.py` reads the other direction's links swapped and grow-diags them with this
    direction's (by hand on one line); `scripts/train_alignment_layer.py --teacher-links` teaches from that file,
    line for line, on a real checkpoint (a few steps, nothing stored)."""
    import runpy
    import sys
    from pathlib import Path

    from workbench.analysis.alignment.alignment import read_alignments

    root = Path(__file__).resolve().parents[3]
    (tmp_path / "ab.links").write_text("0-0 1-2\n0-0\n", encoding="utf-8")
    (tmp_path / "ba.links").write_text("0-0 1-1 2-1\n0-0 1-1\n", encoding="utf-8")  # target-source
    combine = runpy.run_path(str(root / "scripts" / "combine_alignments.py"))["main"]
    assert combine([str(tmp_path / "ab.links"), str(tmp_path / "ba.links"), "--swap-b", "-o",
                    str(tmp_path / "gd.links")]) == 0
    # swapped, b is {(0,0), (1,1), (1,2)} on line 1: the intersection {(0,0), (1,2)}, then (1,1) grows next to
    # (0,0) and (1,2) and aligns target word 1, not yet aligned; line 2: (1,1) is (0,0)'s diagonal neighbour and
    # aligns two unaligned words
    assert [sure for sure, _ in read_alignments(tmp_path / "gd.links")] == [{(0, 0), (1, 1), (1, 2)},
                                                                            {(0, 0), (1, 1)}]
    assert combine([str(tmp_path / "ab.links"), str(tmp_path / "missing"), "-o", str(tmp_path / "x")]) == 2
    assert "error:" in capsys.readouterr().err
    (tmp_path / "two.links").write_text("0-0\n0-0\n", encoding="utf-8")
    (tmp_path / "de.txt").write_text("Ein Hund läuft .\nEine Katze schläft .\nZwei Männer .\n", encoding="utf-8")
    (tmp_path / "en.txt").write_text("A dog runs .\nA cat sleeps .\nTwo men .\n", encoding="utf-8")
    (tmp_path / "t.links").write_text("0-0 1-1 2-2 3-3\n0-0 1-1 2-2 3-3\n0-0 1-1 9-9\n", encoding="utf-8")
    script = str(root / "scripts" / "train_alignment_layer.py")
    args = ["--checkpoint", str(root / "checkpoints" / "multi30k-de-en"), "--src", str(tmp_path / "de.txt"),
            "--tgt", str(tmp_path / "en.txt"), "--steps", "2", "--batch", "2", "--run", str(tmp_path / "run")]
    for links, fine in (("two.links", False), ("t.links", True)):
        # the script sets the process's torch threads and seed: both put back for the tests after this one
        sys_argv, threads, rng = sys.argv, torch.get_num_threads(), torch.random.get_rng_state()
        sys.argv = [script, *args, "--teacher-links", str(tmp_path / links)]
        try:
            if fine:
                runpy.run_path(script, run_name="__main__")
            else:
                with pytest.raises(SystemExit, match="has 2 lines, --src 3"):
                    runpy.run_path(script, run_name="__main__")
        finally:
            sys.argv = sys_argv
            torch.set_num_threads(threads)
            torch.random.set_rng_state(rng)
    out = capsys.readouterr().out
    assert f"teacher the links in {tmp_path / 't.links'}: 3 pairs" in out and '"step": 2' in out
    assert not (tmp_path / "run" / "teacher.jsonl").exists()  # nothing asked of the model's own aligner


def test_combine_directions_by_hand_and_the_two_direction_teacher_script(tmp_path, capsys):
    """`combine_directions` is forward^a * backward^T^(1 - a) over words, each first scaled over its own source side
    (by hand on a 2 x 2 pair); `scripts/two_direction_teacher.py` scores alphas against gold and writes a teacher
    from two shipped checkpoints of opposite directions, resuming a cut file to the same lines."""
    import runpy
    from pathlib import Path

    from workbench.analysis.alignment.word_align import argmax_links, combine_directions

    forward = np.array([[3.0, 1.0, 9.0], [1.0, 1.0, 0.0]])  # 2 target words x (2 source words + EOS)
    backward = np.array([[0.2, 0.6, 0.2], [0.5, 0.5, 5.0]])  # 2 source words x (2 target words + EOS)
    f = np.array([[0.75, 0.25], [0.5, 0.5]])  # rows scaled without EOS
    b = np.array([[0.25, 0.75], [0.5, 0.5]]).T
    for alpha in (0.0, 0.3, 1.0):
        got = combine_directions(forward, backward, alpha=alpha)
        np.testing.assert_allclose(got[:, :2], f ** alpha * b ** (1 - alpha), rtol=1e-9, atol=1e-11)
        assert got.shape == (2, 3) and not got[:, 2].any()
    assert argmax_links(combine_directions(forward, backward, alpha=1.0), symmetrize="intersect") == {(0, 0)}
    assert argmax_links(combine_directions(forward, backward, alpha=0.0), symmetrize="intersect") == {(0, 1), (1, 0)}
    np.testing.assert_allclose(combine_directions(forward, backward, alpha=1.0, normalize=False)[:, :2],
                               forward[:, :2], rtol=1e-9)
    with pytest.raises(ValueError, match="shapes"):
        combine_directions(forward, backward[:, :2])
    with pytest.raises(ValueError, match="alpha"):
        combine_directions(forward, backward, alpha=1.5)

    root = Path(__file__).resolve().parents[3]
    (tmp_path / "de.txt").write_text("Ein Hund läuft .\nEine Katze schläft .\nZwei Männer lachen .\n", encoding="utf-8")
    (tmp_path / "en.txt").write_text("A dog runs .\nA cat sleeps .\nTwo men laugh .\n", encoding="utf-8")
    (tmp_path / "gold").write_text("1-1 2-2 3-3 4-4\n1-1 2-2 3-3 4-4\n1-1 2-2 3-3 4-4\n", encoding="utf-8")
    main = runpy.run_path(str(root / "scripts" / "two_direction_teacher.py"))["main"]
    common = ["--checkpoint", str(root / "checkpoints" / "multi30k-de-en"), "--other",
              str(root / "checkpoints" / "general-en-de"), "--src", str(tmp_path / "de.txt"), "--tgt",
              str(tmp_path / "en.txt")]
    threads = torch.get_num_threads()
    try:
        assert main([*common, "--gold", str(tmp_path / "gold"), "--lines", "1-2"]) == 0
        out = capsys.readouterr().out
        assert "lines 1-2:" in out and all(f"alpha {a}:" in out for a in (0.3, 0.5, 0.8))
        assert main([*common, "--alpha", "0.6", "--chunk", "2", "-o", str(tmp_path / "t.links")]) == 0
        whole = (tmp_path / "t.links").read_text(encoding="utf-8")
        rows = whole.splitlines()
        assert len(rows) == 3 and all(rows)
        for row in rows:  # links inside the four words of each side
            assert all(0 <= int(x) < 4 for pair in row.split() for x in pair.split("-"))
        (tmp_path / "t.links").write_text("\n".join(rows[:2]) + "\n", encoding="utf-8")  # cut after one chunk
        assert main([*common, "--alpha", "0.6", "--chunk", "2", "-o", str(tmp_path / "t.links")]) == 0
        assert (tmp_path / "t.links").read_text(encoding="utf-8") == whole
        with pytest.raises(SystemExit):
            main([*common, "-o", str(tmp_path / "x.links")])  # no alpha: refused, nothing written
        assert not (tmp_path / "x.links").exists()
    finally:
        torch.set_num_threads(threads)

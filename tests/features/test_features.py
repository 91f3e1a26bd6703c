"""Sparse dictionaries: SAELens loads them with the same maths, the sparse training path has dense autograd's
gradients, the stream uses every activation once within a bounded buffer, training resumes exactly, and the
evaluation's numbers hold for dictionaries whose answers are known (exact, zero)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dictionary_helpers import fit_interrupted_after
from model_helpers import make_batch, make_model, tiny_model_and_corpus

from workbench.decoding.translator import TranslationModel
from workbench.features import ActivationStream, DictionaryConfig, SparseDictionary, fvu, resolve_site, splice_hooks
from workbench.features.sites import capture_site, site_rows
from workbench.features.train import FeatureTrainConfig, FeatureTrainer, fisher_readout, memory_readout

CKPT = Path(__file__).resolve().parents[2] / "checkpoints" / "multi30k-de-en"


def _random_dictionary(architecture="topk", transcoder=False, d=16, n=64, k=5, seed=0, skip=False):
    torch.manual_seed(seed)
    cfg = DictionaryConfig("dec.1.hook_resid_cross_attn" if transcoder else "hook_memory", d_in=d, d_sae=n,
                           architecture=architecture, k=k, d_out=d if transcoder else None,
                           hook_name_out="dec.1.ffn.hook_out" if transcoder else None, model_name="tiny", skip=skip)
    dic = SparseDictionary(cfg)
    with torch.no_grad():
        dic.b_enc.normal_(0, 0.1)
        dic.b_dec.normal_()
        if skip:
            dic.W_skip.normal_(0, 0.3)  # zero at the start of training; non-zero here so the test sees it
        if architecture in ("jumprelu", "batchtopk"):
            dic.threshold.uniform_(0.0, 1.0)  # (one value per latent for JumpReLU; any values load the same)
    return dic


@pytest.mark.parametrize("architecture,transcoder,skip", [
    ("topk", False, False), ("relu", False, False), ("relu", True, False), ("relu", True, True),
    ("jumprelu", False, False), ("batchtopk", False, False), ("jumprelu", True, False), ("batchtopk", True, True)])
def test_sae_lens_loads_the_same_dictionary(tmp_path, architecture, transcoder, skip):
    sae_lens = pytest.importorskip("sae_lens")
    dic = _random_dictionary(architecture, transcoder, skip=skip)
    dic.save(tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "cfg.json").read_text())
    tc = "skip_transcoder" if skip else "transcoder"
    jump = f"jumprelu_{tc}" if transcoder else "jumprelu"  # BatchTopK is saved as the JumpReLU it is at inference
    assert cfg["architecture"] == {"topk": "topk", "relu": tc if transcoder else "standard", "jumprelu": jump,
                                   "batchtopk": jump}[architecture]
    sae = sae_lens.SAE.load_from_disk(tmp_path / "d")
    relu_name = ("SkipTranscoder" if skip else "Transcoder") if transcoder else "StandardSAE"
    jump_name = f"JumpReLU{relu_name}" if transcoder else "JumpReLUSAE"
    assert type(sae).__name__ == {"topk": "TopKSAE", "relu": relu_name, "jumprelu": jump_name,
                                  "batchtopk": jump_name}[architecture]
    assert sae.cfg.metadata.hook_name == dic.cfg.hook_name
    if transcoder:
        assert sae.cfg.metadata.hook_name_out == "dec.1.ffn.hook_out" and sae.cfg.d_out == 16
    x = torch.randn(40, 16) * 3
    with torch.no_grad():
        ours, theirs = dic.encode(x), sae.encode(x)
        assert torch.allclose(ours, theirs, atol=1e-5)
        assert int((ours > 0).sum(-1).max()) <= (5 if architecture == "topk" else 64)
        assert torch.allclose(dic.decode(ours), sae.decode(theirs), atol=1e-5)
        assert torch.allclose(dic(x), sae(x), atol=1e-5)  # the skip term included
        if skip:
            assert torch.allclose(sae.W_skip, dic.W_skip) and not torch.allclose(dic(x), dic.decode(ours))
    again = SparseDictionary.load(tmp_path / "d")
    assert again.cfg.to_sae_lens() == dic.cfg.to_sae_lens()
    assert torch.equal(again.encode(x), dic.encode(x)) and torch.equal(again(x), dic(x))


def test_bad_dictionary_directory_is_one_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="cfg.json"):
        SparseDictionary.load(tmp_path)
    _random_dictionary().save(tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "cfg.json").read_text())
    (tmp_path / "d" / "cfg.json").write_text(json.dumps(cfg | {"d_sae": 65}))
    with pytest.raises(ValueError, match="do not match"):
        SparseDictionary.load(tmp_path / "d")
    (tmp_path / "d" / "cfg.json").write_text(json.dumps(cfg | {"architecture": "gated"}))
    with pytest.raises(ValueError, match="gated"):
        SparseDictionary.load(tmp_path / "d")


def test_batchtopk_keeps_the_batchs_largest_activations_with_dense_autograds_gradients():
    dic = _random_dictionary("batchtopk", transcoder=False)
    x = torch.randn(50, 16)
    out = dic.training_forward(x)
    out.recon.pow(2).sum().backward()
    sparse = {k: p.grad.clone() for k, p in dic.named_parameters() if p.grad is not None}
    dic.zero_grad()
    acts = dic.pre_activations(x).relu()  # the definition (Bussmann et al.): the k·B largest of the whole batch
    keep = torch.zeros(acts.numel(), dtype=torch.bool)
    keep[acts.flatten().topk(5 * 50).indices] = True
    feats = acts * keep.view_as(acts)
    assert int((feats > 0).sum(-1).max()) > 5 > int((feats > 0).sum(-1).min())  # rows differ: not per-row TopK
    recon = dic.decode(feats)
    recon.pow(2).sum().backward()
    assert torch.allclose(out.recon, recon, atol=1e-5)
    assert int((out.acts > 0).sum()) == 5 * 50
    for k, g in sparse.items():
        assert torch.allclose(g, getattr(dic, k).grad, atol=1e-4, rtol=1e-4), k


def test_jumprelu_straight_through_gradients_are_sae_lens():
    jump = pytest.importorskip("sae_lens.saes.jumprelu_sae")
    dic = _random_dictionary("jumprelu", transcoder=False, k=10)
    with torch.no_grad():
        dic.threshold.uniform_(1.0, 2.0)
    x = torch.randn(50, 16) * 2
    out = dic.training_forward(x, bandwidth=0.3)
    # the sparse path sees each row's 4k = 40 largest: every latent near or above its threshold is among them
    assert int((dic.pre_activations(x) > dic.threshold - 0.15).sum(-1).max()) < 40
    (out.recon.pow(2).sum() + 0.7 * out.l0).backward()
    ours = {k: p.grad.clone() for k, p in dic.named_parameters()}
    dic.zero_grad()
    pre = dic.pre_activations(x)
    feats = jump.JumpReLU.apply(pre, dic.threshold, 0.3, False)
    l0 = jump.Step.apply(pre, dic.threshold, 0.3, False).sum(-1).mean()
    (dic.decode(feats).pow(2).sum() + 0.7 * l0).backward()
    assert float(out.l0.detach()) == pytest.approx(float(l0.detach()))
    assert float(dic.threshold.grad.abs().sum()) > 0
    for k, p in dic.named_parameters():
        assert torch.allclose(ours[k], p.grad, atol=1e-4, rtol=1e-4), k


@pytest.mark.parametrize("transcoder,skip", [(False, False), (True, False), (True, True)])
def test_sparse_training_path_matches_dense_autograd(transcoder, skip):
    dic = _random_dictionary("topk", transcoder, skip=skip)
    x = torch.randn(50, 16)
    dead = torch.zeros(64, dtype=torch.bool)
    dead[::3] = True
    out = dic.training_forward(x, dead=dead, k_aux=8)
    (out.recon.pow(2).sum() + out.aux_recon.pow(2).sum()).backward()
    sparse = {k: p.grad.clone() for k, p in dic.named_parameters()}
    dic.zero_grad()
    # the same two reconstructions through dense autograd
    pre = dic.pre_activations(x)
    recon = dic(x)
    masked = pre.masked_fill(~dead, float("-inf"))
    v, i = masked.topk(8, dim=-1)
    aux = torch.zeros_like(pre).scatter(-1, i, v.relu()) @ dic.W_dec
    (recon.pow(2).sum() + aux.pow(2).sum()).backward()
    assert torch.allclose(out.recon, recon, atol=1e-5) and torch.allclose(out.aux_recon, aux, atol=1e-5)
    for k, p in dic.named_parameters():
        assert torch.allclose(sparse[k], p.grad, atol=1e-4, rtol=1e-4), k




def test_sites_and_splicing(tiny_config):
    model = make_model(tiny_config)
    src, tgt = make_batch(tiny_config)
    assert resolve_site(model, "hook_memory").side == "src"
    ffn = resolve_site(model, "dec.1.ffn")
    assert (ffn.hook_in, ffn.hook_out, ffn.side) == ("dec.1.hook_resid_cross_attn", "dec.1.ffn.hook_out", "tgt")
    with pytest.raises(KeyError, match="closest"):
        resolve_site(model, "hook_memroy")
    with pytest.raises(ValueError, match="2 layers"):
        resolve_site(model, "dec.5.ffn")
    # the transcoder's input is what the FFN reads: feeding it to the FFN gives the FFN's output
    acts = capture_site(model, src, tgt, ffn)
    assert torch.allclose(model.dec[1].ffn(acts[ffn.hook_in]), acts[ffn.hook_out], atol=1e-6)
    # splicing with the error term added back changes nothing; without it, the site holds the reconstruction
    dic = SparseDictionary(DictionaryConfig(ffn.hook_in, 32, 64, k=4, d_out=32, hook_name_out=ffn.hook_out))
    clean = model(src, tgt)
    with model.hooks(splice_hooks(ffn, dic, error=True)):
        assert torch.allclose(model(src, tgt), clean, atol=1e-5)
    with model.hooks(splice_hooks(ffn, dic)):
        spliced = capture_site(model, src, tgt, ffn)
    assert torch.allclose(spliced[ffn.hook_out], dic(spliced[ffn.hook_in]), atol=1e-6)


def test_stream_uses_every_activation_once_with_a_bounded_buffer():
    model, data = tiny_model_and_corpus()
    site = resolve_site(model, "hook_memory")
    stream = ActivationStream(model, data, site, buffer=64, batch=16, max_tokens=64, seed=1)
    epoch = torch.cat([site_rows(model, data.collate(idx, model.cfg), site)[0]
                       for idx in data.batches(64, seed=1, epoch=0)])
    # stay inside the first epoch: what was read = handed out + the buffer's other half + a model batch's rest
    seen = [stream.next_batch()[0] for _ in range((epoch.size(0) - 32 - 64) // 16)]
    assert stream.epoch == 0
    assert stream.buf.size(0) == 64 and (stream.pending is None or stream.pending.size(0) < 64 + 64)
    rows = torch.cat(seen)
    # each row handed out is a real activation of the epoch, none twice
    match = torch.cdist(rows, epoch).argmin(1)
    assert torch.allclose(rows, epoch[match], atol=1e-6)
    assert match.unique().numel() == match.numel()


def _train_cfg(tmp_path, **over):
    return FeatureTrainConfig(**{"checkpoint": "tiny", "site": "hook_memory", "out_dir": str(tmp_path / "run"),
                                 "d_sae": 64, "k": 4, "activations": 16 * 12, "batch": 16, "buffer": 64,
                                 "max_tokens": 64, "warmup": 2, "log_every": 4, "progress": "none",
                                 "dead_after": 40} | over)


@pytest.mark.parametrize("architecture", ["topk", "relu", "relu-skip-transcoder", "topk-kl", "batchtopk", "jumprelu",
                                          "topk-cached", "topk-readout"])
def test_training_resumes_exactly(tmp_path, architecture):
    model, data = tiny_model_and_corpus()
    tm = TranslationModel(model, None)
    extra = {"architecture": "relu", "target_l0": 6.0} if architecture.startswith("relu") else {}
    if architecture in ("batchtopk", "jumprelu"):
        extra = {"architecture": architecture}
    if architecture == "topk-cached":
        extra = {"cache": True}
    if architecture == "topk-readout":
        extra = {"readout": True}
    if architecture == "relu-skip-transcoder":
        extra |= {"site": "dec.1.ffn", "skip": True}
    if architecture == "topk-kl":  # the end-to-end term from step 4: the stop at 5 falls inside it
        extra |= {"kl_coef": 1.0, "kl_steps": 8, "kl_tokens": 32}
    whole = FeatureTrainer(_train_cfg(tmp_path / "a", **extra), translation_model=tm, data=data).fit()
    first = FeatureTrainer(_train_cfg(tmp_path / "b", **extra), translation_model=tm, data=data)
    fit_interrupted_after(first, 5)  # Ctrl-C during step 5: the loop stops after it and saves
    assert first.interrupted and first.step == 5 and (tmp_path / "b" / "run" / "state.pt").is_file()
    assert not (tmp_path / "b" / "run" / "dictionary").exists()
    resumed = FeatureTrainer(_train_cfg(tmp_path / "b", **extra), translation_model=tm, data=data)
    assert resumed.step == 5
    out = resumed.fit()
    for (k, a), b in zip(whole.state_dict().items(), out.state_dict().values()):
        assert torch.equal(a, b), k
    cfg = json.loads((tmp_path / "b" / "run" / "dictionary" / "cfg.json").read_text())
    assert cfg["architecture"] == {"topk": "topk", "relu": "standard", "topk-kl": "topk", "topk-cached": "topk",
                                   "topk-readout": "topk",
                                   "batchtopk": "jumprelu", "jumprelu": "jumprelu"}.get(architecture, "skip_transcoder")
    if architecture == "relu-skip-transcoder":  # the linear term trained, and it is saved and loaded
        assert out.W_skip.abs().sum() > 0
        assert torch.equal(SparseDictionary.load(tmp_path / "b" / "run" / "dictionary").W_skip, out.W_skip)
    log = [json.loads(line) for line in (tmp_path / "b" / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [4, 8, 12] and all(r["fvu"] > 0 for r in log)
    if architecture == "topk-kl":
        assert [r["kl"] > 0 for r in log] == [False, True, True]
    with pytest.raises(ValueError, match="--fresh"):
        FeatureTrainer(_train_cfg(tmp_path / "b", k=5, **extra), translation_model=tm, data=data)


def test_readout_measures_the_error_as_the_cross_attentions_read_it(tmp_path):
    model, data = tiny_model_and_corpus()
    r = memory_readout(model)
    e = torch.randn(7, model.cfg.d_model)
    direct = torch.zeros(7)
    for layer in model.dec:  # keys, and values through the output projection, each block at unit Frobenius norm
        for m in (layer.cross_attn.k_proj.weight, layer.cross_attn.out_proj.weight @ layer.cross_attn.v_proj.weight):
            direct += (e @ (m / m.norm()).T).pow(2).sum(1)
    assert torch.allclose((e @ r).pow(2).sum(1), direct, rtol=1e-4)
    with pytest.raises(ValueError, match="cross-attentions"):
        FeatureTrainer(_train_cfg(tmp_path, site="dec.1.cross_attn.hook_out", readout=True),
                       translation_model=TranslationModel(model, None), data=data)


def test_fisher_metric_is_zero_on_a_direction_the_model_does_not_read(tmp_path):
    model, data = tiny_model_and_corpus()
    with torch.no_grad():  # the decoder no longer reads coordinate 0 of the encoder output
        for layer in model.dec:
            layer.cross_attn.k_proj.weight[:, 0] = 0
            layer.cross_attn.v_proj.weight[:, 0] = 0
    site = resolve_site(model, "hook_memory")
    r = fisher_readout(model, data, site, batches=4, max_tokens=64, floor=1e-9)  # (a floor keeps Cholesky defined)
    gram = r @ r.T
    assert float(gram[0, 0]) < 1e-6 * float(gram.diagonal()[1:].mean())
    assert bool((gram.diagonal()[1:] > 0).all())
    assert all(not p.grad_fn and p.requires_grad for p in model.parameters())  # the model is left as it was
    trainer = FeatureTrainer(_train_cfg(tmp_path, fisher=True, fisher_batches=4), translation_model=TranslationModel(
        model, None), data=data)
    assert trainer.readout is not None and trainer.fit() is trainer.dictionary


def test_skip_transcoder_starts_at_the_least_squares_linear_map(tmp_path):
    model, data = tiny_model_and_corpus()
    trainer = FeatureTrainer(_train_cfg(tmp_path, site="dec.1.ffn", architecture="relu", skip=True),
                             translation_model=TranslationModel(model, None), data=data)
    d = model.cfg.d_model
    x = torch.randn(200, d)
    a, c = torch.randn(d, d), torch.randn(d)
    trainer._init_skip(x, x @ a.T + c)  # an exactly linear "FFN": the skip term is it
    assert torch.allclose(trainer.dictionary.W_skip, a, atol=1e-3)
    assert torch.allclose(trainer.dictionary.b_dec, c, atol=1e-3)


@pytest.mark.parametrize("architecture", ["topk", "batchtopk", "jumprelu"])
def test_training_reduces_the_reconstruction_error(tmp_path, architecture):
    model, data = tiny_model_and_corpus()
    tm = TranslationModel(model, None)
    trainer = FeatureTrainer(_train_cfg(tmp_path, activations=16 * 150, lr=1e-2, log_every=10, k=8,
                                        architecture=architecture), translation_model=tm, data=data)
    dic = trainer.fit()
    x = torch.cat([site_rows(model, data.collate(idx, model.cfg), trainer.site)[0] for idx in data.batches(256)])
    with torch.no_grad():
        held = fvu(x, dic(x))
        assert held < 0.4 * trainer.log[0]["fvu"]
        assert held == pytest.approx(trainer.log[-1]["fvu"], abs=0.1)  # the logged batch FVU tells the truth
        l0 = (dic.encode(x) > 0).sum(-1).double()
        if architecture == "topk":
            assert int(l0.max()) <= 8
        else:  # the inference threshold (BatchTopK's estimate, JumpReLU's learned one) lands near the target L0
            assert 4 <= float(l0.mean()) <= 12


def _exact_relu_sae(hook, d):
    """relu(x) - relu(-x) = x: a ReLU SAE with 2d features that reconstructs exactly."""
    dic = SparseDictionary(DictionaryConfig(hook, d_in=d, d_sae=2 * d, architecture="relu"))
    eye = torch.eye(d)
    with torch.no_grad():
        dic.W_enc.copy_(torch.cat([eye, -eye], 1))
        dic.W_dec.copy_(torch.cat([eye, -eye], 0))
        dic.b_enc.zero_()
        dic.b_dec.zero_()
    return dic


@pytest.mark.slow
def test_evaluation_of_known_dictionaries_on_the_shipped_model(shared_data):
    from workbench.decoding.translator import load
    from workbench.features.evaluate import evaluate_dictionary

    tm = load(CKPT)
    exact = _exact_relu_sae("hook_memory", 128)
    r = evaluate_dictionary(tm, exact, split="valid", bleu_split="test2016", limit=12, data_root=shared_data,
                            density_tokens=3000)
    assert r["fvu"] == pytest.approx(0, abs=1e-10)
    assert r["ce_spliced"] == pytest.approx(r["ce_clean"], abs=1e-5)
    assert r["delta_ce"] == pytest.approx(0, abs=1e-5) and r["kl"] == pytest.approx(0, abs=1e-5)
    assert r["ce_recovered"] == pytest.approx(1.0, abs=1e-4) and r["ce_zero_ablated"] > r["ce_clean"] + 1
    assert r["ce_recovered_mean"] == pytest.approx(1.0, abs=1e-4) and r["ce_mean_ablated"] > r["ce_clean"]
    assert r["bleu_spliced"] == r["bleu_clean"] and r["beam"] == 5
    # one of relu(x_i), relu(-x_i) is non-zero for each of the 128 coordinates; each fires on about half the tokens
    assert r["l0"] == pytest.approx(128, abs=0.5) and r["dead_frac"] == 0 and r["dense_frac"] > 0.9
    assert r["density_tokens"] >= 3000 and r["density_split"].startswith("multi30k:train[:")
    # PCA with as many components (128) as L0 is exact too; the random dictionary at k = 128 is not
    pca, rnd = r["baselines"]["pca"], r["baselines"]["random"]
    assert pca["components"] == 128 and pca["fvu"] == pytest.approx(0, abs=1e-4)
    assert pca["delta_ce"] == pytest.approx(0, abs=1e-3) and rnd["fvu"] > 0.01 and rnd["l0"] <= 128
    t = r["timing"]
    assert t["card_seconds"] > 0 and t["baseline_seconds"] > 0  # the share itself: from the unrounded seconds
    assert t["baseline_share"] == pytest.approx(t["baseline_seconds"] / t["card_seconds"], abs=0.1 / t["card_seconds"])
    zero = _exact_relu_sae("hook_memory", 128)
    with torch.no_grad():
        zero.W_dec.zero_()
    r0 = evaluate_dictionary(tm, zero, split="valid", bleu_split=None, limit=12, data_root=shared_data,
                             density_tokens=3000, baselines=False)
    assert "baselines" not in r0
    assert r0["ce_recovered"] == pytest.approx(0.0, abs=1e-6) and r0["fvu"] > 1

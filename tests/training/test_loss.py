import pytest
import torch
import torch.nn.functional as F

from workbench import presets
from workbench.core.model import Transformer
from workbench.training.loss import label_smoothed_nll, output_loss, smoothed_distribution, teacher_forced_loss

PAD = 0


def _data(seed=0, n=12, vocab=11):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, n // 3, vocab, generator=g, requires_grad=True)
    target = torch.randint(1, vocab, (3, n // 3), generator=g)
    target[0, -2:] = PAD
    return logits, target


def test_smoothed_distribution_matches_definition():
    vocab, eps = 7, 0.2
    target = torch.tensor([3, PAD, 5])
    dist = smoothed_distribution(target, vocab, eps, PAD)
    assert dist.shape == (3, vocab)
    assert torch.allclose(dist[0].sum(), torch.tensor(1.0))
    assert dist[0, 3] == pytest.approx(1 - eps + eps / vocab)
    assert dist[0, 0] == pytest.approx(eps / vocab)  # every class, padding included (PyTorch's definition)
    assert torch.all(dist[1] == 0)  # ignored rows contribute nothing
    assert dist[2].argmax() == 5


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_loss_is_cross_entropy_against_the_smoothed_distribution(eps):
    logits, target = _data()
    loss, nll, n = label_smoothed_nll(logits, target, smoothing=eps, ignore_index=PAD)
    lprobs = F.log_softmax(logits.reshape(-1, logits.size(-1)), -1)
    dist = smoothed_distribution(target, logits.size(-1), eps, PAD)
    assert loss.item() == pytest.approx(-(dist * lprobs).sum().item(), rel=1e-5)
    keep = target.reshape(-1) != PAD
    gold = lprobs[keep].gather(1, target.reshape(-1)[keep, None])
    assert nll.item() == pytest.approx(-gold.sum().item(), rel=1e-5)
    assert n.item() == int(keep.sum())
    loss.backward()
    assert torch.all(logits.grad[0, -2:] == 0)  # padding positions get no gradient


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_equals_pytorch_cross_entropy_with_label_smoothing(eps):
    logits, target = _data(seed=5)
    loss, _, _ = label_smoothed_nll(logits, target, smoothing=eps, ignore_index=PAD)
    ref = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=PAD,
                          label_smoothing=eps, reduction="sum")
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    g1 = torch.autograd.grad(loss, logits)[0]
    g2 = torch.autograd.grad(ref, logits)[0]
    assert torch.allclose(g1, g2, atol=1e-6)


def test_sums_add_up_across_splits():
    """Gradient accumulation relies on sums: two halves give the whole batch's loss."""
    logits, target = _data(seed=3)
    whole = label_smoothed_nll(logits, target, ignore_index=PAD)
    a = label_smoothed_nll(logits[:1], target[:1], ignore_index=PAD)
    b = label_smoothed_nll(logits[1:], target[1:], ignore_index=PAD)
    for w, x, y in zip(whole, a, b):
        assert w.item() == pytest.approx((x + y).item(), rel=1e-5)


def test_bad_input_is_refused():
    logits, target = _data()
    with pytest.raises(ValueError, match="smoothing"):
        label_smoothed_nll(logits, target, smoothing=1.0, ignore_index=PAD)
    with pytest.raises(ValueError, match="disagree"):
        label_smoothed_nll(logits, target[:, :-1], ignore_index=PAD)


def _unfused(hidden, weight, bias, target, eps):
    return label_smoothed_nll(F.linear(hidden, weight, bias), target, smoothing=eps, ignore_index=0)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("chunk", [4, 5, 512])
def test_fused_output_loss_has_the_unfused_sums_and_gradients(eps, with_bias, chunk):
    # (3, 7) positions, some padding, chunks that do and do not divide the 15 real rows
    torch.manual_seed(0)
    v, d = 23, 6
    target = torch.randint(1, v, (3, 7))
    target[0, 5:] = 0
    target[2, 3:] = 0
    results = []
    for fused in (False, True):
        torch.manual_seed(1)
        hidden = torch.randn(3, 7, d, requires_grad=True)
        weight = torch.randn(v, d, requires_grad=True)
        bias = torch.randn(v, requires_grad=True) if with_bias else None
        if fused:
            loss, nll, n = output_loss(hidden, weight, bias, target, smoothing=eps, ignore_index=0, chunk=chunk)
        else:
            loss, nll, n = _unfused(hidden, weight, bias, target, eps)
        (2.5 * loss).backward()
        grads = [hidden.grad, weight.grad] + ([bias.grad] if with_bias else [])
        results.append((loss.detach(), nll, n, grads))
    (l0, n0, c0, g0), (l1, n1, c1, g1) = results
    torch.testing.assert_close(l1, l0)
    torch.testing.assert_close(n1, n0)
    assert int(c1) == int(c0) == 15
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert not n1.requires_grad


def test_output_loss_with_rows_found_on_the_host_is_the_same_loss_and_gradient():
    # the trainer passes the batch's non-padding rows (found where the batch is built) to spare a device sync
    torch.manual_seed(0)
    target = torch.randint(1, 30, (4, 9))
    target[1, 5:] = 0
    target[3, 2:] = 0
    rows = (target.reshape(-1) != 0).nonzero().squeeze(1)
    results = []
    for given in (None, rows):
        hidden = torch.randn(4, 9, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
        weight = torch.randn(30, 8, generator=torch.Generator().manual_seed(2), requires_grad=True)
        loss, nll, n = output_loss(hidden, weight, None, target, smoothing=0.1, ignore_index=0, chunk=7, rows=given)
        loss.backward()
        results.append((loss.detach(), nll, int(n), hidden.grad, weight.grad))
    for a, b in zip(*results):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))


def test_fused_output_loss_without_grad_computes_only_the_loss():
    torch.manual_seed(0)
    hidden, weight = torch.randn(4, 9, 8), torch.randn(30, 8)
    target = torch.randint(1, 30, (4, 9))
    with torch.no_grad():
        loss, nll, n = output_loss(hidden, weight, None, target, smoothing=0.1, ignore_index=0, chunk=7)
    ref = _unfused(hidden, weight, None, target, 0.1)
    torch.testing.assert_close(loss, ref[0])
    torch.testing.assert_close(nll, ref[1])
    with pytest.raises(ValueError, match="disagree"):
        output_loss(hidden, weight, None, target[:, :3], smoothing=0.1, ignore_index=0)
    with pytest.raises(ValueError, match="smoothing"):
        output_loss(hidden, weight, None, target, smoothing=1.0, ignore_index=0)


def test_teacher_forced_loss_trains_the_model_as_the_logits_path_would():
    # the trainer's loss on a real model: same value and the same gradient on every parameter (tied embeddings too)
    cfg = presets.tiny(vocab=40, tie_embeddings="all")
    torch.manual_seed(0)
    src = torch.randint(4, 40, (3, 6))
    tgt = torch.randint(4, 40, (3, 5))
    src[1, 4:] = cfg.pad_id
    tgt[2, 3:] = cfg.pad_id
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    grads = []
    for fused in (False, True):
        torch.manual_seed(3)
        model = Transformer(cfg).eval()
        if fused:
            loss, nll, n = teacher_forced_loss(model, src, tgt_in, tgt_out, smoothing=0.1)
        else:
            loss, nll, n = label_smoothed_nll(model(src, tgt_in), tgt_out, smoothing=0.1, ignore_index=cfg.pad_id)
        loss.backward()
        grads.append((loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}))
    torch.testing.assert_close(grads[1][0], grads[0][0])
    assert grads[1][1].keys() == grads[0][1].keys()
    for k in grads[0][1]:
        torch.testing.assert_close(grads[1][1][k], grads[0][1][k], atol=1e-5, rtol=1e-4, msg=k)


def test_bf16_autocast_loss_scores_float32_logits_of_the_bf16_decoder_output():
    # under amp only the encoder and decoder run in bf16: the output layer and the loss see float32 (bf16 logits
    # were the bf16 H100 run's 0.1-nat gap); same value as scoring float32 logits of the cast decoder output
    cfg = presets.tiny(vocab=40)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    src = torch.randint(4, 40, (3, 6))
    tgt = torch.randint(4, 40, (3, 5))
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    loss, nll, n = teacher_forced_loss(model, src, tgt_in, tgt_out, smoothing=0.1, amp=True)
    assert loss.dtype == torch.float32
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model(src, tgt_in, project=False)
    logits = F.linear(hidden.float(), model.output_proj.weight, model.output_proj.bias)
    expected, expected_nll, _ = label_smoothed_nll(logits, tgt_out, smoothing=0.1, ignore_index=cfg.pad_id)
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(nll, expected_nll, rtol=1e-5, atol=1e-4)
    loss.backward()
    assert model.output_proj.weight.grad.dtype == torch.float32
    assert torch.isfinite(model.output_proj.weight.grad).all()

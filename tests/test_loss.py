import pytest
import torch
import torch.nn.functional as F

from workbench.loss import label_smoothed_nll, smoothed_distribution

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

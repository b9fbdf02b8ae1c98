"""The LM loss (migrate.models.common.masked_lm_loss): ops.cross_entropy's value bit for bit, with the
log-softmax's max held out of the gradient, so the gradient is torch's form, g - softmax * sum(g)."""
import mindspore as ms
import numpy as np
import pytest
import torch
from mindspore import Tensor, ops

from migrate.models.common import masked_lm_loss

VOCAB = 333


def _case():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((2, 50, VOCAB)) * 5).astype(np.float32)
    labels = rng.integers(0, VOCAB, (2, 50)).astype(np.int32)
    labels[0, :3] = -100  # ignored positions
    return logits, labels


def _ours(logits, labels):
    return masked_lm_loss(logits, labels, VOCAB, -100)


def _cross_entropy(logits, labels):
    return ops.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100, reduction="mean")


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_the_loss_has_cross_entropys_bits_and_torchs_gradient(mode):
    ms.set_context(mode=mode)
    try:
        logits, labels = _case()
        x, y = Tensor(logits), Tensor(labels)
        loss = ms.jit(_ours) if mode == ms.GRAPH_MODE else _ours
        assert loss(x, y).asnumpy().view(np.uint32) == _cross_entropy(x, y).asnumpy().view(np.uint32)
        grad = ms.grad(_ours)(x, y).asnumpy()
        t = torch.tensor(logits, requires_grad=True)
        torch.nn.functional.cross_entropy(t.reshape(-1, VOCAB), torch.tensor(labels).long().reshape(-1),
                                          ignore_index=-100).backward()
        expected = t.grad.numpy()
        assert not grad[0, :3].any(), "ignored positions get no gradient"
        # within float32 rounding of torch's (the row's softmax is ~1e-2 here: an ulp is ~1e-9)
        np.testing.assert_allclose(grad, expected, rtol=0, atol=2e-8)
        # a logit moved by a wrong amount must show: the check is not vacuous
        assert np.abs(ms.grad(_ours)(Tensor(logits * 1.01), y).asnumpy() - expected).max() > 1e-6
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)

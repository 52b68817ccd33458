"""``PolicyHandle.input_gradients`` with and without ``embedding_offset``: the forward on
E + offset, the gradient with respect to the clean E, against hand autograd."""

from __future__ import annotations

import pytest
import torch
from creditlab.step.forward import position_ids
from creditlab.step.policy import ModelPolicyHandle
from creditlab.testing import FakePolicyHandle

from tests.helpers import tiny_model_and_tokenizer
from tests.numerics import assert_close_fp, lm_length

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.numerics]


def _length(model, ids):
    """Rounded terms behind one input gradient (the forward and backward chains)."""
    return lm_length(model.config, ids.shape[1], backward=True)


def _objective(emb: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Nonlinear in the logits and in the clean embeddings it is handed."""
    return (logits[..., :7].double() ** 2).sum() + 0.5 * (emb.double() ** 3).sum()


def _batch():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 20, (2, 6), generator=gen)
    att = torch.ones_like(ids)
    att[1, 4:] = 0  # right padding
    return ids, att


@pytest.fixture(scope="module")
def model_handle():
    model, tok = tiny_model_and_tokenizer(seed=1)
    return model, ModelPolicyHandle(model, tok, None, torch.Generator().manual_seed(0))


def _hand(model, ids, att, offset):
    """d objective(E, logits(E + offset)) / dE by hand."""
    e = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    x = e if offset is None else e + offset
    logits = model(inputs_embeds=x, attention_mask=att, position_ids=position_ids(att)).logits
    (grad,) = torch.autograd.grad(_objective(e, logits), e)
    return e.detach(), grad


def test_model_handle_offset_is_the_hand_gradient_at_the_shifted_input(model_handle):
    model, ctx = model_handle
    ids, att = _batch()
    e0 = model.get_input_embeddings()(ids).detach()
    offset = 0.05 * torch.randn(e0.shape, generator=torch.Generator().manual_seed(1))
    emb, grad = ctx.input_gradients(ids, att, _objective, embedding_offset=offset)
    want_e, want_g = _hand(model, ids, att, offset)
    torch.testing.assert_close(emb, e0, rtol=0, atol=0)  # the clean E is returned
    assert_close_fp(grad, want_g, length=_length(model, ids))
    _, plain = ctx.input_gradients(ids, att, _objective)
    assert not torch.allclose(grad, plain, rtol=1e-3, atol=1e-4)  # the offset changes the forward
    # a float64 offset is cast to the embeddings' dtype
    _, grad64 = ctx.input_gradients(ids, att, _objective, embedding_offset=offset.double())
    assert torch.equal(grad64, grad)  # the same float32 offset, the same computation


def test_model_handle_without_offset_is_unchanged(model_handle):
    model, ctx = model_handle
    ids, att = _batch()
    emb, grad = ctx.input_gradients(ids, att, _objective)
    want_e, want_g = _hand(model, ids, att, None)
    torch.testing.assert_close(emb, want_e, rtol=0, atol=0)
    assert_close_fp(grad, want_g, length=_length(model, ids))
    _, zero = ctx.input_gradients(ids, att, _objective, embedding_offset=torch.zeros_like(emb))
    assert_close_fp(zero, grad, length=_length(model, ids))  # summation order differs
    with pytest.raises(ValueError, match="embedding_offset"):
        ctx.input_gradients(ids, att, _objective, embedding_offset=torch.zeros(emb.shape[1:]))


def test_fake_handle_offset():
    ctx = FakePolicyHandle()
    ids, att = _batch()
    e = ctx.embedding(ids).detach()
    offset = torch.randn(e.shape, generator=torch.Generator().manual_seed(2))

    def hand(off):
        x = e.clone().requires_grad_(True)
        inputs = x if off is None else x + off
        logits = ctx.logits_fn(ids).float() + inputs.sum(-1, keepdim=True)
        return torch.autograd.grad(_objective(x, logits), x)[0]

    emb, grad = ctx.input_gradients(ids, att, _objective, embedding_offset=offset)
    torch.testing.assert_close(emb, e, rtol=0, atol=0)
    torch.testing.assert_close(grad, hand(offset))
    _, plain = ctx.input_gradients(ids, att, _objective)
    torch.testing.assert_close(plain, hand(None))
    assert not torch.allclose(grad, plain)

"""creditlab.step.forward.response_logits: each distinct prompt runs once, with the same logits and
gradients as the plain full forward (left-padded prompts, right-padded responses, micro-batches,
fallbacks)."""

from __future__ import annotations

import functools

import pytest
import torch
from creditlab.step.evaluation import EvalConfig
from creditlab.step.forward import response_logits, unique_rows
from creditlab.step.losses import LossConfig, gather_logprobs
from creditlab.step.module import CreditAssignmentModule
from creditlab.step.policy import forward_logits
from creditlab.step.rollout import RolloutConfig, collate
from creditlab.types import Completion, Problem, Trajectory

from tests.helpers import tiny_model_and_tokenizer
from tests.numerics import assert_close_fp, lm_length

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.numerics]


@pytest.fixture(scope="module")
def model():
    model, _ = tiny_model_and_tokenizer(seed=0)
    model.train()  # as in training (the tiny Llama has no dropout)
    return model


def _rollout(prompt_lens=(3, 7, 5), group=4, seed=0):
    """Groups with prompts of different lengths, responses of 1..8 tokens, rows shuffled."""
    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for g, plen in enumerate(prompt_lens):
        prompt = tuple(torch.randint(5, 60, (plen,), generator=gen).tolist())
        for _ in range(group):
            n = int(torch.randint(1, 9, (1,), generator=gen))
            resp = tuple(torch.randint(5, 60, (n,), generator=gen).tolist())
            c = Completion(prompt, resp, (0.0,) * n, "eos", "")
            trajs.append(Trajectory(Problem(str(g), "q", "1"), c, 0.0, g))
    order = torch.randperm(len(trajs), generator=gen).tolist()
    return collate([trajs[i] for i in order], 0)


def _plain(model, batch, rows=None):
    """The reference: the full forward's logits at the columns predicting the response."""
    rows = torch.arange(batch.size) if rows is None else rows
    ids, mask, p = batch.input_ids[rows], batch.attention_mask[rows], batch.prompt_len
    return forward_logits(model, ids, mask)[:, p - 1 : -1].float()


def _shared(model, batch, rows=None, **kw):
    rows = torch.arange(batch.size) if rows is None else rows
    ids, mask = batch.input_ids[rows], batch.attention_mask[rows]
    return response_logits(model, ids, mask, batch.prompt_len, **kw)


def _calls(model):
    """A list that gets one entry per ``model(...)`` call, and the hook handle."""
    calls = []
    handle = model.register_forward_hook(lambda *args: calls.append(1))
    return calls, handle


def _backward(batch, logits, rows=None):
    """Back-propagate a weighted log-prob loss over real tokens; return the (b, T) log-probs."""
    rows = torch.arange(batch.size) if rows is None else rows
    lp = gather_logprobs(logits, batch.response_ids[rows])
    weights = torch.linspace(-1.0, 1.0, batch.size)[rows][:, None] * batch.response_mask[rows]
    (-(lp * weights).sum() / batch.response_mask.sum()).backward()
    return lp.detach()


def _with_grads(model, fn):
    """``(fn(), parameter gradients)`` from a clean start."""
    model.zero_grad(set_to_none=True)
    out = fn()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out, grads


def _n(model, batch):
    """Rounded terms behind one logit or log-prob of ``batch``."""
    return lm_length(model.config, batch.input_ids.shape[1])


def _assert_grads_close(want, got, model, batch):
    """Every parameter's gradient within rounding of its tensor's scale."""
    n = lm_length(model.config, batch.input_ids.shape[1], backward=True, tokens=int(batch.attention_mask.sum()))
    for a, b in zip(want, got):
        assert_close_fp(b, a, length=n)


def test_unique_rows_first_appearance_order():
    x = torch.tensor([[3, 1], [0, 0], [3, 1], [2, 2], [0, 0]])
    first, inverse = unique_rows(x)
    assert first.tolist() == [0, 1, 3] and inverse.tolist() == [0, 1, 0, 2, 1]
    assert torch.equal(x[first][inverse], x)


def test_shared_prompts_equal_plain_logprobs_and_gradients(model):
    batch = _rollout()
    p, mask = batch.prompt_len, batch.attention_mask
    assert (mask[:, :p] == 0).any() and (mask[:, p:] == 0).any()  # left and right padding
    kept = {}

    def run(fn):
        logits = fn()
        kept[fn] = logits.detach()
        return _backward(batch, logits)

    plain = functools.partial(_plain, model, batch)
    shared = functools.partial(_shared, model, batch)
    lp_plain, g_plain = _with_grads(model, lambda: run(plain))
    calls, handle = _calls(model)
    try:
        lp_shared, g_shared = _with_grads(model, lambda: run(shared))
    finally:
        handle.remove()
    assert len(calls) == 2  # the prompt pass and the response pass: the prompts were shared
    assert kept[shared].shape == kept[plain].shape and kept[shared].dtype == torch.float32
    real = batch.response_mask.bool()
    assert_close_fp(lp_shared[real], lp_plain[real], length=_n(model, batch))
    assert_close_fp(kept[shared], kept[plain], length=_n(model, batch))  # pads too
    _assert_grads_close(g_plain, g_shared, model, batch)


def test_micro_batches_split_groups(model):
    """Rows of one group in different micro-batches: accumulated gradients equal the plain ones."""
    batch = _rollout(prompt_lens=(4, 6), group=5, seed=1)
    order = torch.randperm(batch.size, generator=torch.Generator().manual_seed(3))
    micro = torch.split(order, 3)
    assert any(len(set(batch.group_ids[m].tolist())) > 1 for m in micro)

    def run(logits_fn):
        out = torch.zeros_like(batch.response_mask)
        for rows in micro:
            out[rows] = _backward(batch, logits_fn(model, batch, rows), rows)
        return out

    lp_plain, g_plain = _with_grads(model, lambda: run(_plain))
    lp_shared, g_shared = _with_grads(model, lambda: run(_shared))
    assert_close_fp(lp_shared, lp_plain, length=_n(model, batch))
    _assert_grads_close(g_plain, g_shared, model, batch)


def test_no_duplicates_falls_back_to_one_plain_forward(model):
    batch = _rollout(prompt_lens=(3, 6, 4, 8), group=1, seed=2)
    lp_plain, g_plain = _with_grads(model, lambda: _backward(batch, _plain(model, batch)))
    calls, handle = _calls(model)
    try:
        lp, g = _with_grads(model, lambda: _backward(batch, _shared(model, batch)))
        assert len(calls) == 1
        calls.clear()
        with torch.no_grad():
            off = _shared(model, _rollout(seed=2), share_prompts=False)  # duplicates, not shared
        assert len(calls) == 1
    finally:
        handle.remove()
    assert_close_fp(lp, lp_plain, length=_n(model, batch))
    _assert_grads_close(g_plain, g, model, batch)
    with torch.no_grad():
        assert_close_fp(off, _plain(model, _rollout(seed=2)), length=_n(model, _rollout(seed=2)))


def test_one_response_column_under_no_grad(model):
    batch = _rollout(prompt_lens=(2, 5), group=3, seed=4)
    p = batch.prompt_len
    ids, mask = batch.input_ids[:, : p + 1], batch.attention_mask[:, : p + 1]
    with torch.no_grad():
        got = response_logits(model, ids, mask, p)
        want = forward_logits(model, ids, mask)[:, p - 1 : -1]
    assert got.shape == (batch.size, 1, want.shape[-1])
    assert_close_fp(got, want, length=lm_length(model.config, p + 1))


def test_unsupported_cache_falls_back():
    """A sliding-window model (its cache is not a plain DynamicLayer one) runs the plain forward."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(
        vocab_size=70, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=6, pad_token_id=0,
    )
    mistral = MistralForCausalLM(cfg).eval()
    batch = _rollout(prompt_lens=(3, 5), group=3, seed=5)
    calls, handle = _calls(mistral)
    try:
        with torch.no_grad():
            got = _shared(mistral, batch)
    finally:
        handle.remove()
    assert len(calls) == 1
    with torch.no_grad():
        assert_close_fp(got, _plain(mistral, batch), length=_n(mistral, batch))


def test_dropout_and_gradient_checkpointing_fall_back():
    model, _ = tiny_model_and_tokenizer(seed=1)
    batch = _rollout(prompt_lens=(3, 5), group=3, seed=6)
    calls, handle = _calls(model)
    try:
        model.config.attention_dropout = 0.1
        model.train()
        _shared(model, batch)
        assert len(calls) == 1  # dropout in training mode: no sharing
        calls.clear()
        model.eval()
        _shared(model, batch)
        assert len(calls) == 2  # eval mode: no dropout, shared
        model.config.attention_dropout = 0.0
        # activation_* since transformers 5.24 (gradient_checkpointing_* warns there)
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
        model.train()
        calls.clear()
        lp, _ = _with_grads(model, lambda: _backward(batch, _shared(model, batch)))
        assert len(calls) == 1
        getattr(model, "activation_checkpointing_disable", model.gradient_checkpointing_disable)()
    finally:
        handle.remove()
    want, _ = _with_grads(model, lambda: _backward(batch, _plain(model, batch)))
    assert_close_fp(lp, want, length=_n(model, batch))


def test_module_response_logits_and_old_logprobs_equal_plain():
    torch.manual_seed(0)
    model, tok = tiny_model_and_tokenizer(seed=2)
    module = CreditAssignmentModule(
        model, tok, None, None, [], LossConfig(micro_batch_size=5), RolloutConfig(),
        EvalConfig(every=0), functools.partial(torch.optim.SGD, lr=0.1), seed=0,
    )
    batch = _rollout(prompt_lens=(4, 2, 6), group=4, seed=7)
    rows = torch.tensor([0, 3, 5, 6, 9])
    with torch.no_grad():
        want = _plain(model, batch)
        got = module.response_logits(batch, rows)
        old = module.old_logprobs(batch)
    assert_close_fp(got, want[rows], length=_n(model, batch))
    want_lp = gather_logprobs(want, batch.response_ids) * batch.response_mask
    assert_close_fp(old, want_lp, length=_n(model, batch))


@pytest.mark.parametrize("name", ["llama-dynamic-rope", "llama-mha", "llama-head-bias", "qwen2-tied", "qwen2-mqa"])
def test_shared_prompts_equal_plain_forward_on_every_architecture(name):
    """The public cache path (each prompt once) equals the plain forward's logits and gradients
    for Llama (MHA, GQA, head bias) and Qwen2 (tied, MQA); dynamic RoPE takes the plain path."""
    from tests.unit.test_accel import MODELS

    model, _ = MODELS[name]()
    model.train()
    batch = _rollout(prompt_lens=(3, 7, 5, 0))  # one group with an empty prompt
    p, ids, mask = batch.prompt_len, batch.input_ids, batch.attention_mask
    assert (mask[:, :p] == 0).any() and (mask[:, p:] == 0).any()  # left and right padding

    def run(fn):
        model.zero_grad(set_to_none=True)
        logits = fn()
        lp = gather_logprobs(logits, batch.response_ids)
        weights = torch.linspace(-1.0, 1.0, batch.size)[:, None] * batch.response_mask
        (-(lp * weights).sum() / batch.response_mask.sum()).backward()
        return logits.detach(), [q.grad.clone() for q in model.parameters()]

    want, g_want = run(lambda: forward_logits(model, ids, mask)[:, p - 1 : -1].float())
    got, g_got = run(lambda: response_logits(model, ids, mask, p))
    assert_close_fp(got, want, length=_n(model, batch))  # pads too
    _assert_grads_close(g_want, g_got, model, batch)


def test_keep_last_index_gives_the_int_slices_logits_from_a_contiguous_input():
    """``keep_last`` (an index tensor) selects what ``logits_to_keep=n`` does; the int's
    non-contiguous view makes torch.matmul copy a frozen LM head once per row (LoRA), the index
    a small contiguous copy of the hidden states."""
    from creditlab.step.forward import keep_last

    model, _ = tiny_model_and_tokenizer(seed=0)
    ids = torch.randint(5, 40, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for n in (1, 4):
            want = model(input_ids=ids, logits_to_keep=n).logits
            got = model(input_ids=ids, logits_to_keep=keep_last(n, ids.device)).logits
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    hidden = torch.randn(3, 9, 8)
    assert hidden[:, keep_last(4, hidden.device), :].is_contiguous()
    assert not hidden[:, -4:, :].is_contiguous()

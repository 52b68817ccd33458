"""The fused LM head (creditlab.step.fused_head): equal to the unfused log-softmax and entropy in
values and gradients (any token / vocabulary tiling, temperature, bias, bf16, autocast, tied
weights, no tokens), and no ``(N, V)`` tensor saved for the backward or built at all."""

from __future__ import annotations

import pytest
import torch
from creditlab.step.fused_head import FusedHeadFunction, fused_logprob_entropy, trl_available
from creditlab.step.losses import entropy_from_logits, gather_logprobs
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tests.numerics import assert_close_fp, lm_length

pytestmark = pytest.mark.numerics

N, H, V = 37, 16, 301


def _length(n=N, h=H, v=V, backward=False):
    """Rounded terms behind one log-prob or entropy of the head (a logit's dot product over ``h``,
    the softmax's sum over ``v``) and, with ``backward``, behind one gradient (the chain back, and
    a weight's sum over the ``n`` tokens)."""
    return 2 * (h + v) + n if backward else h + v


def _inputs(n=N, h=H, v=V, dtype=torch.float32, bias=True, seed=0, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    hid = torch.randn(n, h, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(v, h, generator=g) * scale).to(dtype).requires_grad_()
    b = (torch.randn(v, generator=g) * 0.3).to(dtype).requires_grad_() if bias else None
    y = torch.randint(0, v, (n,), generator=g)
    a = torch.randn(n, generator=g)  # per-token advantages
    return hid, w, b, y, a


def _reference(hid, w, b, y, temperature):
    """The unfused path: the full (N, V) logits, then log-softmax / entropy in float32."""
    logits = hid @ w.T + (b if b is not None else 0.0)
    return gather_logprobs(logits, y, temperature), entropy_from_logits(logits, temperature)


def _grads(lp, ent, a, c, params):
    loss = (a * lp).sum() + c * ent.sum()
    return torch.autograd.grad(loss, [p for p in params if p is not None])


@pytest.mark.parametrize("token_chunk", [1, 7, N, N + 20])
@pytest.mark.parametrize("vocab_chunk", [None, 64, V - 1])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_equals_unfused_values_and_gradients(token_chunk, vocab_chunk, temperature):
    hid, w, b, y, a = _inputs()
    lp, ent = fused_logprob_entropy(hid, w, y, b, temperature=temperature, token_chunk=token_chunk,
                                    vocab_chunk=vocab_chunk)
    lp_ref, ent_ref = _reference(hid, w, b, y, temperature)
    assert lp.dtype == ent.dtype == torch.float32 and lp.shape == ent.shape == (N,)
    assert_close_fp(lp, lp_ref, length=_length())
    assert_close_fp(ent, ent_ref, length=_length())
    want = _grads(lp_ref, ent_ref, a, 0.37, (hid, w, b))
    for g, g_ref in zip(_grads(lp, ent, a, 0.37, (hid, w, b)), want):
        assert_close_fp(g, g_ref, length=_length(backward=True))


def test_gradcheck_float64_both_outputs():
    """Finite differences in float64: the entropy gradient ``-p (log p + H)`` and the log-prob's,
    through two token chunks and three vocabulary tiles."""
    hid, w, b, y, _ = _inputs(n=5, h=3, v=11, dtype=torch.float64)

    def f(hid, w, b):
        return FusedHeadFunction.apply(hid, w, b, y, 0.8, 3, 4)

    assert torch.autograd.gradcheck(f, (hid, w, b))


@pytest.mark.parametrize("which", ["logprob", "entropy"])
def test_one_output_alone(which):
    """Only one output in the loss (entropy logged, not trained; or an entropy bonus alone)."""
    hid, w, b, y, a = _inputs(bias=False)
    fused = fused_logprob_entropy(hid, w, y, token_chunk=8, vocab_chunk=100)
    out = dict(zip(("logprob", "entropy"), fused))
    ref = dict(zip(("logprob", "entropy"), _reference(hid, w, None, y, 1.0)))
    got = torch.autograd.grad((a * out[which]).sum(), (hid, w))
    want = torch.autograd.grad((a * ref[which]).sum(), (hid, w))
    for g, g_ref in zip(got, want):
        assert_close_fp(g, g_ref, length=_length(backward=True))


def test_frozen_head_and_leading_dims():
    """(b, T, H) hidden states with (b, T) targets; a frozen head (LoRA elsewhere) gets no grad."""
    hid, w, _, y, _ = _inputs(n=12, bias=False)
    w = w.detach()
    lp, ent = fused_logprob_entropy(hid.view(3, 4, H), w, y.view(3, 4), token_chunk=5)
    lp_ref, ent_ref = _reference(hid, w, None, y, 1.0)
    assert lp.shape == ent.shape == (3, 4)
    assert_close_fp(lp.reshape(-1), lp_ref, length=_length(n=12))
    (g,) = torch.autograd.grad(lp.sum() + ent.sum(), hid)
    (g_ref,) = torch.autograd.grad(lp_ref.sum() + ent_ref.sum(), hid)
    assert_close_fp(g, g_ref, length=_length(n=12, backward=True))


def test_bf16_accumulates_in_fp32():
    """bf16 inputs: close to float32 truth on the same (bf16-representable) values, and much
    closer than a naive bf16 log-softmax; gradients come back in bf16 within bf16 tolerance.

    V = 4096 small logits make ``logprob ≈ entropy ≈ -/+ log V ≈ 8.3``, where bf16's spacing is
    1/16: rounding the results (or the sums) to bf16 costs ~1e-2, rounding the small logits ~1e-4.
    """
    hid, w, b, y, a = _inputs(n=64, h=32, v=4096, dtype=torch.bfloat16, scale=0.02)
    lp, ent = fused_logprob_entropy(hid, w, y, b, temperature=0.9, token_chunk=16, vocab_chunk=1000)
    assert lp.dtype == ent.dtype == torch.float32
    f32 = [t.detach().float().requires_grad_() for t in (hid, w, b)]
    lp_ref, ent_ref = _reference(*f32, y, 0.9)
    torch.testing.assert_close(lp, lp_ref, rtol=0, atol=5e-3)
    torch.testing.assert_close(ent, ent_ref, rtol=0, atol=5e-3)
    z = ((hid @ w.T + b) / 0.9).detach()  # naive: everything in bf16
    naive_lp = torch.log_softmax(z, -1).gather(-1, y[:, None]).squeeze(1)
    naive_ent = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    err, naive_err = (lp - lp_ref).abs().mean(), (naive_lp.float() - lp_ref).abs().mean()
    assert err * 10 < naive_err, (err, naive_err)
    err, naive_err = (ent - ent_ref).abs().mean(), (naive_ent.float() - ent_ref).abs().mean()
    assert err * 10 < naive_err, (err, naive_err)
    got = _grads(lp, ent, a, 0.5, (hid, w, b))
    assert all(g.dtype == torch.bfloat16 for g in got)
    for g, g_ref in zip(got, _grads(lp_ref, ent_ref, a, 0.5, f32)):
        err = (g.float() - g_ref).abs().max()
        assert err <= 2e-2 * g_ref.abs().max(), err


def test_autocast_casts_like_the_head():
    """Under bf16 autocast, float32 parameters: the bf16 result, float32 gradients."""
    hid, w, b, y, a = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = fused_logprob_entropy(hid, w, y, b, token_chunk=10)
    want = fused_logprob_entropy(hid.bfloat16(), w.bfloat16(), y, b.bfloat16(), token_chunk=10)
    torch.testing.assert_close(lp, want[0])
    torch.testing.assert_close(ent, want[1])
    grads = _grads(lp, ent, a, 0.5, (hid, w, b))
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


def test_tied_embeddings_gradients_add_up():
    """A tiny tied-embedding Llama: the fused head on its last hidden state (after the final norm)
    with ``lm_head.weight`` (the input embedding) gives the model's own log-probs and entropies,
    and the embedding's gradient sums both uses, as the model's own logits do."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    ids = torch.randint(0, 97, (2, 9))
    a = torch.randn(2, 8)

    out = model(input_ids=ids, output_hidden_states=True)
    lp, ent = fused_logprob_entropy(out.hidden_states[-1][:, :-1], model.lm_head.weight, ids[:, 1:],
                                    temperature=0.8, token_chunk=5, vocab_chunk=40)
    (a * lp).sum().add(0.3 * ent.sum()).backward()
    fused = model.lm_head.weight.grad.clone()
    model.zero_grad()
    logits = model(input_ids=ids).logits[:, :-1]
    lp_ref, ent_ref = gather_logprobs(logits, ids[:, 1:], 0.8), entropy_from_logits(logits, 0.8)
    (a * lp_ref).sum().add(0.3 * ent_ref.sum()).backward()
    assert_close_fp(lp, lp_ref, length=lm_length(cfg, 9))
    assert_close_fp(ent, ent_ref, length=lm_length(cfg, 9))
    assert_close_fp(fused, model.lm_head.weight.grad, length=lm_length(cfg, 9, backward=True, tokens=ids.numel()))


def test_no_tokens():
    hid, w, b, y, _ = _inputs(n=0)
    lp, ent = fused_logprob_entropy(hid, w, y, b, token_chunk=4)
    assert lp.shape == ent.shape == (0,)
    (lp.sum() + ent.sum()).backward()
    assert hid.grad.shape == (0, H) and w.grad.shape == (V, H)
    assert not w.grad.any() and not b.grad.any()


def test_arguments_checked():
    hid, w, b, y, _ = _inputs()
    with pytest.raises(ValueError, match="temperature"):
        fused_logprob_entropy(hid, w, y, temperature=0.0)
    with pytest.raises(ValueError, match="token_chunk"):
        fused_logprob_entropy(hid, w, y, token_chunk=0)
    with pytest.raises(ValueError, match="want hidden"):
        fused_logprob_entropy(hid, w, y[:-1])
    with pytest.raises(ValueError, match="dtype"):
        fused_logprob_entropy(hid, w.detach().double(), y)


class _Largest(TorchDispatchMode):
    """The largest numel of any tensor an op produces while active (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_nothing_of_size_n_by_v_saved_or_built():
    """Saved for the backward: no tensor as large as (N, V) (the unfused path saves several);
    built at all, forward and backward: nothing larger than a (token_chunk, vocab_chunk) tile or
    the (V, H) / (N, H) gradient accumulators. Counted, not timed."""
    n, h, v, tc, vc = 128, 8, 512, 16, 128  # N V = 65536 > V H = 4096 > tc vc = 2048 > N H = 1024
    hid, w, b, y, a = _inputs(n=n, h=h, v=v)

    def run(fn):
        saved = []
        pack = lambda t: (saved.append(t.shape), t)[1]  # noqa: E731
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with _Largest() as mode:
                lp, ent = fn()
                forward = mode.largest
                ((a * lp).sum() + ent.sum()).backward()
        return saved, forward, mode.largest

    saved, forward, overall = run(
        lambda: fused_logprob_entropy(hid, w, y, b, token_chunk=tc, vocab_chunk=vc))
    assert (n, h) in saved and (v, h) in saved  # the hook saw the Function's saves
    assert max(s.numel() for s in saved) == v * h
    assert forward <= tc * vc and overall == v * h

    saved, forward, _ = run(lambda: _reference(hid, w, b, y, 1.0))  # the check can fail
    assert max(s.numel() for s in saved) >= n * v and forward >= n * v


@pytest.mark.skipif(not trl_available(), reason="TRL's chunked log-prob kernel is not installed")
@pytest.mark.parametrize("vocab_chunk", [None, 64])
def test_trl_backend_agrees(vocab_chunk):
    """backend='trl' (its torch fallback on a CPU) gives the same values and gradients."""
    hid, w, b, y, a = _inputs()
    kw = dict(temperature=0.7, vocab_chunk=vocab_chunk)
    got = fused_logprob_entropy(hid, w, y, b, backend="trl", **kw)
    want = fused_logprob_entropy(hid, w, y, b, token_chunk=7, **kw)
    for x, x_ref in zip(got, want):
        assert_close_fp(x, x_ref, length=_length())
    for g, g_ref in zip(_grads(*got, a, 0.4, (hid, w, b)), _grads(*want, a, 0.4, (hid, w, b))):
        assert_close_fp(g, g_ref, length=_length(backward=True))

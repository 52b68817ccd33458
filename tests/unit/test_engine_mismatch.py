"""Engine/trainer log-prob mismatch metrics and truncated importance sampling (TESTING trap 4).

``policy_loss(..., engine_logprobs=...)`` measures ``d = log π_engine - log π_old`` on trained
tokens and, with ``LossConfig.tis_cap``, multiplies each token's policy-gradient loss by the
detached weight ``min(π_old / π_engine, cap)``.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from creditlab.errors import ConfigError
from creditlab.step.aggregation import MiniBatchStats
from creditlab.step.losses import LossConfig, gather_logprobs, policy_loss

DT = torch.float64
B, T, V, D = 6, 5, 7, 3


def _toy(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=g, dtype=DT)
    w = torch.randn(D, V, generator=g, dtype=DT)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=DT)
    mask[1, 3:] = 0
    mask[4, :2] = 0  # a reset-style prefix
    adv = torch.randn(B, T, generator=g, dtype=DT) * mask
    with torch.no_grad():
        old = gather_logprobs(x @ w, ids)
    eng = old + 0.7 * torch.randn(B, T, generator=g, dtype=DT)  # some weights above a cap of 2
    return x, w, ids, mask, adv, old, eng


def _loss(cfg, w, rows=slice(None), eng_override=None, seed=0):
    x, _, ids, mask, adv, old, eng = _toy(seed)
    eng = eng if eng_override is None else eng_override
    lp = gather_logprobs(x[rows] @ w, ids[rows])
    stats = MiniBatchStats.from_mask(mask, cfg)
    return policy_loss(lp, old[rows], adv[rows], mask[rows], cfg, stats, engine_logprobs=eng[rows])


@pytest.mark.parametrize("mode", ["reinforce", "clip"])
def test_tis_weights_the_token_loss_by_the_capped_detached_ratio(mode):
    x, w0, ids, mask, adv, old, eng = _toy()
    cap = 2.0
    weight = torch.exp(old - eng).clamp(max=cap)
    assert (torch.exp(old - eng) > cap).any() and (weight < 1).any()  # both sides exercised
    w = w0.clone().requires_grad_(True)
    loss, m = _loss(LossConfig(mode=mode, tis_cap=cap, agg="token-mean"), w)
    (grad,) = torch.autograd.grad(loss, w)
    # By hand: with one update per batch (old = current) the clip surrogate is -A·ρ, ρ = 1 in
    # value, gradient -A·∇log π; reinforce is -A·log π. Both times the weight, token mean.
    w2 = w0.clone().requires_grad_(True)
    lp = gather_logprobs(x @ w2, ids)
    term = lp if mode == "reinforce" else torch.exp(lp - old)
    want = (-(adv * term) * weight * mask).sum() / mask.sum()
    (want_grad,) = torch.autograd.grad(want, w2)
    assert math.isclose(float(loss.detach()), float(want.detach()), rel_tol=1e-12, abs_tol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)
    on = mask > 0
    assert math.isclose(float(m["backend/tis_weight_mean"]), float(weight[on].mean()), rel_tol=1e-9)
    clipped = (torch.exp(old - eng) > cap)[on].double().mean()
    assert math.isclose(float(m["backend/tis_clip_frac"]), float(clipped), rel_tol=1e-12)


def test_mismatch_metrics_by_hand_and_no_effect_on_the_loss_without_tis():
    _, w, *_rest = _toy()
    _, _, _, mask, _, old, eng = _toy()
    cfg = LossConfig()
    loss_plain, m_plain = _loss(cfg, w, eng_override=old)  # engine == trainer
    loss, m = _loss(cfg, w)
    assert float(loss) == float(loss_plain)  # measured only
    assert m_plain["backend/logprob_abs_diff_max"] == 0 and m_plain["backend/logprob_kl"] == 0
    on = mask > 0
    d = (eng - old)[on]
    close = functools.partial(math.isclose, rel_tol=1e-12)
    assert close(float(m["backend/logprob_abs_diff_mean"]), float(d.abs().mean()))
    assert close(float(m["backend/logprob_abs_diff_max"]), float(d.abs().max()))
    kl = (torch.exp(-d) + d - 1).mean()  # k3 of KL(engine || trainer) on engine samples
    assert math.isclose(float(m["backend/logprob_kl"]), float(kl), rel_tol=1e-12)
    assert "backend/tis_weight_mean" not in m


@pytest.mark.parametrize("tis_cap", [None, 2.0])
def test_micro_batches_combine_to_the_full_batch(tis_cap):
    _, w0, *_ = _toy()
    cfg = LossConfig(tis_cap=tis_cap)
    w = w0.clone().requires_grad_(True)
    full, m_full = _loss(cfg, w)
    (g_full,) = torch.autograd.grad(full, w)
    w = w0.clone().requires_grad_(True)
    outs = [_loss(cfg, w, rows=s) for s in (slice(0, 2), slice(2, 5), slice(5, 6))]
    (g,) = torch.autograd.grad(sum(o[0] for o in outs), w)
    torch.testing.assert_close(g, g_full, rtol=1e-10, atol=1e-12)
    for key, value in m_full.items():
        parts = torch.stack([o[1][key] for o in outs])
        combined = parts.max() if key.endswith("_max") else parts.sum()
        assert math.isclose(float(combined), float(value), rel_tol=1e-12, abs_tol=1e-12), key


def test_garbage_engine_logprobs_in_masked_positions_change_nothing():
    _, w, _, mask, _, _, eng = _toy()
    junk = eng.clone()
    values = torch.tensor([math.inf, -math.inf, math.nan, 1e6, -1e6], dtype=DT)
    junk[mask == 0] = values[: int((mask == 0).sum())]
    cfg = LossConfig(tis_cap=2.0)
    (a, ma), (b, mb) = _loss(cfg, w), _loss(cfg, w, eng_override=junk)
    assert float(a) == float(b)
    assert {k: float(v) for k, v in ma.items()} == {k: float(v) for k, v in mb.items()}


def test_tis_needs_engine_logprobs_and_a_cap_of_at_least_one():
    x, w, ids, mask, adv, old, _ = _toy()
    cfg = LossConfig(tis_cap=2.0)
    stats = MiniBatchStats.from_mask(mask, cfg)
    with pytest.raises(ValueError, match="engine_logprobs"):
        policy_loss(gather_logprobs(x @ w, ids), old, adv, mask, cfg, stats)
    for bad in (0.5, 0.0, -1.0):
        with pytest.raises(ConfigError, match="LossConfig.tis_cap"):
            LossConfig(tis_cap=bad)

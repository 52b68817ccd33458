"""Policy losses: batch-split invariance (trap 1), padding/garbage (trap 3), KL gradients (trap 8),
clip and dual-clip hand cases, ratio exactly 1 with one update."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from creditlab.errors import ConfigError
from creditlab.step.aggregation import AGG_MODES, MiniBatchStats, aggregate, micro_batch_slices
from creditlab.step.losses import (
    LossConfig,
    entropy_from_logits,
    gather_logprobs,
    kl_penalty,
    policy_loss,
    token_loss,
)

DT = torch.float64
B, T, V, D = 10, 7, 5, 4
# (start, end) of trained positions per row: uneven lengths, reset-style offsets, an empty row.
SPANS = [(0, 7), (1, 3), (0, 5), (0, 0), (0, 1), (2, 6), (0, 2), (3, 7), (0, 4), (0, 5)]


def _toy():
    """Features x (B,T,D), ids, mask, advantages, old/ref log-probs and a weight W (D,V)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(B, T, D, generator=g, dtype=DT)
    w = torch.randn(D, V, generator=g, dtype=DT)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.zeros(B, T, dtype=DT)
    for i, (s, e) in enumerate(SPANS):
        mask[i, s:e] = 1
    adv = torch.randn(B, T, generator=g, dtype=DT) * mask
    with torch.no_grad():
        lp = gather_logprobs(x @ w, ids)
    old = lp + 0.4 * torch.randn(B, T, generator=g, dtype=DT)  # some ratios outside [0.8, 1.2]
    ref = lp + 0.5 * torch.randn(B, T, generator=g, dtype=DT)
    return dict(x=x, w=w, ids=ids, mask=mask, adv=adv, old=old, ref=ref)


def _cfg(agg, mode, kl):
    return LossConfig(
        mode="clip" if mode.startswith("clip") else "reinforce",
        agg=agg,
        dual_clip=1.5 if mode == "clip-dual" else None,  # low c: some tokens hit it
        kl_coef=0.1 if kl else 0.0,
        kl_estimator="k3",
        norm_constant=8.0,
    )


def _contribution(data, w, rows, cfg, stats, trim=True):
    """Loss contribution of the micro-batch ``rows``, re-padded to its own max length."""
    sub = {k: v[rows] for k, v in data.items() if k != "w"}
    if trim:  # a collator would pad a micro-batch only to its longest trained position
        used = (sub["mask"] > 0).any(0).nonzero()
        width = int(used.max()) + 1 if len(used) else 1
        sub = {k: v[:, :width] for k, v in sub.items()}
    lp = gather_logprobs(sub["x"] @ w, sub["ids"])
    return policy_loss(lp, sub["old"], sub["adv"], sub["mask"], cfg, stats, sub["ref"])


def _full(data, cfg):
    w = data["w"].clone().requires_grad_(True)
    stats = MiniBatchStats.from_mask(data["mask"], cfg)
    loss, metrics = _contribution(data, w, slice(0, B), cfg, stats, trim=False)
    (grad,) = torch.autograd.grad(loss, w)
    return loss.detach(), grad, metrics


SPLITS = {1: [0, 10], 2: [0, 3, 10], 3: [0, 1, 6, 10], 5: [0, 2, 3, 6, 7, 10]}
COMBOS = list(itertools.product(AGG_MODES, ["reinforce", "clip", "clip-dual"], [False, True]))


@pytest.mark.parametrize("agg,mode,kl", COMBOS)
def test_micro_batches_and_accumulation_match_full_batch(agg, mode, kl):
    data, cfg = _toy(), _cfg(agg, mode, kl)
    loss_full, grad_full, m_full = _full(data, cfg)
    assert loss_full.abs() > 1e-3 and grad_full.abs().max() > 1e-3
    assert (m_full["clip_frac"] > 0) == mode.startswith("clip")  # clipping is exercised
    assert (m_full["dual_clip_frac"] > 0) == (mode == "clip-dual")
    stats = MiniBatchStats.from_mask(data["mask"], cfg)
    for n, cuts in SPLITS.items():
        slices = [slice(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
        # (a) micro-batches summed, one backward
        w = data["w"].clone().requires_grad_(True)
        outs = [_contribution(data, w, s, cfg, stats) for s in slices]
        total = sum(o[0] for o in outs)
        (grad,) = torch.autograd.grad(total, w)
        assert math.isclose(float(total.detach()), float(loss_full), rel_tol=1e-12, abs_tol=1e-12)
        torch.testing.assert_close(grad, grad_full, rtol=1e-10, atol=1e-12)
        # metrics are additive shares (ratio_max combines by max)
        for key, value in m_full.items():
            parts = torch.stack([o[1][key] for o in outs])
            combined = parts.max() if key == "ratio_max" else parts.sum()
            assert math.isclose(float(combined), float(value), rel_tol=1e-12, abs_tol=1e-12), key
        # (b) gradient accumulation: one backward per micro-batch into .grad
        w = data["w"].clone().requires_grad_(True)
        acc_loss = 0.0
        for s in slices:
            loss, _ = _contribution(data, w, s, cfg, stats)
            loss.backward()
            acc_loss += float(loss.detach())
        assert math.isclose(acc_loss, float(loss_full), rel_tol=1e-12, abs_tol=1e-12), n
        torch.testing.assert_close(w.grad, grad_full, rtol=1e-10, atol=1e-12)


RANKS = {2: [0, 4, 10], 3: [0, 2, 7, 10]}


@pytest.mark.parametrize("agg,mode,kl", COMBOS)
@pytest.mark.parametrize("world", [2, 3])
def test_simulated_data_parallel_matches_full_batch(agg, mode, kl, world):
    """Each rank holds a shard, splits it into 2 micro-batches and accumulates; DDP averages."""
    data, cfg = _toy(), _cfg(agg, mode, kl)
    loss_full, grad_full, _ = _full(data, cfg)
    cuts = RANKS[world]
    shards = [slice(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    stats = MiniBatchStats.combine(
        [MiniBatchStats.from_mask(data["mask"][s], cfg) for s in shards], world_size=world
    )  # what all_reduce computes on a real run
    assert stats == MiniBatchStats.from_mask(data["mask"], cfg, world_size=world)
    grads, losses = [], []
    for shard in shards:
        w = data["w"].clone().requires_grad_(True)  # each rank's replica
        mid = (shard.start + shard.stop + 1) // 2
        rank_loss = 0.0
        for s in (slice(shard.start, mid), slice(mid, shard.stop)):
            loss, _ = _contribution(data, w, s, cfg, stats)
            loss.backward()
            rank_loss += float(loss.detach())
        grads.append(w.grad)
        losses.append(rank_loss)
    torch.testing.assert_close(torch.stack(grads).mean(0), grad_full, rtol=1e-10, atol=1e-12)
    assert math.isclose(sum(losses) / world, float(loss_full), rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("agg,mode,kl", COMBOS)
def test_right_padding_and_garbage_in_masked_positions_change_nothing(agg, mode, kl):
    data, cfg = _toy(), _cfg(agg, mode, kl)
    loss_full, grad_full, m_full = _full(data, cfg)
    g = torch.Generator().manual_seed(99)
    pad = 4
    big = dict(data)
    big["x"] = torch.cat([data["x"], 50 * torch.randn(B, pad, D, generator=g, dtype=DT)], 1)
    big["ids"] = torch.cat([data["ids"], torch.randint(0, V, (B, pad), generator=g)], 1)
    big["mask"] = torch.cat([data["mask"], torch.zeros(B, pad, dtype=DT)], 1)
    off = big["mask"] == 0
    for key, junk in (("adv", 1e4), ("old", -1e4), ("ref", 1e4)):
        base = torch.cat([data[key], torch.zeros(B, pad, dtype=DT)], 1)
        noise = junk * torch.randn(B, T + pad, generator=g, dtype=DT)
        big[key] = torch.where(off, noise, base)
    big["old"][0, -1], big["ref"][1, -1], big["adv"][2, -1] = math.inf, -math.inf, math.nan
    loss, grad, metrics = _full(big, cfg)
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(loss, loss_full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, grad_full, rtol=1e-12, atol=1e-12)
    for key, value in m_full.items():
        assert math.isclose(float(metrics[key]), float(value), rel_tol=1e-12, abs_tol=1e-12), key


def test_aggregation_definitions_by_hand():
    ell = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]], dtype=DT)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=DT)  # row 2 untrained
    want = {
        "token-mean": (1 + 2 + 3 + 4) / 4,
        "seq-mean-token-mean": ((1 + 2 + 3) / 3 + 4 / 1) / 2,
        "seq-mean-token-sum": (6 + 4) / 2,
        "seq-mean-token-sum-norm": (6 + 4) / 2 / 10,  # T_max = 10, mean over the 2 sequences
    }
    for agg, value in want.items():
        cfg = LossConfig(agg=agg, norm_constant=10.0)
        stats = MiniBatchStats.from_mask(mask, cfg)
        assert (stats.num_seqs, stats.num_tokens) == (2, 4.0)
        assert float(aggregate(ell, mask, cfg, stats)) == pytest.approx(value)
    empty = torch.zeros(2, 3, dtype=DT)
    cfg = LossConfig(agg="token-mean")
    p = torch.ones(2, 3, dtype=DT, requires_grad=True)
    out = aggregate(p, empty, cfg, MiniBatchStats.from_mask(empty, cfg))
    out.backward()
    assert float(out.detach()) == 0.0 and torch.equal(p.grad, torch.zeros(2, 3, dtype=DT))


# --- per-token losses -------------------------------------------------------------------------
def _hand(adv, ratio, **kw):
    cfg = LossConfig(mode="clip", **kw)
    lp = torch.log(torch.tensor(ratio, dtype=DT)).requires_grad_(True)
    loss, clipped = token_loss(lp, torch.zeros_like(lp), torch.tensor(adv, dtype=DT), cfg)
    (grad,) = torch.autograd.grad(loss.sum(), lp)
    return loss.detach().tolist(), clipped.tolist(), grad.tolist()


def test_clip_hand_cases():
    loss, clipped, grad = _hand([1.0, 1.0, -1.0, -1.0, 2.0], [1.5, 0.5, 1.5, 0.5, 1.1])
    assert loss == pytest.approx([-1.2, -0.5, 1.5, 0.8, -2.2])
    assert clipped == [True, False, False, True, False]
    # d loss / d log π = -A·ρ where unclipped, 0 where clipped
    assert grad == pytest.approx([0.0, -0.5, 1.5, 0.0, -2.2])
    loss, clipped, _ = _hand([1.0, 1.0, -1.0], [1.25, 1.4, 0.85], clip_eps_low=0.1,
                             clip_eps_high=0.3)
    assert loss == pytest.approx([-1.25, -1.3, 0.9]) and clipped == [False, True, True]


def test_dual_clip_hand_cases():
    # A<0: loss = min(-min(ρA, clip(ρ)A), -cA) with c = 3; A>0 untouched.
    loss, clipped, grad = _hand([-1.0, -1.0, 1.0, -2.0, -1.0], [5.0, 2.0, 5.0, 4.0, 0.5],
                                dual_clip=3.0)
    assert loss == pytest.approx([3.0, 2.0, -1.2, 6.0, 0.8])
    assert clipped == [True, False, True, True, True]
    assert grad == pytest.approx([0.0, 2.0, 0.0, 0.0, 0.0])
    no_dual, _, _ = _hand([-1.0, -2.0], [5.0, 4.0])
    assert no_dual == pytest.approx([5.0, 8.0])


def test_reinforce_loss_and_clip_gradient_with_ratio_one():
    data = _toy()
    w = data["w"].clone().requires_grad_(True)
    lp = gather_logprobs(data["x"] @ w, data["ids"])
    loss, clipped = token_loss(lp, lp.detach(), data["adv"], LossConfig(mode="reinforce"))
    torch.testing.assert_close(loss, -data["adv"] * lp)
    assert not clipped.any()
    outs = {}
    for mode in ("reinforce", "clip"):
        cfg = LossConfig(mode=mode, dual_clip=3.0)
        stats = MiniBatchStats.from_mask(data["mask"], cfg)
        loss, m = policy_loss(lp, None, data["adv"], data["mask"], cfg, stats)
        assert m["ratio_max"] == 1.0 and m["clip_frac"] == 0.0 and m["dual_clip_frac"] == 0.0
        assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-15)
        outs[mode] = torch.autograd.grad(loss, w, retain_graph=True)[0]
    # ratio exactly 1: the clipped surrogate has the REINFORCE gradient
    torch.testing.assert_close(outs["clip"], outs["reinforce"], rtol=1e-12, atol=1e-14)
    ratio = torch.exp(lp - lp.detach())
    assert torch.equal(ratio, torch.ones_like(ratio))


# --- log-probs, entropy -------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_gather_logprobs_and_entropy(temperature):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 4, 11, generator=g, dtype=DT) * 3
    ids = torch.randint(0, 11, (3, 4), generator=g)
    logp = torch.log_softmax(logits / temperature, -1)
    torch.testing.assert_close(gather_logprobs(logits, ids, temperature),
                               logp.gather(-1, ids[..., None])[..., 0])
    torch.testing.assert_close(entropy_from_logits(logits, temperature),
                               -(logp.exp() * logp).sum(-1))
    half = gather_logprobs(logits.to(torch.bfloat16), ids, temperature)
    assert half.dtype == torch.float32
    with pytest.raises(ValueError, match="temperature"):
        gather_logprobs(logits, ids, 0.0)


# --- KL estimators (trap 8) ---------------------------------------------------------------------
def _kl_grads(estimator):
    """Autograd gradient w.r.t. the logits z of a toy categorical π = softmax(z), for every
    possible sampled token y: rows of a (V, V) matrix."""
    g = torch.Generator().manual_seed(7)
    z = torch.randn(6, generator=g, dtype=DT).requires_grad_(True)
    log_q = torch.log_softmax(torch.randn(6, generator=g, dtype=DT), -1)
    log_pi = torch.log_softmax(z, -1)
    rows = []
    for y in range(6):
        k = kl_penalty(log_pi[y], log_q[y], estimator)
        rows.append(torch.autograd.grad(k, z, retain_graph=True)[0])
    return z.detach(), log_q, torch.stack(rows)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_per_sample_gradient_matches_analytic(estimator):
    """Per-sample check: with d = log π(y) - log q(y) and ∇_z log π(y) = e_y - π,
    ∇k1 = (e_y - π), ∇k2 = d (e_y - π), ∇k3 = (1 - exp(-d)) (e_y - π)."""
    z, log_q, grads = _kl_grads(estimator)
    pi = torch.softmax(z, -1)
    for y in range(6):
        score = torch.eye(6, dtype=DT)[y] - pi
        d = torch.log(pi[y]) - log_q[y]
        factor = {"k1": 1.0, "k2": d, "k3": 1.0 - torch.exp(-d)}[estimator]
        torch.testing.assert_close(grads[y], factor * score)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_expected_gradient_matches_analytic(estimator):
    """Expectation over y ~ π (exact enumeration, sample held fixed as in a loss term):
    E∇k1 = 0; E∇k2 = ∇_z KL(π‖q) = π ⊙ (log π/q - KL(π‖q)); E∇k3 = ∇_z KL(q‖π) = π - q."""
    z, log_q, grads = _kl_grads(estimator)
    pi, q = torch.softmax(z, -1), log_q.exp()
    expected = pi @ grads
    log_ratio = torch.log(pi) - log_q
    kl = (pi * log_ratio).sum()
    want = {"k1": torch.zeros(6, dtype=DT), "k2": pi * (log_ratio - kl), "k3": pi - q}[estimator]
    torch.testing.assert_close(expected, want)
    # values: k1 and k3 are unbiased estimates of KL(π‖q)
    values = torch.stack([kl_penalty(torch.log(pi[y]), log_q[y], estimator) for y in range(6)])
    if estimator != "k2":
        torch.testing.assert_close(pi @ values, kl)


def test_k3_nonnegative_and_zero_at_equal():
    g = torch.Generator().manual_seed(5)
    lp, ref = torch.randn(1000, generator=g) * 5, torch.randn(1000, generator=g) * 5
    assert (kl_penalty(lp, ref, "k3") >= 0).all()
    assert torch.equal(kl_penalty(lp, lp, "k3"), torch.zeros(1000))
    with pytest.raises(ValueError, match="k1"):
        kl_penalty(lp, ref, "k4")


def test_kl_needs_ref_and_is_measured_without_coef():
    data = _toy()
    lp = gather_logprobs(data["x"] @ data["w"], data["ids"])
    cfg = LossConfig(kl_coef=0.1)
    stats = MiniBatchStats.from_mask(data["mask"], cfg)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, None, data["adv"], data["mask"], cfg, stats)
    _, m = policy_loss(lp, None, data["adv"], data["mask"], LossConfig(), stats, data["ref"])
    assert m["kl"] > 0


# --- config ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"mode": "ppo"}, "mode"),
        ({"agg": "mean"}, "agg"),
        ({"kl_estimator": "k4"}, "kl_estimator"),
        ({"clip_eps_low": 1.0}, "clip_eps_low"),
        ({"clip_eps_high": -0.1}, "clip_eps_high"),
        ({"dual_clip": 1.0}, "dual_clip"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"agg": "seq-mean-token-sum-norm"}, "norm_constant"),
        ({"updates_per_batch": 0}, "updates_per_batch"),
        ({"micro_batch_size": -1}, "micro_batch_size"),
    ],
)
def test_config_validation_names_field(kwargs, field):
    with pytest.raises(ConfigError, match=f"LossConfig.{field}"):
        LossConfig(**kwargs)


def test_micro_batch_slices():
    assert micro_batch_slices(7, 0) == [slice(0, 7)]
    assert micro_batch_slices(7, 3) == [slice(0, 3), slice(3, 6), slice(6, 7)]
    assert micro_batch_slices(0, 3) == []


def test_all_reduce_single_process_group(tmp_path):
    import torch.distributed as dist

    stats = MiniBatchStats(num_seqs=3, num_tokens=7.0, norm_constant=2.0)
    assert stats.all_reduce() is stats  # no process group: identity
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert stats.all_reduce() == MiniBatchStats(3, 7.0, 2.0, world_size=1)
    finally:
        dist.destroy_process_group()

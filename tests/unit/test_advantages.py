"""Group advantages: golden values per std option, zero-sum, degenerate groups, no NaN (trap 2)."""

from __future__ import annotations

import math

import pytest
import torch
from creditlab.step.advantages import broadcast, group_advantages


def _ids(*sizes: int) -> torch.Tensor:
    return torch.cat([torch.full((n,), g, dtype=torch.long) for g, n in enumerate(sizes)])


# --- golden values (hand-computed) ----------------------------------------------------------
# rewards [1, 0, 0, 1]: mean 0.5, deviations ±0.5, Σdev² = 1.
#   sample std = sqrt(1/3) -> A = ±0.5/sqrt(1/3) = ±sqrt(3)/2; population std = 0.5 -> ±1;
#   none -> ±0.5.
# rewards [1, 0, 0, 0]: mean 0.25, deviations 0.75, -0.25 ×3, Σdev² = 0.75.
#   sample std = sqrt(0.25) = 0.5 -> [1.5, -0.5, -0.5, -0.5];
#   population std = sqrt(0.1875) -> [0.75/0.4330127, -0.25/0.4330127] = [sqrt(3), -1/sqrt(3)];
#   none -> [0.75, -0.25, -0.25, -0.25].
GOLDEN = [
    ([1.0, 0.0, 0.0, 1.0], "sample", [math.sqrt(3) / 2 * s for s in (1, -1, -1, 1)]),
    ([1.0, 0.0, 0.0, 1.0], "population", [1.0, -1.0, -1.0, 1.0]),
    ([1.0, 0.0, 0.0, 1.0], "none", [0.5, -0.5, -0.5, 0.5]),
    ([1.0, 0.0, 0.0, 0.0], "sample", [1.5, -0.5, -0.5, -0.5]),
    ([1.0, 0.0, 0.0, 0.0], "population", [math.sqrt(3)] + [-1 / math.sqrt(3)] * 3),
    ([1.0, 0.0, 0.0, 0.0], "none", [0.75, -0.25, -0.25, -0.25]),
]


@pytest.mark.parametrize("rewards,std,expected", GOLDEN)
def test_golden_values_without_eps(rewards, std, expected):
    adv, metrics = group_advantages(torch.tensor(rewards), _ids(4), std=std, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor(expected), rtol=1e-6, atol=1e-7)
    assert metrics == {"groups": 1.0, "zero_std_groups": 0.0, "singleton_groups": 0.0}


def test_eps_is_added_to_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    adv, _ = group_advantages(rewards, _ids(4), std="sample", eps=1e-2)
    want = 0.5 / (math.sqrt(1 / 3) + 1e-2)
    torch.testing.assert_close(adv, torch.tensor([want, -want, -want, want], dtype=torch.float64))
    adv, _ = group_advantages(rewards, _ids(4), std="population", eps=0.5)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=torch.float64))
    adv, _ = group_advantages(rewards, _ids(4), std="none", eps=0.5)  # eps unused without std
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=torch.float64))


def test_several_groups_unsorted_ids_and_metrics():
    # group 7: [1, 0]; group 2: [3, 3, 3] (zero std); group 5: [4] (singleton); interleaved.
    rewards = torch.tensor([1.0, 3.0, 4.0, 3.0, 0.0, 3.0])
    ids = torch.tensor([7, 2, 5, 2, 7, 2])
    adv, m = group_advantages(rewards, ids, std="population", eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.0, 0.0, 0.0, 0.0, -1.0, 0.0]))
    assert m == {"groups": 3.0, "zero_std_groups": 1.0, "singleton_groups": 1.0}
    adv, _ = group_advantages(rewards, ids, std="sample", eps=0.0)  # std of [1,0] = sqrt(1/2)
    torch.testing.assert_close(adv[[0, 4]], torch.tensor([math.sqrt(0.5), -math.sqrt(0.5)]))


@pytest.mark.parametrize("std", ["sample", "population", "none"])
@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, -7.3, 1e6 + 0.1])
def test_all_equal_group_is_exactly_zero(std, value):
    rewards = torch.full((5,), value)
    for tol in (1e-8, 0.0):  # exact equality is detected even with a zero tolerance
        adv, m = group_advantages(rewards, _ids(5), std=std, zero_std_tol=tol)
        assert torch.equal(adv, torch.zeros(5))
        assert m["zero_std_groups"] == 1.0


@pytest.mark.parametrize("std", ["sample", "population", "none"])
def test_std_below_tolerance_is_zero(std):
    rewards = torch.tensor([1.0, 1.0 + 1e-9, 1.0], dtype=torch.float64)
    adv, m = group_advantages(rewards, _ids(3), std=std, zero_std_tol=1e-8)
    assert torch.equal(adv, torch.zeros(3, dtype=torch.float64)) and m["zero_std_groups"] == 1
    adv, m = group_advantages(rewards, _ids(3), std=std, zero_std_tol=1e-12)
    assert adv.abs().sum() > 0 and m["zero_std_groups"] == 0


@pytest.mark.parametrize("std", ["sample", "population", "none"])
def test_singleton_groups_are_zero(std):
    rewards = torch.tensor([0.3, 1.0, 0.0, -2.0])
    adv, m = group_advantages(rewards, torch.tensor([0, 1, 1, 2]), std=std)
    assert adv[0] == 0 and adv[3] == 0 and not torch.isnan(adv).any()
    assert m == {"groups": 3.0, "zero_std_groups": 0.0, "singleton_groups": 2.0}
    adv, m = group_advantages(torch.tensor([5.0]), torch.tensor([0]), std=std)
    assert torch.equal(adv, torch.zeros(1)) and m["singleton_groups"] == 1.0


def _reference(rewards, ids, std, eps, tol):
    out = torch.zeros_like(rewards, dtype=torch.float64)
    for g in ids.unique():
        sel = ids == g
        r = rewards[sel].double()
        if r.numel() < 2:
            continue
        sd = r.std(correction=1 if std == "sample" else 0)
        if sd < tol or bool((r == r[0]).all()):
            continue
        out[sel] = (r - r.mean()) / (1.0 if std == "none" else sd + eps)
    return out


@pytest.mark.parametrize("std", ["sample", "population", "none"])
def test_fuzz_matches_loop_reference_sums_to_zero_never_nan(std):
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        sizes = torch.randint(1, 7, (int(torch.randint(1, 9, (1,), generator=gen)),), generator=gen)
        ids = _ids(*sizes.tolist())
        ids = ids[torch.randperm(len(ids), generator=gen)] * 3 + 11  # shuffled, non-contiguous
        if trial % 2:
            rewards = torch.randint(0, 2, ids.shape, generator=gen).float()  # binary outcomes
        else:
            rewards = torch.randn(ids.shape, generator=gen) * 10 ** float(trial % 5 - 2)
        adv, m = group_advantages(rewards, ids, std=std)
        assert torch.isfinite(adv).all()
        torch.testing.assert_close(adv.double(), _reference(rewards, ids, std, 1e-6, 1e-8),
                                   rtol=1e-5, atol=1e-6)
        sums = torch.zeros(int(ids.max()) + 1, dtype=torch.float64).index_add(0, ids, adv.double())
        assert sums.abs().max() <= 1e-6 * (1 + adv.abs().max()) * len(adv)  # float32 rounding
        assert m["singleton_groups"] == float((sizes == 1).sum())
        assert m["groups"] == float(len(sizes))


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="std"):
        group_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), std="ddof1")
    with pytest.raises(ValueError, match="NaN"):
        group_advantages(torch.tensor([1.0, float("nan")]), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="shape"):
        group_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))
    adv, m = group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert adv.shape == (0,) and m["groups"] == 0


def test_integer_rewards_give_float():
    adv, _ = group_advantages(torch.tensor([1, 0]), torch.tensor([0, 0]), std="none")
    assert adv.dtype == torch.float32 and adv.tolist() == [0.5, -0.5]


def test_broadcast_zero_on_masked_positions():
    adv = torch.tensor([2.0, -1.0, 0.5])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [0, 0, 0]], dtype=torch.float32)
    out = broadcast(adv, mask)
    assert torch.equal(out, torch.tensor([[2.0, 2.0, 0.0], [0.0, -1.0, -1.0], [0.0, 0.0, 0.0]]))
    assert not torch.signbit(out[1, 0])  # an exact +0, not -0

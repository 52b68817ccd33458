"""RLOO advantages: creditlab's contract check and values computed by hand on tiny batches.

Runs against the installed package (``pip install -e .`` or ``pip install .``); needs only
creditlab and torch, no model.
"""

import pytest
import torch
from creditlab import ConfigError, Mean, Sum, build_config, group_advantages
from creditlab.testing import FakePolicyHandle, check_advantage, check_part, make_batch
from creditlab_example.advantage import RLOOAdvantage, leave_one_out


def test_contract():
    """Interface, default Config, metrics, (B, T) shape, zeros on masked tokens, determinism,
    padding invariance (creditlab.testing)."""
    check_part("advantage", RLOOAdvantage())
    check_advantage(RLOOAdvantage(RLOOAdvantage.Config(batch_std=True)))


def test_hand_computed_tiny_batch():
    # group 0 rewards (1, 0, 0): 1 - mean(0, 0) = 1;  0 - mean(1, 0) = -0.5 (twice)
    # group 1 rewards (1, 1, 0): 1 - mean(1, 0) = 0.5 (twice);  0 - mean(1, 1) = -1
    batch = make_batch(
        groups=2, group_size=3, rewards=[1, 0, 0, 1, 1, 0], trainable_from=[0, 1, 0, 2, 0, 0]
    )
    out = RLOOAdvantage().estimate(batch, FakePolicyHandle())
    expected = torch.tensor([1.0, -0.5, -0.5, 0.5, 0.5, -1.0])
    trained = batch.loss_mask > 0
    assert out.values.shape == batch.loss_mask.shape
    assert out.values.dtype == torch.float32
    for row in range(6):
        assert torch.all(out.values[row][trained[row]] == expected[row])
    assert torch.all(out.values[~trained] == 0)
    assert out.metrics["groups"] == 2 and out.metrics["zero_groups"] == 0
    assert out.metrics["abs_mean"] == pytest.approx(4.0 / 6)


def test_singleton_and_equal_reward_groups_get_zero():
    # groups by id: 5 -> (0.1, 0.1) all equal; 9 -> (1.0) alone; 7 -> (0.3, 0.8)
    rewards = torch.tensor([0.1, 0.1, 1.0, 0.3, 0.8])
    group_ids = torch.tensor([5, 5, 9, 7, 7])
    adv, metrics = leave_one_out(rewards, group_ids)
    assert adv.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.3 - 0.8, 0.8 - 0.3])
    assert adv[:3].eq(0).all(), "exactly zero, not rounding noise"
    assert metrics == {"groups": 3.0, "singleton_groups": 1.0, "zero_groups": 1.0}


def test_equals_rescaled_group_centred_reward():
    """A_i = k/(k-1) (R_i - mean): GRPO's centred reward without std division, scaled up."""
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, generator=gen)
    group_ids = torch.arange(3).repeat_interleave(4)
    adv, _ = leave_one_out(rewards, group_ids)
    centred, _ = group_advantages(rewards, group_ids, std="none")
    torch.testing.assert_close(adv.float(), centred * 4 / 3)


def test_batch_std():
    # advantages (1, -0.5, -0.5, 0.5, 0.5, -1): squares sum to 3, sample std sqrt(3 / 5)
    batch = make_batch(groups=2, group_size=3, rewards=[1, 0, 0, 1, 1, 0])
    est = RLOOAdvantage(RLOOAdvantage.Config(batch_std=True, eps=0.0))
    values = est.estimate(batch, FakePolicyHandle()).values
    first_token = values[:, 0]  # trainable_from defaults to 0, every response has >= 1 token
    expected = torch.tensor([1.0, -0.5, -0.5, 0.5, 0.5, -1.0]) / (3 / 5) ** 0.5
    torch.testing.assert_close(first_token, expected)


def test_all_equal_batch_stays_zero_with_batch_std():
    batch = make_batch(groups=2, group_size=2, rewards=[1, 1, 0, 0])
    values = RLOOAdvantage(RLOOAdvantage.Config(batch_std=True, eps=0.0)).estimate(batch).values
    assert torch.all(values == 0) and torch.isfinite(values).all()


def test_metrics_travel_with_the_advantages_and_say_how_they_combine():
    est = RLOOAdvantage()
    out = est.estimate(make_batch(groups=3, group_size=2, rewards=[1, 0, 1, 1, 0, 0]))
    # groups (1, 0), (1, 1), (0, 0): advantages 1, -1, 0, 0, 0, 0
    assert out.metrics == {"groups": 3.0, "singleton_groups": 0.0, "zero_groups": 2.0,
                           "abs_mean": pytest.approx(2 / 6)}
    assert isinstance(out.metrics["groups"], Sum) and isinstance(out.metrics["abs_mean"], Mean)
    assert est.metrics() == {}  # one channel: a key logged by two would be an error


def test_config_validation_names_the_key():
    with pytest.raises(ConfigError, match=r"advantage\.eps must be >= 0"):
        build_config(RLOOAdvantage.Config, {"eps": -1.0}, "advantage")
    hint = r"unknown key 'advantage\.batch_sd'.*Did you mean 'advantage\.batch_std'"
    with pytest.raises(ConfigError, match=hint):
        build_config(RLOOAdvantage.Config, {"batch_sd": True}, "advantage")

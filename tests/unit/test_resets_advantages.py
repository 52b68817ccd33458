"""SRPO's advantages and loss on a reset buffer, by hand: per-group population-std advantages,
suffix-only masks, and no gradient on a reset prefix (unless the no_mask ablation)."""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from creditlab.step.aggregation import MiniBatchStats
from creditlab.step.losses import LossConfig, policy_loss
from creditlab.step.rollout import collate
from creditlab_grpo.advantage import GRPOAdvantage

from tests.unit.test_buffer import TOK, C, W, build


def srpo_batch(mask_prefix: bool = True):  # noqa: ANN201
    # Base group rewards [1, 1, 0, 1] (the first W is the seed); suffix rewards set below.
    result, _ = build({"p": [C, W, C, W, C]}, k=1, mask_prefix=mask_prefix)
    trajs = list(result.trajectories)
    suffix_rewards = iter([0.0, 1.0, 0.0, 0.0])
    trajs = [replace(t, reward=next(suffix_rewards)) if t.role == "reset" else t for t in trajs]
    return collate(trajs, TOK.pad_token_id)


def test_per_group_population_std_advantages_by_hand() -> None:
    batch = srpo_batch()
    assert batch.group_ids.tolist() == [0] * 4 + [1] * 4
    assert batch.rewards.tolist() == [1, 1, 0, 1] + [0, 1, 0, 0]  # the 1st W is the seed
    est = GRPOAdvantage(GRPOAdvantage.Config(std="population", eps=0.0))
    adv = est.estimate(batch).values
    std = math.sqrt(0.75 * 0.25)  # both groups: 3 of 4 equal, population std
    expected = [0.25 / std, 0.25 / std, -0.75 / std, 0.25 / std, -0.25 / std, 0.75 / std, -0.25 / std, -0.25 / std]
    for row, a in enumerate(expected):
        trained = batch.loss_mask[row].bool()
        assert torch.allclose(adv[row][trained], torch.full((int(trained.sum()),), a), atol=1e-6)
        assert adv[row][~trained].abs().sum() == 0
    # Suffix rows carry no advantage on the reset prefix.
    plen = batch.trajectories[4].trainable_from
    assert plen > 0 and adv[4:, :plen].abs().sum() == 0


def test_no_gradient_on_masked_prefix_tokens() -> None:
    for mask_prefix in (True, False):
        batch = srpo_batch(mask_prefix)
        adv = GRPOAdvantage(GRPOAdvantage.Config(std="population", eps=0.0)).estimate(batch).values
        cfg = LossConfig(mode="reinforce", agg="seq-mean-token-mean")
        logprobs = torch.full(batch.loss_mask.shape, -1.0, requires_grad=True)
        stats = MiniBatchStats.from_mask(batch.loss_mask, cfg)
        loss, _ = policy_loss(logprobs, logprobs.detach(), adv, batch.loss_mask, cfg, stats)
        loss.backward()
        plen = len(batch.trajectories[4].completion.response_ids[: batch.trajectories[4].completion.prefix_len])
        prefix_grad = logprobs.grad[4:, :plen]
        if mask_prefix:
            assert prefix_grad.abs().sum() == 0
            assert logprobs.grad[4:, plen:].abs().sum() > 0
        else:  # the no_mask ablation: the prefix gets the suffix's advantage too
            assert prefix_grad.abs().sum() > 0

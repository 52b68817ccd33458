"""RAFT (creditlab_raft) by hand: 1 on a success's trained tokens, 0 elsewhere; the two ways it
differs from GRPO (no blame on failures; an all-right group still trains); its metrics; the preset
composes with GRPO's loss; a bad threshold is a one-line error."""

from __future__ import annotations

import pytest
import torch
from creditlab import ConfigError
from creditlab.step.rollout import collate
from creditlab.types import Completion, Problem, Trajectory
from creditlab_grpo.advantage import GRPOAdvantage
from creditlab_raft.advantage import RAFTAdvantage

from tests.helpers import char_tokenizer

TOK = char_tokenizer()


def traj(text: str, reward: float, group: int) -> Trajectory:
    ids = tuple(TOK.encode(text, add_special_tokens=False))
    return Trajectory(Problem(f"p{group}", "p", "1"), Completion((5,), ids, tuple(-0.1 for _ in ids), "stop", text),
                      reward, group)


def batch():
    """Group 0 mixed (right "ab", wrong "cde"), group 1 all right ("f", "gh"), group 2 all wrong
    ("ijk", "l"): rows 0-5, lengths 2, 3, 1, 2, 3, 1."""
    rows = [("ab", 1.0, 0), ("cde", 0.0, 0), ("f", 1.0, 1), ("gh", 1.0, 1), ("ijk", 0.0, 2), ("l", 0.0, 2)]
    return collate([traj(*r) for r in rows], TOK.pad_token_id)


def test_raft_trains_on_the_successes_only_by_hand() -> None:
    b = batch()
    out = RAFTAdvantage().estimate(b)
    mask = b.loss_mask
    want = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])[:, None] * mask
    assert torch.equal(out.values, want.to(out.values.dtype))
    assert out.values.sum().item() == 2 + 1 + 2  # the successes' trained tokens
    grpo = GRPOAdvantage().estimate(b).values
    assert (grpo[1] * mask[1]).sum() < 0 and out.values[1].abs().sum() == 0  # GRPO blames the failure; RAFT does not
    assert grpo[2:4].abs().sum() == 0 and out.values[2:4].sum() == 3  # an all-right group: GRPO 0, RAFT trains
    assert grpo[4:].abs().sum() == 0 and out.values[4:].abs().sum() == 0  # all wrong: nothing, as GRPO
    assert {k: float(v) for k, v in out.metrics.items()} == {"accepted_share": 0.5, "groups": 3.0,
                                                           "all_wrong_groups": 1.0, "all_right_groups": 1.0}


def test_the_threshold_decides_a_success() -> None:
    b = batch()
    b.rewards[:] = torch.tensor([0.7, 0.2, 0.5, 0.9, 0.0, 0.49])
    out = RAFTAdvantage(RAFTAdvantage.Config(threshold=0.5)).estimate(b)
    assert [bool(out.values[i].any()) for i in range(6)] == [True, False, True, True, False, False]


@pytest.mark.parametrize("threshold", [float("nan"), "high", True])
def test_a_bad_threshold_is_a_clear_error(threshold) -> None:
    with pytest.raises(ConfigError, match=r"^advantage.threshold must be a finite number"):
        RAFTAdvantage.Config(threshold=threshold)


def test_the_preset_is_grpo_with_raft_advantages() -> None:
    from creditlab.cli.overrides import check

    cfg = check(["method=raft"])
    assert cfg.advantage.name == "raft" and cfg.advantage.threshold == 1.0
    assert (cfg.loss.mode, cfg.loss.agg, cfg.method) == ("clip", "seq-mean-token-mean", "raft")

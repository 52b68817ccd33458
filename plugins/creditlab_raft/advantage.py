"""RAFT: train only on the successful chains (a rejection-sampling baseline).

* RAFT — Dong et al., "RAFT: Reward rAnked FineTuning for Generative Foundation Model Alignment",
  arXiv 2304.06767: sample several responses per prompt, keep the best, fine-tune on them.
* RAFT++ — Xiong et al., "A Minimalist Approach to LLM Reasoning: from Rejection Sampling to
  Reinforce", arXiv 2504.11343: the same on verifiable rewards, on-policy, with the clipped
  importance ratio of PPO/GRPO; they find it close to GRPO, and that a large part of GRPO's edge
  over plain Reinforce comes from dropping the prompts whose samples are all wrong.

Here a row's advantage is ``A_i = 1`` when its reward reaches ``threshold`` (a success) and 0
otherwise, on every trained token: with GRPO's loss (``clip``, ``seq-mean-token-mean``, the
``method=raft`` preset) the update is supervised fine-tuning on the successes through the clipped
ratio. Against GRPO it differs in exactly two ways, which is why it is the control a
credit-assignment claim is asked for: failures get no blame at all (GRPO pushes them down), and a
group whose samples all succeed still trains (GRPO gives it 0). A group with no success trains on
nothing, as GRPO's zero-variance groups do. Ours: the threshold (1.0: the verifier's "correct"
on 0/1 rewards), and keeping every success rather than the single best of a group (with 0/1
rewards the successes tie).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from creditlab import AdvantageEstimator, Advantages, ConfigError, Mean, PolicyHandle, RolloutBatch, broadcast


class RAFTAdvantage(AdvantageEstimator):
    """1 on the trained tokens of a successful row, 0 elsewhere (RAFT / RAFT++)."""

    @dataclass
    class Config:
        """Attributes:
        threshold: A row whose reward is at least this is a success.
        """

        threshold: float = 1.0

        def __post_init__(self) -> None:
            if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) \
                    or not math.isfinite(self.threshold):
                raise ConfigError(f"advantage.threshold must be a finite number (a success is a reward >= it, "
                                  f"e.g. 1.0 for 0/1 rewards); got {self.threshold!r}.")

    def estimate(self, batch: RolloutBatch, ctx: PolicyHandle | None = None) -> Advantages:
        """Advantages of ``batch``.

        Args:
            batch: Uses ``rewards`` (B,), ``group_ids`` (B,) and ``loss_mask`` (B, T).
            ctx: Unused.

        Returns:
            ``Advantages`` with values (B, T) (dtype of ``loss_mask``): 1 on a successful row's
            trained tokens, else 0. Metrics: ``accepted_share`` (successful rows / rows),
            ``groups``, ``all_wrong_groups`` (train on nothing) and ``all_right_groups`` (GRPO
            would give them 0; RAFT trains on them).
        """
        ok = (batch.rewards >= self.config.threshold)  # (B,)
        dtype = batch.loss_mask.dtype if batch.loss_mask.is_floating_point() else torch.float32
        adv = ok.to(dtype)
        groups = torch.unique(batch.group_ids)
        per_group = [ok[batch.group_ids == g] for g in groups]
        metrics = {
            "accepted_share": Mean(float(adv.mean()) if adv.numel() else 0.0),
            "groups": Mean(float(len(groups))),
            "all_wrong_groups": Mean(float(sum(not bool(x.any()) for x in per_group))),
            "all_right_groups": Mean(float(sum(bool(x.all()) for x in per_group))),
        }
        return Advantages(values=broadcast(adv, batch.loss_mask), metrics=metrics)

"""GRPO and Dr. GRPO advantage estimators (the baselines every other method is compared with).

* GRPO — Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language
  Models", arXiv 2402.03300: outcome reward normalized within the group of G completions of one
  prompt, ``A_i = (R_i - mean) / std``, broadcast to every response token.
* Dr. GRPO — Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective",
  arXiv 2503.20783: the same without the std division (``A_i = R_i - mean``); pair it with the
  ``seq-mean-token-sum-norm`` loss aggregation (see :mod:`creditlab.step.losses`).

The group statistics are :func:`creditlab.step.advantages.group_advantages` (see it for the std options,
eps, zero-variance and singleton groups). Groups come from ``batch.group_ids``; the policy is not
queried.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from creditlab import (
    STD_OPTIONS,
    AdvantageEstimator,
    Advantages,
    ConfigError,
    Mean,
    PolicyHandle,
    RolloutBatch,
    broadcast,
    group_advantages,
)


def _validate(cfg: GRPOAdvantage.Config | DrGRPOAdvantage.Config) -> None:
    if cfg.std not in STD_OPTIONS:
        raise ConfigError(
            f"advantage.std must be one of {', '.join(STD_OPTIONS)}; got {cfg.std!r}."
        )
    if not cfg.eps >= 0:
        raise ConfigError(f"advantage.eps must be >= 0; got {cfg.eps!r}.")
    if not cfg.zero_std_tol >= 0:
        raise ConfigError(f"advantage.zero_std_tol must be >= 0; got {cfg.zero_std_tol!r}.")


class GRPOAdvantage(AdvantageEstimator):
    """Group-normalized outcome advantage broadcast to every trained token (GRPO)."""

    @dataclass
    class Config:
        """Attributes:
        std: ``"sample"`` (ddof 1, TRL/verl), ``"population"`` (ddof 0) or ``"none"``.
        eps: Added to the group std before dividing.
        zero_std_tol: Groups whose std is below this get advantage exactly 0.
        """

        std: str = "sample"
        eps: float = 1e-6
        zero_std_tol: float = 1e-8

        def __post_init__(self) -> None:
            _validate(self)

    def estimate(self, batch: RolloutBatch, ctx: PolicyHandle | None = None) -> Advantages:
        """Advantages of ``batch``.

        Args:
            batch: Uses ``rewards`` (B,), ``group_ids`` (B,) and ``loss_mask`` (B, T).
            ctx: Unused.

        Returns:
            ``Advantages`` with values (B, T) (dtype of ``loss_mask``): the group advantage of
            row ``i`` on its trained tokens, exactly 0 where ``loss_mask`` is 0. Metrics:
            ``groups``, ``zero_std_groups``, ``singleton_groups`` and ``abs_mean`` (mean |A_i|
            over rows).
        """
        return self.from_rewards(batch, batch.rewards)

    def from_rewards(self, batch: RolloutBatch, rewards: torch.Tensor) -> Advantages:
        """GRPO's advantages of ``batch`` with ``rewards`` (B,) in place of ``batch.rewards`` (a
        control that changes the rewards, e.g. ``reward_flip``, reuses the group statistics)."""
        cfg = self.config
        adv, metrics = group_advantages(rewards, batch.group_ids, cfg.std, cfg.eps, cfg.zero_std_tol)
        adv = adv.to(batch.loss_mask.dtype if batch.loss_mask.is_floating_point() else adv.dtype)
        metrics["abs_mean"] = Mean(float(adv.abs().mean()) if adv.numel() else 0.0)
        return Advantages(values=broadcast(adv, batch.loss_mask), metrics=metrics)


class DrGRPOAdvantage(GRPOAdvantage):
    """Dr. GRPO: group-centred outcome advantage without std division."""

    @dataclass
    class Config:
        """Attributes: as :class:`GRPOAdvantage.Config`, with ``std="none"`` by default."""

        std: str = "none"
        eps: float = 1e-6
        zero_std_tol: float = 1e-8

        def __post_init__(self) -> None:
            _validate(self)

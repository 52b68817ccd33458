"""RLOO: REINFORCE with a leave-one-out baseline.

Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human
Feedback in LLMs", arXiv 2402.14740. Of the k completions sampled for one prompt, each is
baselined by the mean reward of the *other* k - 1:

    A_i = R_i - 1/(k-1) * sum_{j != i} R_j  =  k/(k-1) * (R_i - mean_j R_j)

The baseline does not depend on completion i, so the policy-gradient estimate stays unbiased
(unlike GRPO's mean, which includes R_i); no value network and no std division. The advantage is
broadcast to every trained token, as the paper treats the whole completion as one action.

Follows the paper: the baseline and its per-prompt groups (here ``batch.group_ids``). Our reading
or additions: a group of one completion (no "others") and a group whose rewards are all equal get
advantage exactly 0 (the formula gives 0 up to rounding); ``batch_std`` optionally divides by the
std of the per-completion advantages over the batch (as TRL's ``normalize_advantages`` does,
without re-centring, so every group keeps a zero mean). Pair it with the ``rloo`` method preset
(REINFORCE loss, sequence log-prob sums) or use it inside any other preset (``advantage=rloo``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from creditlab import AdvantageEstimator, Advantages, Mean, PolicyHandle, RolloutBatch, Sum


def leave_one_out(
    rewards: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-completion RLOO advantages.

    Args:
        rewards: (B,) float rewards.
        group_ids: (B,) long; rows with equal ids were sampled for the same prompt. Any values,
            not necessarily sorted or contiguous.

    Returns:
        ``(advantages, metrics)``: advantages (B,) float64, ``R_i`` minus the mean reward of the
        other rows of its group, exactly 0 for singleton groups and groups with equal rewards;
        metrics ``groups``, ``singleton_groups`` and ``zero_groups`` (size >= 2, equal rewards).

    Raises:
        ValueError: Mismatched shapes or non-finite rewards.
    """
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both have shape (B,); got {tuple(rewards.shape)} and "
            f"{tuple(group_ids.shape)}."
        )
    if rewards.numel() == 0:
        empty = {"groups": Sum(0), "singleton_groups": Sum(0), "zero_groups": Sum(0)}
        return torch.zeros(0, dtype=torch.float64), empty
    r = rewards.detach().to(torch.float64)
    if not torch.isfinite(r).all():
        raise ValueError("rewards contain NaN or inf; check the verifier.")
    _, inv = torch.unique(group_ids, return_inverse=True)  # (B,) group index in [0, G)
    n_groups = int(inv.max()) + 1
    zeros = torch.zeros(n_groups, dtype=torch.float64)
    counts = torch.bincount(inv, minlength=n_groups).to(torch.float64)  # (G,)
    sums = zeros.index_add(0, inv, r)  # (G,)
    g_max = zeros.scatter_reduce(0, inv, r, reduce="amax", include_self=False)  # (G,)
    g_min = zeros.scatter_reduce(0, inv, r, reduce="amin", include_self=False)  # (G,)
    others = (sums[inv] - r) / (counts[inv] - 1).clamp(min=1)  # (B,) mean of the other rows
    singleton = counts < 2  # (G,)
    flat = ~singleton & (g_max == g_min)  # (G,)
    adv = torch.where((singleton | flat)[inv], torch.zeros_like(r), r - others)
    metrics = {  # counts: they add up over data-parallel ranks
        "groups": Sum(n_groups),
        "singleton_groups": Sum(singleton.sum()),
        "zero_groups": Sum(flat.sum()),
    }
    return adv, metrics


class RLOOAdvantage(AdvantageEstimator):
    """Leave-one-out baseline advantages (RLOO), broadcast to every trained token."""

    @dataclass
    class Config:
        """Options of ``advantage=rloo`` (YAML: ``conf/advantage/rloo.yaml`` of this package).

        Attributes:
            batch_std: Divide the advantages by their std over the batch's rows (ddof 1) plus
                ``eps`` (left as they are when that std is 0). Off in the paper.
            eps: Added to the batch std before dividing; must be >= 0.
        """

        batch_std: bool = False
        eps: float = 1e-6

        def __post_init__(self) -> None:
            if not self.eps >= 0:
                raise ValueError(f"advantage.eps must be >= 0; got {self.eps!r}. Use e.g. 1e-6.")

    def estimate(self, batch: RolloutBatch, ctx: PolicyHandle | None = None) -> Advantages:
        """Advantages of ``batch``.

        Args:
            batch: Uses ``rewards`` (B,), ``group_ids`` (B,) and ``loss_mask`` (B, T).
            ctx: Unused (RLOO needs nothing from the policy).

        Returns:
            ``Advantages`` with values (B, T), float32: row ``i``'s advantage on its trained
            tokens, exactly 0 where ``loss_mask`` is 0. Metrics (logged as
            ``train/advantage/<key>``): the counts ``groups``, ``singleton_groups``,
            ``zero_groups`` and the mean ``abs_mean`` (mean |A_i| over rows).
        """
        adv, metrics = leave_one_out(batch.rewards, batch.group_ids)  # (B,)
        if self.config.batch_std and adv.numel() > 1 and float(adv.std()) > 0:
            adv = adv / (adv.std() + self.config.eps)
        adv = adv.to(torch.float32)
        metrics["abs_mean"] = Mean(float(adv.abs().mean()) if adv.numel() else 0.0)
        values = adv[:, None].expand(batch.loss_mask.shape)  # (B, T)
        values = torch.where(batch.loss_mask > 0, values, torch.zeros_like(values))
        return Advantages(values=values, metrics=metrics)

"""Group-relative advantages (GRPO family) and their broadcast to tokens.

``A_i = (R_i - mean_g R) / (std_g R + eps)`` for every completion ``i`` of group ``g``, computed for
all groups at once with scatter/index ops (no Python loop over groups).

Conventions (see METHODS.md §0):

* ``std="sample"`` uses ddof 1 (TRL, verl), ``"population"`` ddof 0, ``"none"`` skips
  the division (Dr. GRPO): ``A_i = R_i - mean_g R``.
* A group whose rewards are all equal, or whose std is below ``zero_std_tol``, gets advantages of
  exactly 0 for every ``std`` option. For ``std="none"`` the tolerance is checked against the
  population std.
* A singleton group gets exactly 0 (its sample std is undefined); it is counted under
  ``singleton_groups``, not under ``zero_std_groups``.
* Sums are taken in float64; the result has the rewards' floating dtype (float32 for integer
  rewards). Non-finite rewards raise ``ValueError``: no NaN ever leaves this module.
"""

from __future__ import annotations

import torch

from creditlab.types import Sum

STD_OPTIONS = ("sample", "population", "none")


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    std: str = "sample",
    eps: float = 1e-6,
    zero_std_tol: float = 1e-8,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-sequence group-normalized advantages.

    Args:
        rewards: (B,) float rewards.
        group_ids: (B,) long group ids; any values, not necessarily contiguous or sorted.
        std: ``"sample"`` (ddof 1), ``"population"`` (ddof 0) or ``"none"`` (no division).
        eps: Added to the std before dividing (ignored for ``"none"``).
        zero_std_tol: Groups whose std is below this get advantage exactly 0.

    Returns:
        ``(advantages, metrics)``: advantages (B,) and the metrics ``groups`` (number of groups),
        ``zero_std_groups`` (groups of size >= 2 set to 0 because their std < ``zero_std_tol`` or
        their rewards are all equal) and ``singleton_groups`` (groups of size 1, set to 0).

    Raises:
        ValueError: On a bad ``std``/``eps``/``zero_std_tol``, mismatched shapes or non-finite
            rewards.
    """
    if std not in STD_OPTIONS:
        raise ValueError(f"std must be one of {', '.join(STD_OPTIONS)}; got {std!r}.")
    if eps < 0 or zero_std_tol < 0:
        raise ValueError(f"eps and zero_std_tol must be >= 0; got eps={eps}, tol={zero_std_tol}.")
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both have shape (B,); got {tuple(rewards.shape)} and "
            f"{tuple(group_ids.shape)}."
        )
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    if rewards.numel() == 0:
        empty = {"groups": Sum(0.0), "zero_std_groups": Sum(0.0), "singleton_groups": Sum(0.0)}
        return torch.zeros(0, dtype=out_dtype, device=rewards.device), empty
    r = rewards.detach().to(torch.float64)
    if not torch.isfinite(r).all():
        raise ValueError("rewards contain NaN or inf; fix the verifier output.")

    _, inv = torch.unique(group_ids, return_inverse=True)  # (B,) in [0, G)
    n_groups = int(inv.max()) + 1
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=r.device)
    counts = torch.bincount(inv, minlength=n_groups).to(torch.float64)  # (G,)
    mean = zeros.index_add(0, inv, r) / counts  # (G,)
    dev = r - mean[inv]  # (B,)
    sq = zeros.index_add(0, inv, dev * dev)  # (G,)
    var_pop = sq / counts
    var_sample = sq / (counts - 1).clamp(min=1)
    g_max = zeros.scatter_reduce(0, inv, r, reduce="amax", include_self=False)
    g_min = zeros.scatter_reduce(0, inv, r, reduce="amin", include_self=False)

    singleton = counts < 2  # (G,)
    if std == "sample":
        sd = var_sample.sqrt()
    else:  # "population", and the tolerance check for "none"
        sd = var_pop.sqrt()
    degenerate = ~singleton & ((g_max == g_min) | (sd < zero_std_tol))  # (G,)

    adv = dev if std == "none" else dev / (sd[inv] + eps)
    adv = torch.where((singleton | degenerate)[inv], torch.zeros_like(adv), adv)
    metrics = {
        "groups": Sum(n_groups),
        "zero_std_groups": Sum(degenerate.sum()),
        "singleton_groups": Sum(singleton.sum()),
    }
    return adv.to(out_dtype), metrics


def broadcast(adv: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast per-sequence advantages to every trained token.

    Args:
        adv: (B,) per-sequence advantages.
        loss_mask: (B, T) mask; positions with ``loss_mask > 0`` are trained.

    Returns:
        (B, T) tensor (dtype of ``adv``) equal to ``adv[i]`` on trained positions and exactly 0
        elsewhere (the mask's value is not multiplied in).
    """
    if adv.dim() != 1 or loss_mask.dim() != 2 or loss_mask.shape[0] != adv.shape[0]:
        raise ValueError(
            f"expected adv (B,) and loss_mask (B, T); got {tuple(adv.shape)} and "
            f"{tuple(loss_mask.shape)}."
        )
    values = adv[:, None].expand(loss_mask.shape)
    return torch.where(loss_mask > 0, values, torch.zeros_like(values))

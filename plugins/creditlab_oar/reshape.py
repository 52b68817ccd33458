"""Bi-level, mass-preserving reshaping of token importance into advantage weights.

Li et al., "Outcome-Grounded Advantage Reshaping for Fine-Grained Credit Assignment in
Mathematical Reasoning", arXiv 2601.07408. Follows ``calculate_oar_hybrid_weights`` in the authors'
code fragment (github.com/Valsure/Outcome-Grounded-Advantage-Reshaping, ``OAR-main.py``), per
sequence over its L reasoning tokens:

1. ``s_t = log(1 + I_t)``, for every sign of ``I_t`` as ``negative`` says (below);
2. min-max normalize ``n_t = (s_t - min s) / (max s - min s)``; a constant sequence (including
   L = 1) has ``n_t = 0`` for all t (the code divides by 1 when the range is 0), which ends in
   weight 1 everywhere;
3. ``tau = quantile_q(n)`` (linear interpolation, as ``np.quantile``);
4. low tier ``n_t < tau``: ``w_t = max(n_t / tau, w_floor)``; high tier ``n_t >= tau``:
   ``w_t = 1 + beta (n_t - tau) / (1 - tau)``;
5. ``w <- w * L / sum(w)`` (the code's ``sum_to_L``; ``preserve_mass=False`` skips it).

Differences from the code, all ours: the code adds 1e-8 to the denominators ``tau`` and
``1 - tau`` and to ``sum(w)``; here they are exact and guarded (``tau = 0``: the low tier is
empty; ``tau = 1``: the high tier holds only tokens with ``n = 1``, weight 1), which changes
weights by ~1e-8 at most. OAR-P's ``answer_joint`` importance ``phi - phi^(t)`` can be negative
(masking the token makes the answer *more* likely); there the code's ``log1p`` is negative on
(-1, 0) and NaN below -1. ``negative="signed"`` (default) uses ``sign(I) log(1 + |I|)``: equal to
the code for ``I >= 0``, finite everywhere, and in the code's order where the code is finite, so
such tokens rank lowest (low tier) as in the code; ``negative="clamp"`` sets them to 0
(ranked with the tokens that do not matter).
Positions outside ``mask`` (answer tokens, EOS, padding) get weight exactly 1.
"""

from __future__ import annotations

import torch

NEGATIVE_OPTIONS = ("signed", "clamp")


def reshape_weights(
    importance: torch.Tensor,
    mask: torch.Tensor,
    q: float = 0.5,
    beta: float = 1.0,
    w_floor: float = 0.1,
    preserve_mass: bool = True,
    negative: str = "signed",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row bi-level weights.

    Args:
        importance: (B, T) or (T,) float raw importance ``I_t`` (any values where ``mask`` is 0).
        mask: Same shape, bool (or 0/1): the reasoning tokens of each row (its L tokens).
        q: Quantile of the normalized scores that splits the tiers, in [0, 1].
        beta: High-tier boost (>= 0): the most important token gets ``1 + beta`` before
            mass preservation.
        w_floor: Lowest low-tier weight, in [0, 1].
        preserve_mass: Rescale each row's reasoning weights to sum to its L.
        negative: Negative importance: ``"signed"`` (``sign(I) log(1 + |I|)``) or ``"clamp"``
            (``I <- max(I, 0)``).

    Returns:
        ``(weights, high)``: weights with the shape and floating dtype of ``importance`` (float32
        for integer input), exactly 1 where ``mask`` is 0 and finite everywhere; ``high`` (bool,
        same shape) marks the high-tier tokens (every token of a constant row is high tier, weight
        1, as in the code).
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1]; got {q}.")
    if not 0.0 <= w_floor <= 1.0:
        raise ValueError(f"w_floor must be in [0, 1]; got {w_floor}.")
    if negative not in NEGATIVE_OPTIONS:
        raise ValueError(f"negative must be one of {NEGATIVE_OPTIONS}; got {negative!r}.")
    if not beta >= 0.0:
        raise ValueError(f"beta must be >= 0; got {beta}.")
    if importance.shape != mask.shape:
        raise ValueError(
            f"importance {tuple(importance.shape)} and mask {tuple(mask.shape)} differ."
        )
    squeeze = importance.dim() == 1
    imp = importance[None] if squeeze else importance  # (B, T)
    m = (mask[None] if squeeze else mask).bool()
    out_dtype = importance.dtype if importance.is_floating_point() else torch.float32
    if imp.numel() == 0:
        ones = torch.ones_like(imp, dtype=out_dtype)
        return (ones[0] if squeeze else ones), (m[0] if squeeze else m) & False

    x = torch.nan_to_num(imp.detach().to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
    if negative == "signed":
        s = torch.sign(x) * torch.log1p(x.abs())  # (B, T)
    else:
        s = torch.log1p(x.clamp(min=0.0))
    s_min = torch.where(m, s, torch.inf).amin(-1, keepdim=True)  # (B, 1); +inf on empty rows
    s_max = torch.where(m, s, -torch.inf).amax(-1, keepdim=True)
    span = s_max - s_min
    ok = torch.isfinite(span) & (span > 0)  # (B, 1): rows with a non-constant score
    n = torch.where(ok & m, (s - s_min) / torch.where(ok, span, 1.0), 0.0)  # (B, T) in [0, 1]
    n = n.clamp(0.0, 1.0)

    tau = torch.nanquantile(torch.where(m, n, torch.nan), q, dim=-1, keepdim=True)  # (B, 1)
    tau = torch.nan_to_num(tau, nan=0.0)  # empty rows
    low = m & (n < tau)  # empty when tau == 0 (n >= 0)
    high = m & ~low
    w_low = torch.clamp(n / torch.where(tau > 0, tau, 1.0), min=w_floor)
    rel = torch.where(tau < 1, (n - tau) / torch.where(tau < 1, 1.0 - tau, 1.0), 0.0)
    w_high = 1.0 + beta * rel
    w = torch.where(low, w_low, torch.where(high, w_high, 1.0))  # (B, T)

    if preserve_mass:
        length = m.sum(-1, keepdim=True).to(torch.float64)  # (B, 1)
        total = torch.where(m, w, 0.0).sum(-1, keepdim=True)
        scale = torch.where(total > 0, length / torch.where(total > 0, total, 1.0), 1.0)
        w = torch.where(m, w * scale, w)
    w = torch.where(m, w, 1.0).to(out_dtype)
    if squeeze:
        return w[0], high[0]
    return w, high

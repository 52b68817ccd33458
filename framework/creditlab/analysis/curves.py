"""Learning curves averaged over seeds for ``creditlab compare``: on the RL-step axis the seeds are
aligned on the steps they all logged; on token and time axes each seed is interpolated linearly
onto an even grid over the range every seed covers (no extrapolation). Bands are pointwise 95%
t half-widths (:mod:`creditlab.analysis.stats`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from creditlab.analysis import stats
from creditlab.analysis.rundirs import Run


@dataclass
class Band:
    """A learning curve averaged over seeds: mean and 95% t half-width at each ``x``.

    Attributes:
        x: Grid (RL steps the seeds share, or an even grid over the range they all cover).
        mean: Mean over seeds at each point.
        half: 95% t half-width (nan with one seed).
        n: Seeds.
        interpolated: Whether seeds were linearly interpolated onto ``x``.
    """

    x: np.ndarray
    mean: np.ndarray
    half: np.ndarray
    n: int
    interpolated: bool


#: Train reward curves: trailing mean over this many logged steps.
REWARD_SMOOTHING = 10


def _trailing_mean(ys: list[float], window: int) -> list[float]:
    """Mean of each value and up to ``window - 1`` values before it."""
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y - (ys[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def aggregate_curve(runs: list[Run], metric: str, axis: str, smooth: int = 1) -> Band | None:
    """Average ``metric`` over ``runs`` against ``axis``.

    On the step axis the seeds are aligned on the RL steps they all logged (no interpolation).
    Otherwise (tokens, time; or steps the seeds do not share) each seed is linearly interpolated
    onto an even 100-point grid over the x-range every seed covers: no extrapolation. ``smooth``
    > 1 first replaces each seed's values by their trailing mean over that many points (the
    per-step train reward of 64 samples is noisy).
    """
    curves = [c for c in (r.curve(metric, axis) for r in runs) if c[0]]
    if smooth > 1:
        curves = [(xs, _trailing_mean(list(ys), smooth)) for xs, ys in curves]
    if not curves:
        return None
    if axis == "step":
        shared = sorted(set.intersection(*(set(xs) for xs, _ in curves)))
        if len(shared) >= 2 or max(len(xs) for xs, _ in curves) == 1:
            matrix = np.array([[dict(zip(xs, ys))[s] for s in shared] for xs, ys in curves])
            return Band(np.array(shared, dtype=float), *stats.band(matrix), len(curves), False) if shared else None
    grid = stats.common_grid(curves)
    if not len(grid):
        return None
    matrix = np.array([stats.resample(xs, ys, grid) for xs, ys in curves])
    return Band(grid, *stats.band(matrix), len(curves), True)

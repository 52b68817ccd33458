"""Small statistics for comparing runs across seeds: t-intervals, curve areas, threshold crossing,
linear resampling onto a common grid and a seeded bootstrap test of a mean difference.

Everything here is a pure function of its arguments (numpy only; no scipy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Two-sided 95% Student-t quantiles t_{0.975, df} (standard table values, checked against a
#: numerical integral of the t density); between entries we interpolate linearly in 1/df.
_T975 = {
    1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060,
    9: 2.2622, 10: 2.2281, 11: 2.2010, 12: 2.1788, 13: 2.1604, 14: 2.1448, 15: 2.1314,
    16: 2.1199, 17: 2.1098, 18: 2.1009, 19: 2.0930, 20: 2.0860, 21: 2.0796, 22: 2.0739,
    23: 2.0687, 24: 2.0639, 25: 2.0595, 26: 2.0555, 27: 2.0518, 28: 2.0484, 29: 2.0452,
    30: 2.0423, 40: 2.0211, 60: 2.0003, 120: 1.9799,
}
_Z975 = 1.959964


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (``df >= 1``)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df in _T975:
        return _T975[df]
    keys = sorted(_T975)
    lo = max(k for k in keys if k < df)
    hi = min((k for k in keys if k > df), default=None)
    hi_value, hi_inv = (_Z975, 0.0) if hi is None else (_T975[hi], 1.0 / hi)
    w = (1.0 / lo - 1.0 / df) / (1.0 / lo - hi_inv)
    return _T975[lo] + w * (hi_value - _T975[lo])


@dataclass(frozen=True)
class MeanCI:
    """A sample mean with its 95% t-interval half-width (``nan`` when ``n < 2``)."""

    mean: float
    half_width: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width


def mean_ci(values: Sequence[float]) -> MeanCI:
    """Mean and 95% t-interval half-width ``t_{0.975,n-1} * s / sqrt(n)`` (sample std, ddof=1).

    Assumes the values are independent draws (one per seed) from a roughly normal distribution.
    """
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(x) == 0:
        return MeanCI(float("nan"), float("nan"), 0)
    if len(x) == 1:
        return MeanCI(float(x[0]), float("nan"), 1)
    half = t_quantile_975(len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return MeanCI(float(x.mean()), half, len(x))


def normalized_auc(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Trapezoidal area under ``ys(xs)`` divided by the x-range: the curve's average height.

    A single point returns its value; no points return ``nan``.
    """
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if len(x) == 0:
        return float("nan")
    if len(x) == 1 or x[-1] == x[0]:
        return float(y[-1])
    area = float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2.0))
    return area / float(x[-1] - x[0])


def first_crossing(xs: Sequence[float], ys: Sequence[float], threshold: float) -> float | None:
    """The x of the first point with ``y >= threshold`` (no interpolation), else ``None``."""
    for x, y in zip(xs, ys):
        if y >= threshold:
            return float(x)
    return None


def median_with_misses(values: Sequence[float | None]) -> float | None:
    """Median where ``None`` (never reached) counts as +infinity; ``None`` if the median is.

    Honest for "tokens to threshold": seeds that never reach the threshold are not dropped.
    """
    if not values:
        return None
    x = np.sort(np.asarray([math.inf if v is None else v for v in values], dtype=float))
    n = len(x)
    med = x[n // 2] if n % 2 else (x[n // 2 - 1] + x[n // 2]) / 2.0
    return None if math.isinf(med) else float(med)


def resample(xs: Sequence[float], ys: Sequence[float], grid: np.ndarray) -> np.ndarray:
    """Linear interpolation of one run's curve onto ``grid`` (inside the run's x-range only)."""
    return np.interp(grid, np.asarray(xs, dtype=float), np.asarray(ys, dtype=float))


def common_grid(curves: Sequence[tuple[Sequence[float], Sequence[float]]], points: int = 100) -> np.ndarray:
    """An even grid over the x-range every curve covers (``max`` of starts to ``min`` of ends)."""
    starts = [float(xs[0]) for xs, _ in curves if len(xs)]
    ends = [float(xs[-1]) for xs, _ in curves if len(xs)]
    if not starts or max(starts) >= min(ends):
        return np.asarray(starts[:1] if starts else [], dtype=float)
    return np.linspace(max(starts), min(ends), points)


def band(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column means and 95% t half-widths of a (seeds, points) matrix (half-width nan if 1 seed)."""
    n = matrix.shape[0]
    mean = matrix.mean(axis=0)
    if n < 2:
        return mean, np.full_like(mean, np.nan)
    return mean, t_quantile_975(n - 1) * matrix.std(axis=0, ddof=1) / math.sqrt(n)


@dataclass(frozen=True)
class BootstrapResult:
    """The mean difference (group − baseline), its 95% percentile interval and p-value.

    Attributes:
        diff: Observed difference of means (paired: mean of per-seed differences).
        low: 2.5th percentile of the bootstrap distribution.
        high: 97.5th percentile.
        p_value: Two-sided bootstrap p-value for "no difference" (see ``bootstrap_diff``).
        n: Pairs (paired) or ``(n_group, n_baseline)`` sizes as text.
        paired: Whether seeds were paired.
    """

    diff: float
    low: float
    high: float
    p_value: float
    n: str
    paired: bool


def bootstrap_diff(
    group: Sequence[float], baseline: Sequence[float], paired: bool, resamples: int = 10000, seed: int = 0
) -> BootstrapResult:
    """Bootstrap the difference of means ``mean(group) - mean(baseline)``.

    Paired: ``group[i]`` and ``baseline[i]`` share a seed; the per-seed differences are resampled
    with replacement. Unpaired: each sample is resampled on its own. The interval is the 2.5/97.5
    percentile interval of the resampled differences. The p-value shifts that distribution to
    mean zero (the null of no difference) and counts resampled differences at least as far from
    zero as the observed one: ``(1 + #{|d*_b - d| >= |d|}) / (B + 1)``. Identical samples give
    difference 0 and p = 1; a constant shift gives that shift, a zero-width interval and the
    smallest p, ``1 / (B + 1)``.

    Args:
        group: One value per seed of the compared group.
        baseline: One value per seed of the baseline (same order as ``group`` when paired).
        paired: Resample seed pairs (needs equal lengths).
        resamples: Number of bootstrap resamples B.
        seed: Seeds numpy's generator, so the result is deterministic.
    """
    g, b = np.asarray(group, dtype=float), np.asarray(baseline, dtype=float)
    rng = np.random.default_rng(seed)
    if paired:
        if len(g) != len(b):
            raise ValueError(f"paired bootstrap needs equal sizes, got {len(g)} and {len(b)}")
        d = g - b
        observed = float(d.mean())
        draws = d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
        n = str(len(d))
    else:
        observed = float(g.mean() - b.mean())
        draws = (g[rng.integers(0, len(g), size=(resamples, len(g)))].mean(axis=1)
                 - b[rng.integers(0, len(b), size=(resamples, len(b)))].mean(axis=1))
        n = f"{len(g)} vs {len(b)}"
    low, high = np.percentile(draws, [2.5, 97.5])
    # Rounding guard: with identical samples every centred draw is ~0 and must count as extreme.
    extreme = np.abs(draws - observed) >= abs(observed) - 1e-12
    p = (1 + int(extreme.sum())) / (resamples + 1)
    return BootstrapResult(observed, float(low), float(high), min(1.0, p), n, paired)

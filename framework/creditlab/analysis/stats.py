"""Small statistics for comparing runs across seeds: t-intervals, curve areas, threshold crossing
and linear resampling onto a common grid. Tests of a difference and the IQM are
:mod:`creditlab.analysis.significance`.

Everything here is a pure function of its arguments (numpy, and scipy for the t quantiles).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t


def t_quantile(df: float, level: float = 0.95) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom (``df > 0``,
    fractional for Welch's interval), from ``scipy.stats.t``: t_{0.975, 2} = 4.3027."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    return float(student_t.ppf(0.5 + level / 2, df))


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
    half = t_quantile(len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
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
    return mean, t_quantile(n - 1) * matrix.std(axis=0, ddof=1) / math.sqrt(n)


@dataclass(frozen=True)
class SamplingNoise:
    """Where the noise of a sampled accuracy comes from: problems differ (``between``, the
    variance of the problems' true success rates) and each problem's samples are coin flips
    (``within``, the mean over problems of p(1 - p)). The mean of ``n`` problems x ``k`` samples
    has variance ``between / n + within / (n k)`` (more samples shrink only the second term)."""

    between: float
    within: float

    def se(self, problems: int, samples: int) -> float:
        """Standard error of the mean over ``problems`` x ``samples``."""
        return math.sqrt(max(self.between / problems + self.within / (problems * samples), 0.0))


def sampling_noise(correct: Sequence[int], samples: int) -> SamplingNoise | None:
    """The two variances from ``correct[i]`` of ``samples`` answers right on problem ``i``
    (unbiased: ``c (k - c) / (k (k - 1))`` estimates p(1 - p); the between-problem variance is the
    per-problem means' variance less ``within / k``, at least 0). None below 2 problems or 2 samples."""
    n, k = len(correct), samples
    if n < 2 or k < 2:
        return None
    within = sum(c * (k - c) for c in correct) / (k * (k - 1) * n)
    rates = [c / k for c in correct]
    mean = sum(rates) / n
    spread = sum((r - mean) ** 2 for r in rates) / (n - 1)
    return SamplingNoise(max(spread - within / k, 0.0), within)

"""Is a difference between two sets of runs real? Tests honest at the 3 to 5 seeds a sweep has,
and the interquartile mean (IQM) with stratified bootstrap intervals (the rliable conventions of
Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice").

- **p-values over seeds** come from randomization tests (``scipy.stats.permutation_test``), never
  from a bootstrap over the seeds alone: paired values get a sign-flip test (under "no difference" each per-seed difference
  is as likely positive as negative), unpaired samples a permutation test (every split of the
  pooled values into the two group sizes). They are **exact** (every arrangement enumerated) while
  the arrangements number at most ``EXACT_LIMIT``, Monte Carlo (``resamples`` random ones) beyond.
  A test cannot produce a p below its ``p_min``: with n pairs the exact sign-flip test's smallest
  two-sided p is 2 / 2^n (0.25 for three seeds), the reason three seeds cannot show significance.
- **Intervals**: a 95% t-interval of the difference always (paired t, or Welch's for unpaired
  samples; quantiles from ``scipy.stats.t``); a percentile bootstrap interval beside it only from
  ``BOOTSTRAP_MIN_N`` values up, where the bootstrap is no longer too narrow.
- **IQM**: the mean of the middle 50% of scores pooled over runs and tasks (``trim_mean(.., 0.25)``,
  rliable's definition); its interval resamples runs with replacement within each task.
- **Seeds x problems** (every run scores the same held-out problems): :func:`crossed_test`, a
  t-test with the crossed random-effects variance of the mean (``S − 1`` degrees of freedom when a
  seed component is estimated; else Welch–Satterthwaite's, and the seed means' t-test too),
  shown beside (after) the exact seed-level test (see its docstring for why crossed and why not a
  bootstrap).
- **Several contrasts**: :func:`holm` adjusts a family's p-values (Holm 1979).

Every function takes plain arrays and returns a frozen result, so per-problem scores (runs x
problems) can use them as they are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import permutation_test, trim_mean
from scipy.stats import t as student_t

from creditlab.analysis.stats import t_quantile

#: Enumerate every arrangement up to this many (2^16 sign patterns, or 9 vs 9 runs: 48,620
#: splits; about a second each on one CPU core); beyond, draw ``resamples`` random ones.
EXACT_LIMIT = 2**16
#: Show a bootstrap interval only from this many values up: below it the percentile bootstrap is
#: too narrow (on average 0.91 of the t-interval's width at n = 20, 0.63 at n = 5, 0.37 at n = 3).
BOOTSTRAP_MIN_N = 20
#: Values are rounded to this many decimals before testing, so that equal accuracies (k/N
#: computed along different float paths) tie exactly.
DECIMALS = 12


@dataclass(frozen=True)
class DiffTest:
    """A test of ``group`` against ``baseline`` (difference of means, group − baseline).

    Attributes:
        diff: Observed difference (paired: the mean of the per-seed differences).
        t_low, t_high: 95% t-interval of the difference (paired t, or Welch's).
        p_value: Two-sided p of the randomization test, null "no difference".
        p_min: The smallest p this test can produce with these data (exact: 2/2^n for n nonzero
            paired differences; Monte Carlo: 2/(B+1)).
        test: The test's name, e.g. ``exact sign-flip``.
        n: Sample sizes as text: ``3 pairs`` or ``3 vs 4``.
        paired: Whether the values were paired.
        exact: Whether every arrangement was enumerated.
        arrangements: Arrangements enumerated (exact) or drawn (Monte Carlo).
        boot_low, boot_high: 95% percentile bootstrap interval, ``None`` below ``BOOTSTRAP_MIN_N``.
    """

    diff: float
    t_low: float
    t_high: float
    p_value: float
    p_min: float
    test: str
    n: str
    paired: bool
    exact: bool
    arrangements: int
    boot_low: float | None = None
    boot_high: float | None = None

    @property
    def description(self) -> str:
        """``exact sign-flip, 3 pairs (8 arrangements; smallest possible p 0.25)``."""
        what = "arrangements" if self.exact else "random arrangements"
        return f"{self.test}, {self.n} ({self.arrangements:,} {what}; smallest possible p {self.p_min:.3g})"


def _values(x: Sequence[float]) -> np.ndarray:
    return np.round(np.asarray(x, dtype=float), DECIMALS)


def t_interval(d: Sequence[float]) -> tuple[float, float]:
    """95% t-interval of the mean of ``d``: ``mean ± t_{0.975, n−1} · s / √n`` (``n >= 2``)."""
    x = np.asarray(d, dtype=float)
    half = t_quantile(len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return float(x.mean()) - half, float(x.mean()) + half


def welch_interval(group: Sequence[float], baseline: Sequence[float]) -> tuple[float, float]:
    """95% Welch t-interval of ``mean(group) − mean(baseline)`` (unequal variances; Welch–
    Satterthwaite degrees of freedom). Both samples constant: a zero-width interval."""
    g, b = np.asarray(group, dtype=float), np.asarray(baseline, dtype=float)
    diff = float(g.mean() - b.mean())
    vg, vb = g.var(ddof=1) / len(g), b.var(ddof=1) / len(b)
    if vg + vb == 0:
        return diff, diff
    df = (vg + vb) ** 2 / (vg**2 / (len(g) - 1) + vb**2 / (len(b) - 1))
    half = t_quantile(df) * math.sqrt(vg + vb)
    return diff - half, diff + half


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def _mean_diff(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def _randomization_p(data: tuple[np.ndarray, ...], paired: bool, exact: bool, resamples: int, seed: int,
                     alternative: str = "two-sided") -> float:
    """p of scipy's permutation test (two-sided: twice the smaller one-sided p), at most 1."""
    res = permutation_test(data, _mean if paired else _mean_diff, vectorized=True,
                           permutation_type="samples" if paired else "independent",
                           n_resamples=np.inf if exact else resamples, alternative=alternative,
                           rng=np.random.default_rng(seed))
    return min(1.0, float(res.pvalue))


def bootstrap_interval(group: Sequence[float], baseline: Sequence[float] | None, resamples: int = 10000,
                       seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of ``mean(group)`` (``baseline`` None: ``group`` holds
    paired differences) or of ``mean(group) − mean(baseline)`` (each resampled on its own)."""
    rng = np.random.default_rng(seed)
    g = np.asarray(group, dtype=float)
    draws = g[rng.integers(0, len(g), size=(resamples, len(g)))].mean(axis=1)
    if baseline is not None:
        b = np.asarray(baseline, dtype=float)
        draws = draws - b[rng.integers(0, len(b), size=(resamples, len(b)))].mean(axis=1)
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(low), float(high)


def paired_test(group: Sequence[float], baseline: Sequence[float], resamples: int = 10000, seed: int = 0) -> DiffTest:
    """Sign-flip test and paired t-interval of ``group[i] − baseline[i]`` (``i``: a shared seed,
    or a shared problem). Zero differences are kept: flipping them changes nothing, so with z
    zeros among n pairs the smallest p is 2/2^(n−z), and all-zero differences give p = 1."""
    if len(group) != len(baseline) or len(group) < 2:
        raise ValueError(f"a paired test needs two samples of one length >= 2, got {len(group)} and {len(baseline)}")
    d = np.round(_values(group) - _values(baseline), DECIMALS)
    exact = 2 ** len(d) <= EXACT_LIMIT
    p = _randomization_p((d,), True, exact, resamples, seed)
    # Only the patterns that make every nonzero difference positive reach the largest mean: 2^z.
    p_min = min(1.0, 2 * 2.0 ** int((d == 0).sum()) / 2 ** len(d)) if exact else min(1.0, 2 / (resamples + 1))
    boot = bootstrap_interval(d, None, resamples, seed) if len(d) >= BOOTSTRAP_MIN_N else (None, None)
    return DiffTest(float(d.mean()), *t_interval(d), p, min(p_min, p), "exact sign-flip" if exact else "Monte Carlo sign-flip",
                    f"{len(d)} pairs", True, exact, 2 ** len(d) if exact else resamples, *boot)


def equivalence_p(d: Sequence[float], margin: float, resamples: int = 10000, seed: int = 0) -> float:
    """p of two one-sided sign-flip tests (TOST) that the paired differences ``d`` (n,) lie within
    ``(-margin, margin)``: the larger of the one-sided p of ``d + margin > 0`` (against a mean
    ``<= -margin``) and of ``d - margin < 0`` (against ``>= margin``). Small p: equivalent. With n
    pairs it cannot go below 1/2^n (every shifted difference of one sign)."""
    x = np.round(_values(d), DECIMALS)
    if len(x) < 2 or not margin > 0:
        raise ValueError(f"an equivalence test needs >= 2 differences and a positive margin, got {len(x)} and {margin!r}")
    exact = 2 ** len(x) <= EXACT_LIMIT
    return max(_randomization_p((np.round(shifted, DECIMALS),), True, exact, resamples, seed, alternative)
               for shifted, alternative in ((x + margin, "greater"), (x - margin, "less")))


def unpaired_test(group: Sequence[float], baseline: Sequence[float], resamples: int = 10000, seed: int = 0) -> DiffTest:
    """Permutation test of the difference of means and Welch t-interval, for samples that share
    no pairing (different seeds). Each sample needs at least two values."""
    g, b = _values(group), _values(baseline)
    if min(len(g), len(b)) < 2:
        raise ValueError(f"an unpaired test needs >= 2 values per sample, got {len(g)} and {len(b)}")
    splits = math.comb(len(g) + len(b), len(g))
    exact = splits <= EXACT_LIMIT
    p = _randomization_p((g, b), False, exact, resamples, seed)
    pooled = np.sort(np.concatenate([g, b]))
    if exact and len(np.unique(pooled)) == len(pooled):  # one split holds the largest sum: 2 / splits
        p_min = min(1.0, 2 / splits)
    elif exact:  # ties: the most extreme splits put the top or the bottom values in the group
        ends = ((pooled[-len(g):], pooled[:-len(g)]), (pooled[:len(g)], pooled[len(g):]))
        p_min = min(_randomization_p(e, False, True, resamples, seed) for e in ends)
    else:
        p_min = min(1.0, 2 / (resamples + 1))
    enough = min(len(g), len(b)) >= BOOTSTRAP_MIN_N
    boot = bootstrap_interval(g, b, resamples, seed) if enough else (None, None)
    return DiffTest(float(g.mean() - b.mean()), *welch_interval(g, b), p, min(p_min, p),
                    "exact permutation" if exact else "Monte Carlo permutation", f"{len(g)} vs {len(b)}",
                    False, exact, splits if exact else resamples, *boot)


def diff_test(group: Sequence[float], baseline: Sequence[float], paired: bool, resamples: int = 10000,
              seed: int = 0) -> DiffTest:
    """:func:`paired_test` or :func:`unpaired_test`."""
    return (paired_test if paired else unpaired_test)(group, baseline, resamples, seed)


@dataclass(frozen=True)
class IQM:
    """Interquartile mean with its 95% stratified bootstrap interval.

    Attributes:
        value: Mean of the middle 50% of the pooled scores (``trim_mean(scores, 0.25)``: with n
            scores, ``floor(n/4)`` are cut from each end, so 3 scores give their plain mean).
        low, high: Percentile interval, ``None`` when the bootstrap would be too narrow (fewer
            than 2 runs per task, or fewer than ``min_n`` scores in all).
        runs, tasks: The score matrix's shape.
    """

    value: float
    low: float | None
    high: float | None
    runs: int
    tasks: int


def iqm(scores: Sequence[float] | np.ndarray) -> float:
    """Interquartile mean of all ``scores`` pooled (any shape)."""
    return float(trim_mean(np.asarray(scores, dtype=float).ravel(), 0.25))


def iqm_interval(scores: Sequence[float] | np.ndarray, resamples: int = 10000, seed: int = 0,
                 min_n: int = BOOTSTRAP_MIN_N) -> IQM:
    """IQM of a (runs,) or (runs, tasks) score matrix and its stratified bootstrap interval: each
    of ``resamples`` draws resamples the runs of every task with replacement, on its own, and
    takes the IQM of the pooled draw; the interval is the 2.5th/97.5th percentile."""
    x = np.asarray(scores, dtype=float)
    x = x[:, None] if x.ndim == 1 else x
    runs, tasks = x.shape
    if runs < 2 or runs * tasks < min_n:
        return IQM(iqm(x), None, None, runs, tasks)
    rng = np.random.default_rng(seed)
    stats, cols = [], np.arange(tasks)
    for start in range(0, resamples, 1000):  # chunks bound the memory at 1000 x runs x tasks
        idx = rng.integers(0, runs, size=(min(1000, resamples - start), runs, tasks))
        stats.append(trim_mean(x[idx, cols].reshape(len(idx), -1), 0.25, axis=1))
    low, high = np.percentile(np.concatenate(stats), [2.5, 97.5])
    return IQM(iqm(x), float(low), float(high), runs, tasks)


@dataclass(frozen=True)
class CrossedTest:
    """A mean paired difference over seeds x problems, tested with the crossed random-effects
    variance of the grand mean (:func:`crossed_test`).

    Attributes:
        diff: Mean of the (seeds, problems) differences.
        low, high: 95% t-interval ``diff ± t_{0.975, df} · se``.
        p_value: Two-sided t-test p of "no difference": ``2 · P(T_df >= |diff| / se)`` (1 when
            ``diff`` and ``se`` are both 0; 0 when only ``se`` is: every cell the same nonzero value).
        se: Standard error of ``diff``, the square root of
            ``var_seed / S + var_problem / P + var_resid / (S P)``; or that of the seed means,
            ``sqrt(MS_seed / (S P))``, when ``var_seed`` was set to 0 and their t-test's p is larger.
        df: Degrees of freedom of ``se²``: ``S − 1`` when a seed component is estimated or the
            seed means' test is the larger p, else Welch–Satterthwaite's (``inf`` when ``se`` is 0).
        var_seed, var_problem, var_resid: The variance components (method of moments, negative
            estimates set to 0).
        seeds, problems: The array's shape ``S, P``.
    """

    diff: float
    low: float
    high: float
    p_value: float
    se: float
    df: float
    var_seed: float
    var_problem: float
    var_resid: float
    seeds: int
    problems: int


def mean_squares(d: Sequence[Sequence[float]] | np.ndarray) -> tuple[float, float, float]:
    """The two-way ANOVA mean squares (one value per cell) of a (seeds S, problems P) array:
    ``MS_seed = P Σ_s (d̄_s· − d̄)² / (S − 1)``, ``MS_problem = S Σ_p (d̄_·p − d̄)² / (P − 1)`` and
    ``MS_resid = Σ_sp (d_sp − d̄_s· − d̄_·p + d̄)² / ((S − 1)(P − 1))``, with ``S, P >= 2``."""
    x = np.asarray(d, dtype=float)
    seeds, problems = x.shape
    grand, rows, cols = x.mean(), x.mean(axis=1), x.mean(axis=0)
    resid = x - rows[:, None] - cols[None, :] + grand
    return (float(problems * ((rows - grand) ** 2).sum() / (seeds - 1)),
            float(seeds * ((cols - grand) ** 2).sum() / (problems - 1)),
            float((resid**2).sum() / ((seeds - 1) * (problems - 1))))


def crossed_test(d: Sequence[Sequence[float]] | np.ndarray, level: float = 0.95) -> CrossedTest:
    """t-test and t-interval of the mean of ``d[s, p]``, a paired difference per seed ``s`` and
    problem ``p`` (method minus baseline on problem p, both trained with seed s), under the crossed
    random-effects model ``d_sp = μ + a_s + b_p + e_sp`` (seeds and problems both drawn from larger
    populations; Searle, Casella & McCulloch 1992, "Variance Components", ch. 4; Owen 2007).

    Why crossed: the mean varies with the seeds (a seed's runs share one training trajectory, so a
    lucky seed lifts every problem at once) and with the problems (a problem is easy or hard for
    every seed). Its variance is ``σ²_seed / S + σ²_problem / P + σ²_resid / (S P)``. The components
    come from the mean squares (:func:`mean_squares`; ``E[MS_seed] = σ²_resid + P σ²_seed``,
    ``E[MS_problem] = σ²_resid + S σ²_problem``, ``E[MS_resid] = σ²_resid``):
    ``σ²_seed = (MS_seed − MS_resid) / P`` and ``σ²_problem = (MS_problem − MS_resid) / S``, each
    set to 0 when negative. The variance of the mean is then a sum ``Σ c_i MS_i / (S P)`` (``c`` =
    (1, 1, −1) with both components positive; (0, 1, 0), (1, 0, 0) or (0, 0, 1) when clipped) and
    its degrees of freedom are ``S − 1`` whenever a seed component is estimated (Hsu's conservative
    choice: the fewest degrees of freedom among the positive terms, exact when the seeds dominate,
    where ``MS_seed`` is a scaled χ²_{S−1}), else Welch–Satterthwaite's (Satterthwaite 1946)
    ``df = (Σ c_i MS_i)² / Σ (c_i MS_i)² / df_i``, ``df_i`` = S − 1, P − 1, (S − 1)(P − 1).
    When the seed component is set to 0, the one-sample t-test of the seed means (variance
    ``MS_seed / (S P)``, ``S − 1`` df) is computed as well and the larger p is the test's, with its
    interval: without it the clipped branch, where df jumps from ``S − 1`` to about ``P − 1``,
    rejected at up to 2x the nominal rate at 0.05/6 and 7x at 0.001 (docs/comparing.md).

    Why not a bootstrap: the crossed bootstrap (the pigeonhole bootstrap of Owen 2007, which this
    replaced) has normal tails and a seed variance shrunk by ``(S − 1)/S``. Simulated with seed
    effects dominant (``sweeps/crossed_coverage.py``, docs/comparing.md), its 95% interval covered
    0.88–0.91 of the time at 5 seeds. Satterthwaite's degrees of freedom everywhere covered
    0.945 there (estimated from the same mean squares, they run slightly liberal); with ``S − 1``
    the interval reaches 0.95, at the price of wider intervals where problems carry much of the
    variance and a seed component is still estimated. Closed form: no resampling, the same answer
    every time.

    Args:
        d: A (seeds, problems) array (or a list of equal-length rows) of differences, ``S, P >= 2``.
        level: Confidence level of the interval.

    Raises:
        ValueError: ``d`` is not two-dimensional with at least two seeds and two problems.
    """
    x = np.round(np.asarray(d, dtype=float), DECIMALS)
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 2:
        raise ValueError(f"crossed_test needs a (seeds, problems) array with both >= 2, got shape {x.shape}")
    seeds, problems = x.shape
    ms = np.array(mean_squares(x))
    dfs = np.array([seeds - 1, problems - 1, (seeds - 1) * (problems - 1)], dtype=float)
    var_seed, var_problem = max(0.0, float(ms[0] - ms[2]) / problems), max(0.0, float(ms[1] - ms[2]) / seeds)
    # var_seed / S + var_problem / P + MS_resid / (S P) as a sum of mean squares over S P
    coef = np.array((1.0, 1.0, -1.0) if var_seed > 0 and var_problem > 0 else (1.0, 0.0, 0.0) if var_seed > 0
                    else (0.0, 1.0, 0.0) if var_problem > 0 else (0.0, 0.0, 1.0))
    terms = coef * ms / (seeds * problems)
    var = float(terms.sum())
    diff = float(x.mean())
    if not var > 0:
        p = 1.0 if diff == 0 else 0.0
        return CrossedTest(diff, diff, diff, p, 0.0, math.inf, var_seed, var_problem, float(ms[2]), seeds, problems)
    # A seed component estimated: S - 1 degrees of freedom (Hsu's conservative choice, the fewest of
    # the positive terms'); Welch-Satterthwaite's, estimated from the same mean squares, ran liberal there.
    df = float(seeds - 1) if var_seed > 0 else var**2 / float((terms[coef != 0] ** 2 / dfs[coef != 0]).sum())
    se = math.sqrt(var)
    p = _t_p(diff, se, df)
    if var_seed == 0:
        # The seed component estimated <= 0 and set to 0: the seeds leave the variance and df jumps
        # from S - 1 to about P - 1, which rejected at up to 2x the nominal rate at alpha / 6 and 7x
        # at 0.001 (the null simulation in docs/comparing.md). The t-test of the seed means (its
        # variance MS_seed / (S P), S - 1 df) must reject too: the larger p, and that test's interval.
        se_seeds = math.sqrt(float(ms[0]) / (seeds * problems))
        p_seeds = _t_p(diff, se_seeds, float(seeds - 1))
        if p_seeds > p:
            se, df, p = se_seeds, float(seeds - 1), p_seeds
    half = t_quantile(df, level) * se
    return CrossedTest(diff, diff - half, diff + half, p, se, df, var_seed, var_problem, float(ms[2]), seeds, problems)


def _t_p(diff: float, se: float, df: float) -> float:
    """Two-sided p of ``diff / se`` under Student's t with ``df`` (0 when ``se`` is 0 and ``diff`` is not)."""
    if se == 0:
        return 1.0 if diff == 0 else 0.0
    return min(1.0, 2 * float(student_t.sf(abs(diff) / se, df)))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``m`` p-values for the family-wise error rate (Holm 1979,
    "A simple sequentially rejective multiple test procedure"): with the p-values sorted,
    ``p_(1) <= ... <= p_(m)``, the adjusted ``p̃_(i) = max_{j <= i} min(1, (m − j + 1) p_(j))``,
    returned in the input order. Rejecting where ``p̃ <= α`` keeps the chance of any false
    rejection in the family at most α, whatever the tests' dependence. Ties keep their order.

    Example: ``holm([0.01, 0.04, 0.03]) == [0.03, 0.06, 0.06]`` (0.01·3; 0.03·2; max(0.04·1, 0.06)).
    """
    p = [float(v) for v in p_values]
    if any(not 0 <= v <= 1 for v in p):
        raise ValueError(f"p-values must lie in [0, 1], got {p}")
    out, running, m = [0.0] * len(p), 0.0, len(p)
    for rank, i in enumerate(sorted(range(m), key=lambda k: p[k])):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out

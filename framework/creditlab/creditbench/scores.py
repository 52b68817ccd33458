"""Scores of estimated credit against the Monte-Carlo truth, and bootstrap intervals over prompts.

Every score is computed from per-chain arrays: ``truth[c]`` (n_c,) true step advantages A_k of chain
c and ``credit[c]`` (n_c,) an estimator's per-thought credit (its per-token advantages summed or
averaged over the thought's trained tokens). "The true most-negative step" of a chain is the
earliest k with the smallest A_k.

Intervals resample *prompts* with replacement (a prompt's G chains share V(s_0) and the policy's
difficulty on it, so they are not independent): each replicate weights every chain by how often
its prompt was drawn. Pairwise differences use the same draws for both sides (paired bootstrap).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.stats import rankdata

from creditlab.creditbench.result import Interval

Arrays = Sequence[np.ndarray]


def _spearman(x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> float:
    """Spearman correlation of ``x`` and ``y`` (ties: mid-ranks), with integer repeat weights
    ``w``; 0 when either side is constant (no ranking information)."""
    if w is not None:
        w = np.asarray(w, dtype=np.int64)
        x, y = np.repeat(x, w), np.repeat(y, w)
    if len(x) < 2:
        return 0.0
    rx, ry = rankdata(x), rankdata(y)
    sx, sy = rx.std(), ry.std()
    if sx == 0 or sy == 0:
        return 0.0
    return float(((rx - rx.mean()) * (ry - ry.mean())).mean() / (sx * sy))


def most_negative(values: np.ndarray) -> int:
    """The earliest index of the smallest value."""
    return int(np.argmin(values))


# -- per-chain statistics (computed once; a bootstrap replicate only reweights them) ----------------

def within_chain(truth: Arrays, credit: Arrays) -> np.ndarray:
    """(C,) Spearman correlation inside each chain; NaN where it is undefined for the truth (fewer
    than 2 thoughts, or constant A_k), 0 where the credit is constant (it ranks nothing)."""
    out = np.full(len(truth), np.nan)
    for c, (t, e) in enumerate(zip(truth, credit)):
        if len(t) >= 2 and np.ptp(t) > 0:
            out[c] = _spearman(t, e)
    return out


def blame_hits(truth: Arrays, credit: Arrays, failed: np.ndarray) -> np.ndarray:
    """(C,) on failed chains: 1 when the thought with the lowest credit is the true most-negative
    step, a fraction 1/m when m thoughts tie for the lowest credit and it is one of them (the
    expected hit of breaking the tie at random), else 0; NaN on chains that did not fail."""
    out = np.full(len(truth), np.nan)
    for c, (t, e) in enumerate(zip(truth, credit)):
        if failed[c] and len(t):
            lowest = np.flatnonzero(e == e.min())
            out[c] = float(most_negative(t) in lowest) / len(lowest)
    return out


def sign_counts(truth: Arrays, credit: Arrays, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(C,) steps with |A_k| > threshold, and (C,) those among them whose credit has A_k's sign
    (zero credit disagrees)."""
    big = np.array([float((np.abs(t) > threshold).sum()) for t in truth])
    agree = np.array([float(((np.abs(t) > threshold) & (np.sign(e) == np.sign(t))).sum())
                      for t, e in zip(truth, credit)])
    return big, agree


def moments(truth: Arrays, credit: Arrays) -> np.ndarray:
    """(C, 3) per chain: sum of credit², credit·truth and truth² (the least-squares scale match)."""
    return np.array([[float(e @ e), float(e @ t), float(t @ t)] for t, e in zip(truth, credit)]).reshape(-1, 3)


def scaled_error(m: np.ndarray) -> float:
    """Squared error of the truth against ``s * credit`` with the least-squares scale ``s``, over
    the truth's sum of squares, from summed :func:`moments` (3,): 0 = perfect up to scale, 1 = no
    better than zero credit."""
    xx, xy, yy = m
    if yy <= 0:
        return float("nan")
    if xx <= 0:
        return 1.0
    return float((yy - xy * xy / xx) / yy)


def settle(credit: Arrays, digits: int = 6) -> list[np.ndarray]:
    """Credit rounded to ``digits`` decimals of its largest magnitude, so that values equal up to
    float rounding (a sequence-level advantage averaged over thoughts of different lengths) tie
    in ranks, signs and arg-mins instead of being ordered by rounding noise."""
    scale = max((float(np.abs(c).max()) for c in credit if len(c)), default=0.0)
    if scale == 0:
        return [np.asarray(c, dtype=float) for c in credit]
    return [np.round(np.asarray(c, dtype=float) / scale, digits) * scale for c in credit]


def weighted_mean(values: np.ndarray, w: np.ndarray) -> float:
    """Mean of ``values`` (C,) with chain weights ``w`` (C,), NaN entries left out (NaN if none is left)."""
    ok = ~np.isnan(values) & (w > 0)
    return float(np.average(values[ok], weights=w[ok])) if ok.any() else float("nan")


# -- one estimator's scores ---------------------------------------------------------------------------

class CreditScorer:
    """All estimator scores of one reduction for every bootstrap replicate.

    Args:
        truth: Per chain, (n_c,) true step advantages.
        credit: Per chain, (n_c,) the estimator's per-thought credit.
        failed: (C,) bool, chains that failed.
        threshold: |A_k| above which a step's sign is scored.
    """

    def __init__(self, truth: Arrays, credit: Arrays, failed: np.ndarray, threshold: float) -> None:
        credit = settle(credit)
        self.sizes = np.array([len(t) for t in truth])
        self.flat_truth = np.concatenate(truth) if len(truth) else np.zeros(0)
        self.flat_credit = np.concatenate(credit) if len(credit) else np.zeros(0)
        self.within = within_chain(truth, credit)
        self.blame = blame_hits(truth, credit, failed)
        self.big, self.agree = sign_counts(truth, credit, threshold)
        self.moments = moments(truth, credit)

    def __call__(self, w: np.ndarray) -> dict[str, float]:
        """The scores with chain weights ``w`` (C,) (all ones: the sample itself)."""
        big = float(w @ self.big)
        return {
            "spearman": _spearman(self.flat_truth, self.flat_credit, np.repeat(w, self.sizes)),
            "spearman_within": weighted_mean(self.within, w),
            "sign": float(w @ self.agree) / big if big > 0 else float("nan"),
            "blame_hit": weighted_mean(self.blame, w),
            "error": scaled_error(w @ self.moments),
        }


def selector_scores(truth: Arrays, picks: Sequence[int], oracle: Sequence[int | None],
                    weights: np.ndarray) -> dict[str, Interval]:
    """:func:`selector_outcomes` as shares of the failed chains, each with its bootstrap interval
    (``weights`` (R, C): the chains' prompt weights; keys all NaN left out), plus
    ``first_thought``: the share of resets at thought 0, where a selector lands when it falls
    back (a reset there is exact whenever the truth's worst step is the first)."""
    outcomes = selector_outcomes(truth, picks, oracle)
    outcomes["first_thought"] = (np.asarray(picks) == 0).astype(float)
    out = {}
    for key, values in outcomes.items():
        if np.isnan(values).all():
            continue
        draws = np.array([weighted_mean(values, w) for w in weights])
        out[key] = interval(draws[0], draws[1:])
    return out


def selector_outcomes(truth: Arrays, picks: Sequence[int], oracle: Sequence[int | None]) -> dict[str, np.ndarray]:
    """(C,) per failed chain: a reset at (``exact``), before (``early``) or after (``late``) the
    true most-negative step, and at the oracle's first wrong step (``oracle_exact``; NaN where
    the oracle does not know)."""
    m = np.array([most_negative(t) for t in truth])
    p = np.asarray(picks)
    return {
        "exact": (p == m).astype(float),
        "early": (p < m).astype(float),
        "late": (p > m).astype(float),
        "oracle_exact": np.array([np.nan if o is None else float(q == o) for q, o in zip(p, oracle)]),
    }


# -- bootstrap over prompts --------------------------------------------------------------------------

def prompt_weights(prompt_of_chain: np.ndarray, prompts: int, replicates: int, seed: int) -> np.ndarray:
    """(R, C) chain weights: replicate r draws ``prompts`` prompts with replacement and weights each
    chain by its prompt's count. Row 0 is the sample itself (all ones)."""
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(prompts, np.full(prompts, 1.0 / prompts), size=replicates)
    return np.vstack([np.ones(len(prompt_of_chain)), counts[:, prompt_of_chain]])


def intervals(stat: Callable[[np.ndarray], dict[str, float]], weights: np.ndarray) -> tuple[dict[str, Interval], dict[str, np.ndarray]]:
    """Each statistic at row 0 of ``weights`` with its 95% percentile interval over the other rows;
    also the replicate values (for paired differences). NaN replicates are left out."""
    rows = [stat(w) for w in weights]
    out, draws = {}, {}
    for key in rows[0]:
        values = np.array([r[key] for r in rows])
        draws[key] = values[1:]
        out[key] = interval(values[0], values[1:])
    return out, draws


def interval(value: float, draws: np.ndarray) -> Interval:
    """``value`` with the 2.5% and 97.5% quantiles of the finite ``draws`` (NaN when none are)."""
    ok = draws[np.isfinite(draws)]
    if not len(ok):
        return Interval(float(value), float("nan"), float("nan"))
    low, high = np.quantile(ok, [0.025, 0.975])
    return Interval(float(value), float(low), float(high))

"""One ``creditlab compare`` group's numbers over its used runs (one run per seed): final accuracy
and AUC with t-intervals and IQMs, tokens to a threshold, step time and credit metrics
(:mod:`creditlab.analysis.stats`, :mod:`creditlab.analysis.significance`)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from creditlab.analysis import significance, stats
from creditlab.analysis.rundirs import Run

CREDIT_PREFIX = "train/credit/"
STEP_TIME = "time/step_s"
TESTED = {"final": "final accuracy", "auc": "AUC"}


@dataclass
class GroupStats:
    """One group's numbers over its used runs (one run per seed).

    Attributes:
        label: Group label (config value(s) of the ``--by`` keys).
        runs: Every run of the group, used or not.
        values: Per used run, ``(seed, value)`` for ``final`` and ``auc``.
        final: Final accuracy, mean and 95% t-interval.
        final_steps: The RL step of each used run's last evaluation.
        auc: Normalised area under the evaluation curve, mean and 95% t-interval.
        iqm: ``final`` and ``auc``: interquartile mean over seeds with its stratified bootstrap
            interval (no interval below ``significance.BOOTSTRAP_MIN_N`` seeds).
        to_threshold: Per token axis, (median tokens to threshold or None, seeds reaching it).
        step_time: Median seconds per RL step, pooled over the used runs' steps.
        credit: ``train/credit/*`` key -> mean over seeds of each run's average.
    """

    label: str
    runs: list[Run]
    values: dict[str, list[tuple[Any, float]]] = field(default_factory=dict)
    final: stats.MeanCI = stats.MeanCI(math.nan, math.nan, 0)
    final_steps: list[int] = field(default_factory=list)
    auc: stats.MeanCI = stats.MeanCI(math.nan, math.nan, 0)
    iqm: dict[str, significance.IQM] = field(default_factory=dict)
    to_threshold: dict[str, tuple[float | None, int]] = field(default_factory=dict)
    step_time: float | None = None
    credit: dict[str, stats.MeanCI] = field(default_factory=dict)

    @property
    def used(self) -> list[Run]:
        return [r for r in self.runs if r.used]



def _credit(runs: list[Run]) -> dict[str, stats.MeanCI]:
    keys = sorted({k for r in runs for row in r.rows for k in row if k.startswith(CREDIT_PREFIX)})
    out = {}
    for key in keys:
        per_run = []
        for run in runs:
            vals = [v for row in run.rows if isinstance(v := row.get(key), (int, float)) and math.isfinite(v)]
            if vals:
                per_run.append(statistics.fmean(vals))
        out[key[len(CREDIT_PREFIX):]] = stats.mean_ci(per_run)
    return out


def group_stats(label: str, runs: list[Run], metric: str, resamples: int = 10000, seed: int = 0) -> GroupStats:
    """Final accuracy, AUC (mean and IQM), step time and credit metrics of one group (threshold
    comes later). The seeds are the runs of one task: the IQM's bootstrap resamples them."""
    g = GroupStats(label, runs)
    finals, aucs = [], []
    for run in g.used:
        xs, ys = run.curve(metric)
        finals.append((run.seed, ys[-1]))
        aucs.append((run.seed, stats.normalized_auc(xs, ys)))
        g.final_steps.append(int(xs[-1]))
    g.values = {"final": finals, "auc": aucs}
    g.final = stats.mean_ci([v for _, v in finals])
    g.auc = stats.mean_ci([v for _, v in aucs])
    g.iqm = {q: significance.iqm_interval([v for _, v in g.values[q]], resamples, seed)
             for q in TESTED if g.values[q]}
    times = [row[STEP_TIME] for r in g.used for row in r.rows if isinstance(row.get(STEP_TIME), (int, float))]
    g.step_time = statistics.median(times) if times else None
    g.credit = _credit(g.used)
    return g


def tokens_to_threshold(g: GroupStats, metric: str, threshold: float) -> None:
    """Per token axis: the median over seeds (a seed never reaching counts as infinite) of the
    tokens at the first evaluation with ``metric >= threshold``, and how many seeds reached it."""
    for axis in ("tokens/trained", "tokens/generated"):
        hits = [stats.first_crossing(*r.curve(metric, axis), threshold) for r in g.used]
        g.to_threshold[axis] = (stats.median_with_misses(hits), sum(h is not None for h in hits))

"""A run's headline gain: a statistic with less noise than the gain it reports (issue 38).

One evaluation of 500 held-out problems wobbles by about ±0.02 between neighbouring evaluations,
so "last evaluation minus step 0" reports that noise with the gain. The headline averages the
last ``last`` evaluations instead, and reads **sampled accuracy** (``eval.samples`` answers per
problem at the rollout temperature: what RL optimizes, and 4 x the draws of greedy pass@1) where
the run recorded it, greedy pass@1 otherwise. Its interval is over problems: for every held-out
problem ``p``, ``d_p`` = its mean outcome over the last evaluations minus its outcome at step 0
(:mod:`creditlab.analysis.problem_records`), and the 95% t-interval of ``mean(d)`` over the P problems
covers which problems were drawn and the evaluation's own sampling. It does not cover another RL
seed or another machine: those are stand-ins of their own (``sweeps/demo_check.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from creditlab.analysis.problem_records import outcomes
from creditlab.analysis.stats import t_quantile

#: Evaluations averaged at the end of a run.
LAST = 5


@dataclass(frozen=True)
class Headline:
    """The mean of the last evaluations minus step 0, per problem.

    Attributes:
        metric: ``eval/sample_accuracy`` or ``eval/pass@1``.
        start: The metric at step 0.
        end: Its mean over the last evaluations.
        gain: ``end - start``.
        low, high: 95% t-interval of the gain over problems.
        steps: The evaluations averaged.
        problems: P.
    """

    metric: str
    start: float
    end: float
    gain: float
    low: float
    high: float
    steps: tuple[int, ...]
    problems: int

    def describe(self) -> str:
        """One line: ``held-out sampled accuracy, mean of steps 160-200 - step 0: +0.061 [...]``."""
        what = "sampled accuracy" if self.metric == "eval/sample_accuracy" else "greedy pass@1"
        steps = f"steps {self.steps[0]}-{self.steps[-1]}" if len(self.steps) > 1 else f"step {self.steps[0]}"
        return (f"held-out {what}, mean of {steps} ({len(self.steps)} evaluations) - step 0: "
                f"{self.start:.3f} -> {self.end:.3f}, gain {self.gain:+.3f} "
                f"[{self.low:+.3f}, {self.high:+.3f}] (95% t-interval over {self.problems} problems)")

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "start": self.start, "end": self.end, "gain": self.gain,
                "ci95": [self.low, self.high], "steps": list(self.steps), "problems": self.problems}


def headline(records: dict[int, dict[str, Any]], metric: str | None = None, last: int = LAST) -> Headline | None:
    """The headline of a run's per-problem records (``step -> record``, from
    :func:`creditlab.analysis.problem_records.read_records`), or ``None`` without a step-0 record and a later one.

    Args:
        records: The run's evaluations.
        metric: ``eval/sample_accuracy`` or ``eval/pass@1``; default: sampled accuracy where the
            records hold samples, else greedy pass@1.
        last: Evaluations after step 0 to average (fewer when the run has fewer).
    """
    if 0 not in records or len(records) < 2:
        return None
    if metric is None:
        metric = "eval/sample_accuracy" if outcomes(records[0], "eval/sample_accuracy") else "eval/pass@1"
    steps = sorted(s for s in records if s > 0)[-last:]
    first = outcomes(records[0], metric)
    later = [outcomes(records[s], metric) for s in steps]
    if first is None or any(x is None for x in later):
        return None
    ids = sorted(set(first).intersection(*later))
    start = np.array([first[i] for i in ids])
    end = np.array([[x[i] for i in ids] for x in later]).mean(axis=0)  # (P,)
    d = end - start
    half = t_quantile(len(d) - 1) * float(d.std(ddof=1)) / math.sqrt(len(d)) if len(d) > 1 else math.nan
    gain = float(d.mean())
    return Headline(metric, float(start.mean()), float(end.mean()), gain, gain - half, gain + half,
                    tuple(steps), len(ids))

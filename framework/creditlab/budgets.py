"""Two runs at *exactly* equal budgets: a run read between its evaluations.

Methods spend a budget counter (``tokens/trained``, ``tokens/generated``, ``time/train_s``: running
totals a run logs every step) at different rates, so two runs' evaluations fall at different
totals. The budget ``B`` of a pair is the smaller of the two runs' totals at their last
evaluations; each run is read at ``B``: at an evaluation whose total is ``B``, else linearly
between its two evaluations around ``B`` (totals ``t_lo <= B < t_hi``, weight
``w = (B − t_lo) / (t_hi − t_lo)`` on the later one), never extrapolated. The same weights
interpolate a metric (:func:`metric_at_budget`) and every problem's outcome
(:func:`outcomes_at_budget`: sampled accuracy ``correct / samples``, greedy 0/1 read as a
probability), so the mean of the interpolated outcomes is the interpolated metric.

``creditlab compare``'s pre-registered section compares at budgets this way; ``--at-equal``
instead takes each run's last evaluation *within* the smaller total (:mod:`creditlab.problem_records`),
which can hand the cheaper run up to one evaluation interval of extra budget.
``sweeps/equal_tokens.py`` uses these functions too.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

from creditlab.problem_records import outcomes
from creditlab.rundirs import CompareError, Run

V = TypeVar("V", float, dict)


def totals(rows: list[dict[str, Any]], key: str) -> dict[int, float]:
    """``step -> key``: a cumulative counter's value after each logged step's update (the last
    value logged at that step; 0 at step 0) from a run's ``metrics.jsonl`` rows."""
    out = {0: 0.0}
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[int(row["step"])] = float(value)
    return out


def bracket(spent: dict[int, float], budget: float) -> tuple[int, int | None, float]:
    """The evaluations around ``budget``: ``(low, high, w)`` with ``spent[low] <= budget <
    spent[high]`` and ``w`` the weight of ``high``; ``(low, None, 0.0)`` when no evaluation spent
    more (the run is read at its last one). ``spent``: evaluation step -> total at it.

    Raises:
        CompareError: No evaluation within the budget.
    """
    low = max((s for s in spent if spent[s] <= budget), default=None, key=lambda s: (spent[s], s))
    if low is None:
        raise CompareError(f"no evaluation within the budget {budget:g}")
    high = min((s for s in spent if spent[s] > budget), default=None, key=lambda s: (spent[s], s))
    if high is None:
        return low, None, 0.0
    return low, high, (budget - spent[low]) / (spent[high] - spent[low])


def at_budget(values: dict[int, V], spent: dict[int, float], budget: float) -> V:
    """``values`` (step -> a number, or an id -> number mapping) read at ``budget``: linear between
    the steps around it (:func:`bracket`); only steps in both ``values`` and ``spent`` count."""
    low, high, w = bracket({s: spent[s] for s in values if s in spent}, budget)
    a = values[low]
    if high is None:
        return a
    b = values[high]
    if isinstance(a, dict):
        return {i: (1 - w) * a[i] + w * b[i] for i in a if i in b}
    return (1 - w) * a + w * b


def outcomes_at_budget(records: dict[int, dict[str, Any]], spent: dict[int, float], budget: float,
                       metric: str) -> dict[str, float]:
    """Per-problem outcomes (``problem id -> outcome``, :func:`creditlab.problem_records.outcomes`)
    of ``records`` (step -> ``eval_problems.jsonl`` record) at ``budget``.

    Raises:
        CompareError: No evaluation within the budget, or a record without ``metric``'s outcome.
    """
    got = {}
    for step, record in records.items():
        out = outcomes(record, metric)
        if out is None:
            raise CompareError(f"the record of step {step} has no per-problem outcome for {metric}")
        got[step] = out
    return at_budget(got, spent, budget)


def metric_values(run: Run, metric: str) -> dict[int, float]:
    """``step -> metric`` at each evaluation of ``run`` (the last row of a step)."""
    return {int(row["step"]): float(row[metric]) for row in run.rows
            if isinstance(row.get(metric), (int, float)) and math.isfinite(row[metric])}


def pair_budget(a: Run, b: Run, metric: str, key: str) -> float:
    """The budget two runs are compared at: the smaller of their ``key`` totals at their last
    evaluations of ``metric``.

    Raises:
        CompareError: A run has no evaluation of ``metric`` or never logs ``key``.
    """
    ends = []
    for run in (a, b):
        spent, evals = totals(run.rows, key), metric_values(run, metric)
        last = max(evals, default=None)
        if last is None or last not in spent:
            raise CompareError(f"run {run.name} has no {key} total at its last evaluation of {metric} "
                               f"(does it log {key}?)")
        ends.append(spent[last])
    return min(ends)


def metric_at_budget(run: Run, metric: str, key: str, budget: float) -> float:
    """``run``'s ``metric`` at ``key = budget``, interpolated between its evaluations."""
    return at_budget(metric_values(run, metric), totals(run.rows, key), budget)

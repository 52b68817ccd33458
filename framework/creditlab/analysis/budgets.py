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

:func:`read_pair` reads a pair of runs so (or each at its last evaluation, without a budget key)
and :func:`read_outcomes` their per-problem outcomes at the same place; :func:`paired_problem_test`
tests a group against the baseline over seeds x problems read that way. ``creditlab compare`` uses
them for ``--at-equal KEY`` (the per-problem test and the seed-level row) and for the
pre-registered section's budget axes (:mod:`creditlab.analysis.confirmatory`), so both read a pair alike;
``sweeps/equal_tokens.py`` uses these functions too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from creditlab.analysis.problem_records import MIN_SEEDS_FOR_P, OUTCOMES, PROBLEMS_FILE, ProblemTest, outcomes
from creditlab.analysis.rundirs import CompareError, Run
from creditlab.analysis.significance import crossed_test

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
    """Per-problem outcomes (``problem id -> outcome``, :func:`creditlab.analysis.problem_records.outcomes`)
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


@dataclass(frozen=True)
class PairRead:
    """A group's run and the baseline's run of one seed, read at the same place.

    Attributes:
        key: The budget counter; None: each run at its last evaluation.
        budget: The budget both are read at (:func:`pair_budget`; nan without ``key``).
        value: The run's metric there; ``base_value`` the baseline run's.
        steps: The evaluation steps the run is read from: one (its last evaluation, or one whose
            total is the budget) or the two around the budget; ``base_steps`` the baseline run's.
        step: Where the run is read, in steps: between ``steps`` with the weight of the budget
            (``93.3``: a third of the way from step 90 to 100); ``base_step`` the baseline run's.
    """

    key: str | None
    budget: float
    value: float
    base_value: float
    steps: tuple[int, ...]
    base_steps: tuple[int, ...]
    step: float
    base_step: float


def _read_from(run: Run, metric: str, key: str, budget: float) -> tuple[tuple[int, ...], float]:
    """The evaluation steps ``run`` is read from at ``budget`` (as :func:`metric_at_budget`) and
    the position between them."""
    spent = totals(run.rows, key)
    low, high, w = bracket({s: spent[s] for s in metric_values(run, metric) if s in spent}, budget)
    return ((low,), low) if high is None or w == 0 else ((low, high), low + w * (high - low))


def read_pair(run: Run, base: Run, metric: str, key: str | None) -> PairRead:
    """``run`` and ``base`` at exactly equal ``key`` (:func:`pair_budget`, interpolated between
    evaluations), or each at its last evaluation when ``key`` is None.

    Raises:
        CompareError: A run has no evaluation of ``metric``, or no ``key`` total at its last one.
    """
    if key is None:
        a, b = metric_values(run, metric), metric_values(base, metric)
        if not a or not b:
            raise CompareError(f"run {(base if a else run).name} has no evaluation of {metric}")
        return PairRead(None, math.nan, a[max(a)], b[max(b)], (max(a),), (max(b),), max(a), max(b))
    at = pair_budget(run, base, metric, key)
    (steps, step), (base_steps, base_step) = (_read_from(r, metric, key, at) for r in (run, base))
    return PairRead(key, at, metric_at_budget(run, metric, key, at), metric_at_budget(base, metric, key, at),
                    steps, base_steps, step, base_step)


def read_outcomes(run: Run, records: dict[int, dict[str, Any]], metric: str, pair: PairRead,
                  baseline: bool = False) -> dict[str, float]:
    """The per-problem outcomes of ``run`` (``records``: its ``eval_problems.jsonl``) where
    ``pair`` reads it (the baseline's side with ``baseline``): the record of its evaluation, or
    :func:`outcomes_at_budget` between the records of the two evaluations around the budget.

    Raises:
        CompareError: ``run <name> has ...``: why a needed record or outcome is missing.
    """
    steps = pair.base_steps if baseline else pair.steps
    for step in steps:
        record = records.get(step)
        if record is None or outcomes(record, metric) is None:
            why = (f"no {PROBLEMS_FILE} (runs older than per-problem records have none)" if not records
                   else f"no {PROBLEMS_FILE} line for step {step}" if record is None
                   else f"no samples recorded at step {step} (eval.samples=0)")
            raise CompareError(f"run {run.name} has {why}")
    if pair.key is None:
        return outcomes(records[steps[0]], metric)
    return outcomes_at_budget({s: records[s] for s in steps}, totals(run.rows, pair.key), pair.budget, metric)


def _span(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if lo == hi else f"{lo:{fmt}}–{hi:{fmt}}"


def describe(reads: list[PairRead]) -> str:
    """Where the pairs are compared: ``last evaluation (steps 60–80; baseline 80)``, or
    ``exactly equal tokens/trained = 48210–51300 (interpolated between evaluations)``."""
    if not reads:
        return "—"
    if reads[0].key is not None:
        budgets = _span([r.budget for r in reads], ".6g")
        return f"exactly equal {reads[0].key} = {budgets} (interpolated between evaluations)"
    g, b = _span([r.step for r in reads], "d"), _span([r.base_step for r in reads], "d")
    return f"last evaluation ({f'step {g}' if g == b else f'steps {g}; baseline {b}'})"


def paired_problem_test(
    label: str, runs: dict[Any, Run], base_runs: dict[Any, Run], metric: str, key: str | None,
    records: dict[Path, dict[int, dict[str, Any]]],
) -> ProblemTest:
    """Test a group against the baseline problem by problem.

    For every seed ``s`` both have (``runs`` and ``base_runs`` map the paired seeds to their run)
    and every problem ``p`` recorded by all of these runs: ``d[s, p]`` = outcome of the group's run
    minus the baseline run's, both read by :func:`read_pair` (at exactly equal ``key``, or at
    their last evaluations); then :func:`~creditlab.analysis.significance.crossed_test` of ``d``.

    Args:
        records: ``run path -> read_records(run path)`` (read once per run).

    Raises:
        CompareError: As :func:`read_pair`.
    """
    seeds = sorted(runs, key=str)
    reads = [read_pair(runs[s], base_runs[s], metric, key) for s in seeds]
    steps = [(s, r.step, r.base_step, r.budget) for s, r in zip(seeds, reads)]
    at = describe(reads)
    if metric not in OUTCOMES:
        return ProblemTest(label, at, None, f"no per-problem test: {metric} has no per-problem outcome "
                           f"(these have: {', '.join(OUTCOMES)})", steps)
    try:
        pairs = [[read_outcomes(run, records.get(run.path, {}), metric, r, side)
                  for run, side in ((runs[s], False), (base_runs[s], True))] for s, r in zip(seeds, reads)]
    except CompareError as exc:
        return ProblemTest(label, at, None, f"no per-problem test: {exc}", steps)
    shared = set.intersection(*(set(o) for pair in pairs for o in pair))
    ids = [i for i in pairs[0][0] if i in shared]  # the test rows' order
    if len(ids) < 2:
        return ProblemTest(label, at, None, f"no per-problem test: the runs share {len(ids)} problem id(s), "
                           "the test needs 2", steps)
    result = crossed_test([[g[i] - b[i] for i in ids] for g, b in pairs])
    total = max(len(o) for pair in pairs for o in pair)
    note = (f"paired on seeds {', '.join(map(str, seeds))} x {len(ids)} problems; outcome {OUTCOMES[metric]}"
            + (f"; {total - len(ids)} problem(s) not scored by every run left out" if len(ids) < total else ""))
    if len(seeds) < MIN_SEEDS_FOR_P:
        note += (f"; {len(seeds)} seeds: no p (below {MIN_SEEDS_FOR_P} seeds the crossed t-test covers under 95%); "
                 "the interval is descriptive, the seed-level test is the test")
    return ProblemTest(label, at, result, note, steps)

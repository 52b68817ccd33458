"""Per-problem evaluation records (``eval_problems.jsonl``) and the budget a comparison is made at.

Every run of a sweep scores the same held-out problems (the first ``eval.problems`` test rows,
whatever the seed), so two runs can be compared problem by problem, not only by their means. Each
evaluation of a run appends one line to ``<run_dir>/eval_problems.jsonl`` (rank 0 writes it, one
line per evaluation, flushed as written; a resume drops the lines after its checkpoint's step, as
for ``metrics.jsonl``)::

    {"step": 20, "samples": 4, "ids": ["test-0", ...], "greedy": [1, 0, ...], "correct": [3, 0, ...]}

``ids`` are in the order of the test rows; ``greedy`` is 1 where the greedy answer was right;
``correct`` counts the right answers among ``samples`` samples (an empty list when
``eval.samples`` is 0). ``creditlab compare`` reads them (:mod:`creditlab.analysis.compare`) to test a
method against the baseline over seeds x problems (:func:`creditlab.analysis.significance.crossed_test`).

``--at-equal KEY`` compares two runs at exactly the same budget of a cumulative counter
(:data:`CUMULATIVE`, checked by :func:`check_budget_key`) instead of at their last evaluations,
read between evaluations: :mod:`creditlab.analysis.budgets`, whose
:func:`~creditlab.analysis.budgets.paired_problem_test` builds the seeds x problems differences and tests
them (:class:`ProblemTest`). :func:`matched_steps` is the older rule ``sweeps/plot_horizon.py``
still uses: each run's last evaluation *within* the smaller budget.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditlab.analysis.rundirs import AXES, CompareError, Run
from creditlab.analysis.significance import CrossedTest
from creditlab.errors import closest

PROBLEMS_FILE = "eval_problems.jsonl"
#: Counters a run logs as running totals (``--at-equal`` may name them): every x-axis but the step.
CUMULATIVE = tuple(k for k in AXES if k != "step")
#: Fewest paired seeds for which the per-problem test's p is reported: below it the crossed t-test's
#: 95% interval covers 0.93-0.94 of the time when seed effects dominate (docs/comparing.md, the
#: simulation of ``sweeps/crossed_coverage.py``), from 5 seeds 0.945-0.95.
MIN_SEEDS_FOR_P = 5
#: Metrics with a per-problem outcome: how a record gives it.
OUTCOMES = {"eval/pass@1": "greedy (0/1)", "eval/sample_accuracy": "correct / samples"}


def read_records(run_dir: str | Path) -> dict[int, dict[str, Any]]:
    """``step -> record`` of a run's ``eval_problems.jsonl`` (empty when it has none). Lines that
    do not parse or lack a field (cut off by a kill) are skipped; a step logged twice keeps the last."""
    path = Path(run_dir) / PROBLEMS_FILE
    out: dict[int, dict[str, Any]] = {}
    if not path.is_file():
        return out
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
            if len(rec["ids"]) == len(rec["greedy"]) and len(rec["correct"]) in (0, len(rec["ids"])):
                out[int(rec["step"])] = rec
        except (ValueError, KeyError, TypeError):
            continue
    return out


def outcomes(record: dict[str, Any], metric: str) -> dict[str, float] | None:
    """``problem id -> outcome`` of one record for ``metric`` (see :data:`OUTCOMES`); None when the
    record cannot give it (no samples recorded for ``eval/sample_accuracy``, another metric)."""
    if metric == "eval/pass@1":
        return {str(i): float(g) for i, g in zip(record["ids"], record["greedy"])}
    if metric == "eval/sample_accuracy" and record["correct"] and record.get("samples"):
        return {str(i): c / record["samples"] for i, c in zip(record["ids"], record["correct"])}
    return None


def check_budget_key(runs: list[Run], key: str) -> None:
    """Raise unless ``key`` is a cumulative counter some run logs.

    Raises:
        CompareError: One line naming the key and the cumulative keys there are.
    """
    logged = {k for r in runs for row in r.rows for k in row}
    hint = closest(key, list(CUMULATIVE))
    if key not in CUMULATIVE:
        raise CompareError(f"--at-equal {key}: not a cumulative counter." + (f" Did you mean '{hint}'?" if hint else "")
                           + f" Cumulative keys: {', '.join(CUMULATIVE)}.")
    if key not in logged:
        raise CompareError(f"--at-equal {key}: no run logs it. Cumulative keys logged: "
                           f"{', '.join(k for k in CUMULATIVE if k in logged) or 'none'}.")


def evaluations(run: Run, metric: str, key: str | None = None) -> list[tuple[int, float]]:
    """``(step, cumulative key at that step)`` of each evaluation of ``metric`` (the key's latest
    value at or before the evaluation's row; 0 at step 0; nan without a key or a value)."""
    out, last = [], {}
    for row in run.rows:
        last.update({k: v for k, v in row.items() if isinstance(v, (int, float))})
        value = row.get(metric)
        if isinstance(value, (int, float)) and math.isfinite(value):
            at = math.nan if key is None else (0.0 if row["step"] == 0 else float(last.get(key, math.nan)))
            out.append((int(row["step"]), at))
    return out


def final_total(run: Run, key: str) -> float:
    """The last value ``key`` took in ``run`` (nan when never logged)."""
    values = [row[key] for row in run.rows if isinstance(row.get(key), (int, float))]
    return float(values[-1]) if values else math.nan


def matched_steps(a: Run, b: Run, metric: str, key: str | None) -> tuple[int, int, float]:
    """The evaluation steps at which runs ``a`` and ``b`` are compared, and the budget
    (``sweeps/plot_horizon.py``'s rule; ``creditlab compare`` reads a pair at exactly equal budgets
    instead, :func:`creditlab.analysis.budgets.read_pair`).

    Without ``key``: each run's last evaluation (budget nan). With ``key`` (a cumulative counter):
    the budget B is the smaller of the two runs' final totals, and each run is compared at its
    last evaluation whose total is <= B (for the run with the smaller total, its last evaluation),
    which can hand the cheaper run up to one evaluation interval of extra budget.

    Raises:
        CompareError: A run has no evaluation within the budget or never logs ``key``.
    """
    if key is None:
        return evaluations(a, metric)[-1][0], evaluations(b, metric)[-1][0], math.nan
    budget = min(final_total(a, key), final_total(b, key))
    steps = []
    for run in (a, b):
        within = [s for s, total in evaluations(run, metric, key) if total <= budget]
        if not within:  # nan budget or totals: the key is missing from a run
            raise CompareError(f"--at-equal {key}: run {run.name} has no evaluation at or below "
                               f"{key}={budget:g} (does it log {key}?)")
        steps.append(within[-1])
    return steps[0], steps[1], budget


def value_at(run: Run, metric: str, step: int) -> float:
    """``metric`` of ``run``'s evaluation at ``step`` (its last row there)."""
    values = [row[metric] for row in run.rows if row.get("step") == step and isinstance(row.get(metric), (int, float))]
    return float(values[-1])


@dataclass
class ProblemTest:
    """One group against the baseline over seeds x problems (``result`` None: no test, ``note``
    says why).

    Attributes:
        label: The group.
        at: Where the runs were compared, e.g. ``last evaluation (step 80)`` or ``exactly equal
            tokens/trained = 48210 (interpolated between evaluations)``.
        result: The crossed t-test of the per-problem differences.
        note: Pairing, outcome and anything left out.
        steps: Per paired seed, ``(seed, group run's step, baseline run's step, budget)``: the
            last evaluations (budget nan), or at a budget the position between the two
            evaluations around it (:class:`creditlab.analysis.budgets.PairRead`).
        p_holm: Holm-adjusted p over the table's tests with a p (None with the correction off).
    """

    label: str
    at: str
    result: CrossedTest | None
    note: str
    steps: list[tuple[Any, float, float, float]] = field(default_factory=list)
    p_holm: float | None = None

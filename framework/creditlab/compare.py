"""``creditlab compare``: aggregate run directories over seeds and test groups against a baseline.

Reading and classifying runs is :mod:`creditlab.rundirs`; the statistics are :mod:`creditlab.stats`;
rendering (Markdown, HTML, plots, terminal) is :mod:`creditlab.report`. ``docs/comparing.md``
explains every number. The entry point is :func:`compare`; it returns a :class:`Comparison` that
holds every run (used or not, with its reason), the per-group statistics, the tests against the
baseline (:mod:`creditlab.significance`) and the aggregated learning curves. Where the runs pair by
seed and recorded every problem's outcome (``eval_problems.jsonl``), each group is also tested
problem by problem over seeds x problems (:mod:`creditlab.problem_records`), at the last
evaluations or at an equal budget of a cumulative counter (``--at-equal``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from creditlab import significance, stats
from creditlab.errors import closest
from creditlab.problem_records import (
    ProblemTest,
    check_budget_key,
    matched_steps,
    paired_problem_test,
    read_records,
    value_at,
)
from creditlab.rundirs import (
    AXES,
    REWARD,
    CompareError,
    Run,
    assign_groups,
    config_mismatches,
    find_runs,
    load_run,
    select_used,
    short_names,
)

CREDIT_PREFIX = "train/credit/"
STEP_TIME = "time/step_s"
TESTED = {"final": "final accuracy", "auc": "AUC"}
#: A test whose smallest possible p is above this says in its note that it cannot reach it.
ALPHA = 0.05


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


@dataclass
class Test:
    """A test of one group against the baseline on one per-seed quantity (``None``: too few runs)."""

    label: str
    quantity: str
    result: significance.DiffTest | None
    note: str


@dataclass
class Comparison:
    """Everything the report shows."""

    settings: dict[str, Any]
    runs: list[Run]
    groups: list[GroupStats]
    tests: list[Test]
    curves: dict[tuple[str, str], dict[str, Band]]
    warnings: list[str]
    problem_tests: list[ProblemTest] = field(default_factory=list)

    @property
    def baseline(self) -> str:
        return self.settings["baseline"]


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


def _pairing(g: GroupStats, base: GroupStats, quantity: str) -> tuple[bool | None, list[float], list[float], str]:
    """Pair seeds both groups have; unpaired when fewer than two match; None when too few runs."""
    gv, bv = g.values[quantity], base.values[quantity]
    g_seeds, b_seeds = [s for s, _ in gv], [s for s, _ in bv]
    unique = None not in g_seeds + b_seeds and len(set(g_seeds)) == len(g_seeds) and len(set(b_seeds)) == len(b_seeds)
    common = sorted(set(g_seeds) & set(b_seeds), key=str) if unique else []
    if len(common) >= 2:
        gd, bd = dict(gv), dict(bv)
        note = f"paired on seeds {', '.join(map(str, common))}"
        extra = sorted((set(g_seeds) ^ set(b_seeds)), key=str)
        if extra:
            note += f"; seeds {', '.join(map(str, extra))} have no partner and are left out of this test"
        return True, [gd[s] for s in common], [bd[s] for s in common], note
    if len(gv) >= 2 and len(bv) >= 2:
        why = "duplicate or unknown seeds" if not unique else (
            f"seeds do not match (baseline {', '.join(map(str, b_seeds))}; this group {', '.join(map(str, g_seeds))})")
        return False, [v for _, v in gv], [v for _, v in bv], f"UNPAIRED: {why}"
    return None, [], [], f"no test: needs at least 2 runs in each group (has {len(gv)}, baseline {len(bv)})"


def significance_tests(groups: list[GroupStats], base: GroupStats, resamples: int, seed: int) -> list[Test]:
    """Each non-baseline group against ``base`` on final accuracy and AUC: a sign-flip test on the
    seeds both have (permutation test when they share fewer than two), with a t-interval."""
    tests = []
    for g in groups:
        if g is base:
            continue
        for quantity in TESTED:
            paired, gv, bv, note = _pairing(g, base, quantity)
            result = None if paired is None else significance.diff_test(gv, bv, paired, resamples, seed)
            if result is not None and result.p_min > ALPHA:
                note += f"; with {result.n} no result can reach p < {ALPHA} (smallest possible p {result.p_min:.3g})"
            tests.append(Test(g.label, quantity, result, note))
    return tests


def problem_tests(groups: list[GroupStats], base: GroupStats, metric: str, key: str | None, resamples: int,
                  seed: int) -> tuple[list[ProblemTest], list[Test]]:
    """Per non-baseline group: the seeds x problems test (:mod:`creditlab.problem_records`) where
    the runs pair by seed (as :func:`_pairing` decides) and, with a budget ``key``, the seed-level
    sign-flip test of the metric at the budget-matched evaluations."""
    records = {r.path: read_records(r.path) for g in groups for r in g.used}
    out, at_budget = [], []
    for g in groups:
        if g is base:
            continue
        paired, _, _, note = _pairing(g, base, "final")
        if not paired:
            out.append(ProblemTest(g.label, "—", None, "no per-problem test: " + note.removeprefix("no test: ")))
            at_budget += [Test(g.label, f"at equal {key}", None, note)] if key else []
            continue
        common = {s for s, _ in g.values["final"]} & {s for s, _ in base.values["final"]}
        runs, base_runs = ({r.seed: r for r in grp.used if r.seed in common} for grp in (g, base))
        out.append(paired_problem_test(g.label, runs, base_runs, metric, key, records))
        if key:
            steps = [(s, *matched_steps(runs[s], base_runs[s], metric, key)) for s in sorted(common, key=str)]
            gv = [value_at(runs[s], metric, a) for s, a, _, _ in steps]
            bv = [value_at(base_runs[s], metric, b) for s, _, b, _ in steps]
            result = significance.paired_test(gv, bv, resamples, seed)
            note += f"; {out[-1].at}" + (f"; with {result.n} no result can reach p < {ALPHA}" if result.p_min > ALPHA else "")
            at_budget.append(Test(g.label, f"at equal {key}", result, note))
    return out, at_budget


def _pick_baseline(labels: list[str], runs: list[Run], by: list[str], wanted: str | None) -> str:
    """``wanted`` (a label, or comma-joined values of the ``--by`` keys); by default the first
    group whose ``method`` is ``grpo``, else the first group with a usable run."""
    if wanted is not None:
        values = {",".join(str(r.config.get(k, "(missing)")) for k in by): r.group for r in runs}
        if wanted in labels or wanted in values:
            return wanted if wanted in labels else values[wanted]
        hint = closest(wanted, labels)
        raise CompareError(
            f"--baseline {wanted}: no such group." + (f" Did you mean '{hint}'?" if hint else "")
            + f" Groups: {', '.join(labels)}."
        )
    used = [lb for lb in labels if any(r.used and r.group == lb for r in runs)] or labels
    if "method" in by:
        grpo = [lb for lb in used if any(r.group == lb and r.config.get("method") == "grpo" for r in runs)]
        if grpo:
            return grpo[0]
    return used[0]


def _check_metric(runs: list[Run], metric: str) -> None:
    """Raise when no run logs ``metric`` at all (a typo), naming the closest logged key."""
    keys = sorted({k for r in runs for row in r.rows for k in row})
    if keys and metric not in keys:
        hint = closest(metric, keys)
        evals = [k for k in keys if k.startswith("eval/")]
        raise CompareError(
            f"--metric {metric}: no run logs it." + (f" Did you mean '{hint}'?" if hint else "")
            + f" Evaluation keys logged: {', '.join(evals) or 'none (eval.every=0?)'}."
        )


def compare(
    paths: list[str | Path],
    by: list[str] | tuple[str, ...] = ("method",),
    baseline: str | None = None,
    threshold: float | None = None,
    metric: str = "eval/pass@1",
    resamples: int = 10000,
    seed: int = 0,
    include_unfinished: bool = False,
    at_equal: str | None = None,
) -> Comparison:
    """Find, read, group and aggregate runs; test each group against the baseline.

    Args:
        paths: Run directories and/or folders holding them (searched recursively).
        by: Config keys whose values define a group (dotted, e.g. ``advantage.std``).
        baseline: Group label to test against (default: ``grpo`` if present, else the first group).
        threshold: Accuracy for tokens-to-threshold (default: the baseline's final mean).
        metric: The evaluation metric (``eval/pass@1``).
        resamples: Bootstrap resamples (IQM intervals; difference intervals from 20 seeds) and
            random arrangements of a Monte Carlo test (when exact enumeration is too large).
        seed: Generator seed of those draws.
        include_unfinished: Count running/killed/crashed/partial runs with evaluations.
        at_equal: A cumulative counter (``tokens/trained``): the per-problem test, and a seed-level
            test beside final and AUC, compare each pair of runs at an equal budget of it
            (:func:`creditlab.problem_records.matched_steps`); None: at the last evaluations.

    Raises:
        CompareError: No runs found, an unknown ``--by`` key or ``--baseline`` group, an
            ``--at-equal`` key that is not a logged cumulative counter.
    """
    by = list(by)
    runs = [load_run(p) for p in find_runs(paths)]
    short_names(runs)
    _check_metric(runs, metric)
    warnings = assign_groups(runs, by)
    select_used(runs, metric, include_unfinished)
    if at_equal is not None:
        check_budget_key([r for r in runs if r.used] or runs, at_equal)
    warnings += config_mismatches([r for r in runs if r.used], by)
    labels = sorted({r.group for r in runs})
    base_label = _pick_baseline(labels, runs, by, baseline)
    labels = [base_label] + [lb for lb in labels if lb != base_label]
    groups = [group_stats(lb, [r for r in runs if r.group == lb], metric, resamples, seed) for lb in labels]
    base = groups[0]
    source = "--threshold"
    if threshold is None:
        threshold = base.final.mean if base.final.n else None
        source = f"baseline '{base_label}' final mean"
    for g in groups:
        if threshold is not None:
            tokens_to_threshold(g, metric, threshold)
    for g in groups:
        steps = sorted(set(g.final_steps))
        if len(steps) > 1:
            warnings.append(f"group '{g.label}': runs end at different steps ({', '.join(map(str, steps))}); "
                            "final accuracy mixes them")
        if not g.used:
            warnings.append(f"group '{g.label}': no usable run (see the runs table)")
    bad = [r for r in runs if r.status != "finished"]
    if bad:
        warnings.insert(0, f"{len(bad)} of {len(runs)} runs did not finish cleanly: "
                        + "; ".join(f"{r.name}: {r.detail}" for r in bad))
    curves = {(axis, m): {g.label: b for g in groups
                          if (b := aggregate_curve(g.used, m, axis, REWARD_SMOOTHING if m == REWARD else 1)) is not None}
              for m in (metric, REWARD) for axis in AXES}
    settings = {"paths": [str(p) for p in paths], "by": by, "baseline": base_label, "metric": metric,
                "threshold": threshold, "threshold_source": source, "resamples": resamples, "seed": seed,
                "include_unfinished": include_unfinished, "at_equal": at_equal}
    per_problem, at_budget = problem_tests(groups, base, metric, at_equal, resamples, seed)
    return Comparison(settings, runs, groups, significance_tests(groups, base, resamples, seed) + at_budget, curves,
                      warnings, per_problem)

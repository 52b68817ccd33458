"""``creditlab compare``: aggregate run directories over seeds and test groups against a baseline.

Reading and classifying runs is :mod:`creditlab.analysis.rundirs`; the statistics are :mod:`creditlab.analysis.stats`;
rendering (Markdown, HTML, plots, terminal) is :mod:`creditlab.analysis.report`. ``docs/comparing.md``
explains every number. The entry point is :func:`compare`; it returns a :class:`Comparison` that
holds every run (used or not, with its reason), the per-group statistics, the tests against the
baseline (:mod:`creditlab.analysis.significance`) and the aggregated learning curves. Where the runs pair by
seed and recorded every problem's outcome (``eval_problems.jsonl``), each group is also tested
problem by problem over seeds x problems (:mod:`creditlab.analysis.problem_records`), at the last
evaluations or at exactly equal budgets of a cumulative counter, read between evaluations
(``--at-equal``, :mod:`creditlab.analysis.budgets`). Each table's p-values
get a Holm-adjusted p. When the runs declared their comparison (``preregistration``), it is tested
as declared first (:mod:`creditlab.analysis.confirmatory`); learning curves are :mod:`creditlab.analysis.curves`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from creditlab.analysis import significance, stats
from creditlab.analysis.budgets import paired_problem_test, read_pair
from creditlab.analysis.confirmatory import Preregistered, declaration, resolve, run_declared
from creditlab.analysis.curves import REWARD_SMOOTHING, Band, aggregate_curve
from creditlab.analysis.preregistration import CLAIM_SEEDS, Preregistration
from creditlab.analysis.problem_records import (
    MIN_SEEDS_FOR_P,
    ProblemTest,
    check_budget_key,
    read_records,
)
from creditlab.analysis.rundirs import (
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
from creditlab.errors import closest

CREDIT_PREFIX = "train/credit/"
STEP_TIME = "time/step_s"
TESTED = {"final": "final accuracy", "auc": "AUC"}
#: A test whose smallest possible p is above this says in its note that it cannot reach it.
ALPHA = 0.05


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
    """A test of one group against the baseline on one per-seed quantity (``None``: too few runs);
    ``p_holm``: Holm-adjusted over every test of the table (None with the correction off)."""

    label: str
    quantity: str
    result: significance.DiffTest | None
    note: str
    p_holm: float | None = None


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
    prereg: Preregistered | None = None

    @property
    def baseline(self) -> str:
        return self.settings["baseline"]


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
                  seed: int, records: dict[Path, dict[int, dict[str, Any]]]) -> tuple[list[ProblemTest], list[Test]]:
    """Per non-baseline group: the seeds x problems test (:func:`creditlab.analysis.budgets.paired_problem_test`)
    where the runs pair by seed (as :func:`_pairing` decides) and, with a budget ``key``, the
    seed-level sign-flip test of the metric with each pair of runs read at exactly equal ``key``,
    interpolated between evaluations (:func:`creditlab.analysis.budgets.read_pair`, as the pre-registered
    budget axes are). ``records``: ``run path -> read_records(run path)``."""
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
            reads = [read_pair(runs[s], base_runs[s], metric, key) for s in sorted(common, key=str)]
            result = significance.paired_test([r.value for r in reads], [r.base_value for r in reads], resamples, seed)
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


def _claims(groups: list[GroupStats], base: GroupStats) -> list[str]:
    """A warning per contrast with fewer than :data:`CLAIM_SEEDS` paired seeds: its exact floor."""
    out = []
    for g in groups:
        paired, gv, _, _ = _pairing(g, base, "final") if g is not base else (None, [], [], "")
        if paired and len(gv) < CLAIM_SEEDS:
            out.append(f"'{g.label}' vs '{base.label}': {len(gv)} paired seeds, so the exact seed-level test cannot go "
                       f"below p = 2/2^{len(gv)} = {2 / 2 ** len(gv):.3g}; claims need >= {CLAIM_SEEDS} seeds "
                       f"(floor 2/2^{CLAIM_SEEDS} = {2 / 2 ** CLAIM_SEEDS:.2g})")
    return out


def _holm(items: list[Any], p_values: list[float | None]) -> None:
    """Set ``p_holm`` of each item that has a p, Holm over those (the table's family)."""
    family = [(item, p) for item, p in zip(items, p_values) if p is not None]
    for (item, _), adjusted in zip(family, significance.holm([p for _, p in family])):
        item.p_holm = adjusted


def _declared(decl: Preregistration | None, source: str, by: list[str] | tuple[str, ...] | None,
              baseline: str | None, metric: str | None) -> tuple[list[str], str | None, str]:
    """``by``, ``baseline`` and ``metric``: the declaration's where one is given and not overridden;
    a ``by`` or ``baseline`` other than the declared one would not test it (CompareError)."""
    if decl is None:
        return list(by or ["method"]), baseline, metric or "eval/pass@1"
    for flag, given, declared in (("--by", ",".join(by or []), ",".join(decl.by)), ("--baseline", baseline, decl.baseline)):
        if given and given != declared:
            raise CompareError(f"{flag} {given}: the pre-registration ({source}) declares {declared}; drop {flag}, "
                               "or add --no-prereg for an exploratory comparison")
    return list(decl.by), decl.baseline, metric or decl.metric


def compare(
    paths: list[str | Path],
    by: list[str] | tuple[str, ...] | None = None,
    baseline: str | None = None,
    threshold: float | None = None,
    metric: str | None = None,
    resamples: int = 10000,
    seed: int = 0,
    include_unfinished: bool = False,
    at_equal: str | None = None,
    prereg: str | Path | None = None,
    use_prereg: bool = True,
    holm: bool = True,
) -> Comparison:
    """Find, read, group and aggregate runs; test each group against the baseline, and what the
    runs declared (:mod:`creditlab.analysis.confirmatory`).

    Args:
        paths: Run directories and/or folders holding them (searched recursively).
        by: Config keys whose values define a group (dotted, e.g. ``advantage.std``; default: the
            declared ``by``, else ``method``).
        baseline: Group label to test against (default: the declared baseline, else ``grpo`` if
            present, else the first group).
        threshold: Accuracy for tokens-to-threshold (default: the baseline's final mean).
        metric: The evaluation metric (default: the declared metric, else ``eval/pass@1``).
        resamples: Bootstrap resamples (IQM intervals; difference intervals from 20 seeds) and
            random arrangements of a Monte Carlo test (when exact enumeration is too large).
        seed: Generator seed of those draws.
        include_unfinished: Count running/killed/crashed/partial runs with evaluations.
        at_equal: A cumulative counter (``tokens/trained``): the per-problem test, and a seed-level
            test beside final and AUC, read each pair of runs at exactly equal totals of it, the
            smaller of their totals at their last evaluations, interpolated between evaluations
            (:func:`creditlab.analysis.budgets.read_pair`); None: at the last evaluations.
        prereg: A YAML file with the declaration to test (default: the one the runs' config.yaml
            records, if any).
        use_prereg: False: no pre-registered section (an exploratory comparison).
        holm: Holm-adjust the p-values of each table (and the declared family).

    Raises:
        CompareError: No runs found, an unknown ``--by`` key or ``--baseline`` group, an
            ``--at-equal`` key that is not a logged cumulative counter, runs that declare different
            pre-registrations (without ``prereg``), a ``by`` or ``baseline`` other than declared.
    """
    runs = [load_run(p) for p in find_runs(paths)]
    short_names(runs)
    decl, prereg_source = declaration(runs, prereg) if use_prereg else (None, "")
    by, baseline, metric = _declared(decl, prereg_source, by, baseline, metric)
    _check_metric(runs, metric)
    warnings = assign_groups(runs, by)
    select_used(runs, metric, include_unfinished)
    if at_equal is not None:
        check_budget_key([r for r in runs if r.used] or runs, at_equal)
    warnings += config_mismatches([r for r in runs if r.used], by)
    labels = sorted({r.group for r in runs})
    if decl is not None and resolve(decl.baseline, runs, by) is None:
        raise CompareError(f"the pre-registered baseline '{decl.baseline}' ({prereg_source}) is no group of these "
                           f"runs. Groups: {', '.join(labels)}.")
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
    warnings += _claims(groups, base)
    bad = [r for r in runs if r.status != "finished"]
    if bad:
        warnings.insert(0, f"{len(bad)} of {len(runs)} runs did not finish cleanly: "
                        + "; ".join(f"{r.name}: {r.detail}" for r in bad))
    curves = {(axis, m): {g.label: b for g in groups
                          if (b := aggregate_curve(g.used, m, axis, REWARD_SMOOTHING if m == REWARD else 1)) is not None}
              for m in (metric, REWARD) for axis in AXES}
    settings = {"paths": [str(p) for p in paths], "by": by, "baseline": base_label, "metric": metric,
                "threshold": threshold, "threshold_source": source, "resamples": resamples, "seed": seed,
                "include_unfinished": include_unfinished, "at_equal": at_equal, "holm": holm,
                "preregistration": prereg_source or None}
    records = {r.path: read_records(r.path) for r in runs if r.used}
    per_problem, at_budget = problem_tests(groups, base, metric, at_equal, resamples, seed, records)
    tests = significance_tests(groups, base, resamples, seed) + at_budget
    if holm:
        _holm(tests, [t.result.p_value if t.result else None for t in tests])
        _holm(per_problem, [t.result.p_value if t.result and t.result.seeds >= MIN_SEEDS_FOR_P else None
                            for t in per_problem])
    declared = None
    if decl is not None:
        declared, more = run_declared(decl, prereg_source, runs, by, base_label, records, holm, resamples, seed)
        warnings = more + warnings
    return Comparison(settings, runs, groups, tests, curves, warnings, per_problem, declared)

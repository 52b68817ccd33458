"""``creditlab compare``: aggregate run directories over seeds and test groups against a baseline.

Reading and classifying runs is :mod:`creditlab.analysis.rundirs`; the statistics are :mod:`creditlab.analysis.stats`;
rendering (Markdown, HTML, plots, terminal) is :mod:`creditlab.analysis.report`. ``docs/comparing.md``
explains every number. The entry point is :func:`compare`; it returns a :class:`Comparison` that
holds every run (used or not, with its reason), the per-group statistics
(:mod:`creditlab.analysis.group_stats`), the tests against the baseline
(:mod:`creditlab.analysis.contrasts`, :mod:`creditlab.analysis.significance`) and the aggregated
learning curves. Where the runs pair by
seed and recorded every problem's outcome (``eval_problems.jsonl``), each group is also tested
problem by problem over seeds x problems (:mod:`creditlab.analysis.problem_records`), at the last
evaluations or at exactly equal budgets of a cumulative counter, read between evaluations
(``--at-equal``, :mod:`creditlab.analysis.budgets`). Each table's p-values
get a Holm-adjusted p. When the runs declared their comparison (``preregistration``), it is tested
as declared first (:mod:`creditlab.analysis.confirmatory`), and a later declaration
(``--prereg FILE``) beside it on the runs started after it (:mod:`creditlab.analysis.later`);
learning curves are :mod:`creditlab.analysis.curves`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditlab.analysis.confirmatory import Preregistered, declaration, resolve, run_declared
from creditlab.analysis.contrasts import Test, adjust_holm, claim_warnings, problem_tests, significance_tests
from creditlab.analysis.curves import REWARD_SMOOTHING, Band, aggregate_curve
from creditlab.analysis.group_stats import GroupStats, group_stats, tokens_to_threshold
from creditlab.analysis.later import Later, fresh_runs, load_later
from creditlab.analysis.results_file import is_results, materialize
from creditlab.analysis.preregistration import Preregistration
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
    later: Preregistered | None = None

    @property
    def baseline(self) -> str:
        return self.settings["baseline"]



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
        paths: Run directories and/or folders holding them (searched recursively), or results
            files a comparison wrote (``results.jsonl.gz``: its runs, compared again).
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
        prereg: A committed YAML file with a later declaration, tested in its own section on
            the runs started after its commit (:mod:`creditlab.analysis.later`); the runs' own
            declaration (their config.yaml) is still the pre-registered one.
        use_prereg: False: no pre-registered section (an exploratory comparison).
        holm: Holm-adjust the p-values of each table (and the declared families; off, a declared
            Holm correction makes the verdicts "not as declared").

    Raises:
        CompareError: No runs found, an unknown ``--by`` key or ``--baseline`` group, an
            ``--at-equal`` key that is not a logged cumulative counter, runs that declare different
            pre-registrations (without ``prereg``), a ``by`` or ``baseline`` other than declared.
    """
    runs = [load_run(p) for p in find_runs([materialize(p) if is_results(p) else p for p in paths])]
    short_names(runs)
    later = load_later(prereg) if prereg is not None else None
    decl, prereg_source, mixed = declaration(runs, mixed_ok=later is not None) if use_prereg else (None, "", "")
    if later is not None and decl is not None and later.declaration.by != decl.by:
        raise CompareError(f"{later.source}: groups by {', '.join(later.declaration.by)}, the runs' declaration by "
                           f"{', '.join(decl.by)}; a later declaration must group the runs as theirs does")
    first = decl or (later.declaration if later is not None else None)
    by, baseline, metric = _declared(first, prereg_source or (later.source if later else ""), by, baseline, metric)
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
    warnings += claim_warnings(groups, base)
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
                "preregistration": prereg_source or None, "later_declaration": later.source if later else None}
    records = {r.path: read_records(r.path) for r in runs if r.used}
    per_problem, at_budget = problem_tests(groups, base, metric, at_equal, resamples, seed, records)
    tests = significance_tests(groups, base, resamples, seed) + at_budget
    if holm:
        adjust_holm(tests, [t.result.p_value if t.result else None for t in tests])
        adjust_holm(per_problem, [t.result.p_value if t.result and t.result.seeds >= MIN_SEEDS_FOR_P else None
                            for t in per_problem])
    declared = None
    if decl is not None:
        declared, more = run_declared(decl, prereg_source, runs, by, base_label, records, holm, resamples, seed)
        warnings = more + warnings
    warnings = ([mixed] if mixed else []) + warnings
    return Comparison(settings, runs, groups, tests, curves, warnings, per_problem, declared,
                      _later(later, runs, by, records, holm, resamples, seed, warnings))


def _later(later: Later | None, runs: list[Run], by: list[str], records: dict[Path, dict[int, dict[str, Any]]],
           holm: bool, resamples: int, seed: int, warnings: list[str]) -> Preregistered | None:
    """The later declaration's section, on the runs started after its commit (warnings appended)."""
    if later is None:
        return None
    fresh, left = fresh_runs(runs, later)
    base_label = resolve(later.declaration.baseline, fresh, by)
    section, more = run_declared(later.declaration, later.source, fresh, by, base_label or later.declaration.baseline,
                                 records, holm, resamples, seed)
    section.later, section.left_out = True, left
    warnings.extend(more)
    return section

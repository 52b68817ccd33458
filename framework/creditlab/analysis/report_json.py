"""``compare.json``: the numbers of a :class:`~creditlab.analysis.compare.Comparison` for scripts, the same
as the report shows (the pre-registered section, each table's tests with their Holm-adjusted p,
every run's status). ``docs/comparing.md`` lists the fields."""

from __future__ import annotations

import math
from typing import Any

from creditlab.analysis.compare import Comparison
from creditlab.analysis.confirmatory import Preregistered
from creditlab.analysis.problem_records import MIN_SEEDS_FOR_P
from creditlab.analysis.significance import CrossedTest, DiffTest


def diff_json(r: DiffTest) -> dict[str, Any]:
    """A seed-level test's fields."""
    return {"diff": r.diff, "t_ci95": [r.t_low, r.t_high], "p_value": r.p_value, "p_min": r.p_min,
            "sides": "two-sided", "test": r.test, "n": r.n, "paired": r.paired, "exact": r.exact,
            "arrangements": r.arrangements,
            "bootstrap_ci95": None if r.boot_low is None else [r.boot_low, r.boot_high]}


def crossed_json(r: CrossedTest) -> dict[str, Any]:
    """A per-problem test's fields (``p_value`` null below ``MIN_SEEDS_FOR_P`` seeds)."""
    return {"diff": r.diff, "t_ci95": [r.low, r.high], "p_value": r.p_value if r.seeds >= MIN_SEEDS_FOR_P else None,
            "sides": "two-sided", "test": "crossed random-effects t (seeds x problems)", "se": r.se,
            "df": r.df if math.isfinite(r.df) else None,
            "variance_components": {"seed": r.var_seed, "problem": r.var_problem, "residual": r.var_resid},
            "seeds": r.seeds, "problems": r.problems}


def prereg_json(p: Preregistered) -> dict[str, Any]:
    """The pre-registered section: the declaration, where it came from, and every declared test."""
    return {
        "declaration": p.declaration.as_dict(), "source": p.source, "holm": p.holm, "family": len(p.tests),
        "later": p.later, "deviations": p.deviations, "left_out": p.left_out,
        "tests": [{"group": t.group, "label": t.label, "baseline": t.baseline, "budget": t.budget, "expect": t.expect,
                   "margin": t.margin, "seeds": t.seeds, "budgets": t.budgets, "note": t.note,
                   "deviations": t.deviations, "p_equivalent": t.p_equivalent, "p_holm": t.p_holm,
                   "decision": p.decision(t), "verdict": p.verdict(t),
                   "agrees": p.agrees(t), **({} if t.result is None else diff_json(t.result)),
                   "per_problem": None if t.problem is None else crossed_json(t.problem)}
                  for t in p.tests],
    }


def to_json(c: Comparison) -> dict[str, Any]:
    """Machine-readable numbers (``compare.json``)."""
    ci = lambda m: {"mean": m.mean, "ci95_half_width": m.half_width, "n": m.n}  # noqa: E731
    iq = lambda m: {"iqm": m.value, "ci95": None if m.low is None else [m.low, m.high], "runs": m.runs,  # noqa: E731
                    "tasks": m.tasks}
    return {
        "settings": c.settings,
        "preregistration": None if c.prereg is None else prereg_json(c.prereg),
        "later_declaration": None if c.later is None else prereg_json(c.later),
        "groups": [{"label": g.label, "seeds": [s for s, _ in g.values.get("final", [])], "final": ci(g.final),
                    "final_steps": g.final_steps, "auc": ci(g.auc), "iqm": {k: iq(v) for k, v in g.iqm.items()},
                    "tokens_to_threshold": {k: {"median": v[0], "reached": v[1]} for k, v in g.to_threshold.items()},
                    "median_step_s": g.step_time, "credit": {k: ci(v) for k, v in g.credit.items()}}
                   for g in c.groups],
        "tests": [{"group": t.label, "quantity": t.quantity, "note": t.note, "p_holm": t.p_holm,
                   **({} if t.result is None else diff_json(t.result))}
                  for t in c.tests],
        "problem_tests": [{"group": t.label, "at": t.at, "note": t.note, "p_holm": t.p_holm,
                           "steps": [{"seed": s, "step": a, "baseline_step": b, "budget": None if math.isnan(x) else x}
                                     for s, a, b, x in t.steps],
                           **({} if t.result is None else crossed_json(t.result))}
                          for t in c.problem_tests],
        "runs": [{"name": r.name, "path": str(r.path), "group": r.group, "seed": r.seed, "status": r.status,
                  "detail": r.detail, "steps": r.steps, "max_steps": r.max_steps, "used": r.used, "reason": r.reason}
                 for r in c.runs],
        "warnings": c.warnings,
    }

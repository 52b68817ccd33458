"""The report's "Pre-registered comparison" section (:mod:`creditlab.analysis.confirmatory`): the
declaration, one row per declared contrast x budget axis (the exact seed-level test, its
Holm-adjusted p over the declared family, the decision at alpha against the prediction, and the
per-problem test as secondary), and what the rest of the report is: exploratory.

Blocks are the report's (``("h2", text)``, ``("p", text)``, ``("table", header, rows)``).
"""

from __future__ import annotations

import math
from typing import Any

from creditlab.analysis.confirmatory import Declared, Preregistered
from creditlab.analysis.problem_records import MIN_SEEDS_FOR_P

EXPLORATORY = "Exploratory: "


def _p(p: float) -> str:
    return f"{p:.3g}"


def _budget(t: Declared) -> str:
    """``steps (last evaluations)`` or ``tokens/generated = 1.2e+05`` (a range over seeds)."""
    if t.budget == "steps":
        return "steps (last evaluations)"
    if not t.budgets:
        return f"{t.budget} (exactly equal)"
    lo, hi = min(t.budgets), max(t.budgets)
    return f"{t.budget} = {lo:.4g}" + (f"–{hi:.4g}" if hi != lo else "") + " (exactly equal)"


def _secondary(t: Declared) -> str:
    r = t.problem
    if r is None:
        return "—"
    p = f"p = {_p(r.p_value)}" if r.seeds >= MIN_SEEDS_FOR_P else f"no p below {MIN_SEEDS_FOR_P} seeds"
    return f"{r.diff:+.3f} [{r.low:+.3f}, {r.high:+.3f}], {p} ({r.seeds} x {r.problems})"


def prereg_rows(p: Preregistered, baseline: str) -> tuple[list[str], list[list[str]]]:
    """The declared tests as a table."""
    d = p.declaration
    header = ["contrast", "budget", "prediction", "seeds", f"difference in {d.metric} (mean over seeds)",
              "95% t-interval", "p (exact sign-flip, two-sided)", *(["Holm p"] if p.holm else []),
              f"decision at alpha = {d.alpha:g}", "agrees with the prediction",
              "per problem (secondary): difference [95% t-interval], p", "note"]
    rows = []
    for t in p.tests:
        r = t.result
        test = ["—", "—", "—"] if r is None else [f"{r.diff:+.4f}", f"[{r.t_low:+.4f}, {r.t_high:+.4f}]",
                                                  f"{_p(r.p_value)} (smallest possible {_p(r.p_min)})"]
        holm = ["—" if t.p_holm is None or r is None else _p(t.p_holm)] if p.holm else []
        decision = p.decision(t)
        decision = f"{decision} than {baseline}" if decision in ("greater", "less") else decision
        agrees = {True: "yes", False: "no", None: "—"}[p.agrees(t)]
        rows.append([f"{t.group} vs {baseline}", _budget(t), t.expect, str(len(t.seeds)), *test, *holm, decision,
                     agrees, _secondary(t), t.note])
    return header, rows


def prereg_blocks(p: Preregistered, baseline: str) -> list[tuple[Any, ...]]:
    """The section's blocks, the first of the report."""
    d = p.declaration
    n = len(p.tests)
    correction = (f"Holm correction over the declared family of {n} tests (contrasts x budget axes; a test that "
                  "could not run counts as p = 1): the decision is a difference where the Holm-adjusted p <= alpha"
                  if p.holm else f"No correction (--no-holm): the decision uses the raw p of each of the {n} tests")
    floor = min((2 / 2 ** len(t.seeds) for t in p.tests if t.seeds), default=math.nan)
    return [
        ("h2", "Pre-registered comparison"),
        ("p", f"Declared in {p.source}" + (f" ('{d.name}')" if d.name else "") + f": metric {d.metric}; budget axes "
              f"{', '.join(d.budgets)}; baseline '{d.baseline}' (grouped by {', '.join(d.by)}); contrasts "
              + "; ".join(f"{c.group} ({c.expect}" + (f"; {', '.join(c.budgets)}" if c.budgets else "") + ")"
                          for c in d.contrasts)
              + f"; alpha {d.alpha:g}; at least {d.min_seeds} seeds."),
        ("table", *prereg_rows(p, baseline)),
        ("p", "Primary test: the exact sign-flip test over the paired seeds' values of the declared metric (steps: "
              "each run's last evaluation; token and time axes: both runs of a seed read at exactly the same "
              "budget, the smaller of their totals at their last evaluations, interpolated linearly between "
              f"evaluations). {correction}; its direction is the sign of the difference (the test is two-sided). "
              "A prediction of 'none' agrees when no difference is shown. "
              + (f"With these seeds no test can go below p = {floor:.3g}. " if math.isfinite(floor) else "")
              + "The per-problem crossed t-test (seeds x problems, on the same interpolated outcomes) is "
              "secondary. Everything below this section is exploratory: other groups, metrics, budgets and "
              "tests were not declared. See docs/comparing.md."),
    ]

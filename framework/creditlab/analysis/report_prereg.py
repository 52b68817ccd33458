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
#: Said where the runs declared nothing: no table of the report is a confirmatory claim.
UNDECLARED = ("Nothing was declared before these runs (no 'preregistration' in their config.yaml, no --prereg "
              "file): every table below is exploratory, whatever its p. A claim needs its comparison declared "
              "before the runs (metric, budget axes, contrasts, seeds, alpha; docs/comparing.md).")


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


def _prediction(t: Declared) -> str:
    return f"none (within ±{t.margin:g})" if t.expect == "none" and t.margin is not None else t.expect


def prereg_rows(p: Preregistered) -> tuple[list[str], list[list[str]]]:
    """The declared tests as a table."""
    d = p.declaration
    header = ["contrast", "budget", "prediction", "seeds", f"difference in {d.metric} (mean over seeds)",
              "95% t-interval", "p (exact sign-flip, two-sided)", "p equivalent (TOST)", *(["Holm p"] if p.holm else []),
              f"decision at alpha = {d.alpha:g}", "verdict",
              "per problem (secondary): difference [95% t-interval], p", "note"]
    rows = []
    for t in p.tests:
        r = t.result
        test = ["—", "—", "—"] if r is None else [f"{r.diff:+.4f}", f"[{r.t_low:+.4f}, {r.t_high:+.4f}]",
                                                  f"{_p(r.p_value)} (smallest possible {_p(r.p_min)})"]
        tost = "—" if t.p_equivalent is None else _p(t.p_equivalent)
        holm = ["—" if t.p_holm is None or r is None else _p(t.p_holm)] if p.holm else []
        decision = p.decision(t)
        decision = f"{decision} than {t.baseline}" if decision in ("greater", "less") else decision
        rows.append([f"{t.group} vs {t.baseline}", _budget(t), _prediction(t), str(len(t.seeds)), *test, tost, *holm,
                     decision, p.verdict(t), _secondary(t), t.note])
    return header, rows


def _declared_in(p: Preregistered) -> str:
    d = p.declaration
    seeds = f"seeds {', '.join(map(str, d.seeds))}" if d.seeds else f"at least {d.min_seeds} seeds"
    contrasts = "; ".join(f"{c.group} vs {d.baseline_of(c)} ({c.expect}" + (f" within ±{c.margin:g}" if c.margin is not None else "")
                          + (f"; {', '.join(c.budgets)}" if c.budgets else "") + ")" for c in d.contrasts)
    return (f"Declared in {p.source}" + (f" ('{d.name}')" if d.name else "") + f": metric {d.metric}; budget axes "
            f"{', '.join(d.budgets)}; baseline '{d.baseline}' (grouped by {', '.join(d.by)}); contrasts {contrasts}; "
            f"alpha {d.alpha:g}; correction {d.correction}; {seeds}.")


def prereg_blocks(p: Preregistered) -> list[tuple[Any, ...]]:
    """The section's blocks: the runs' own declaration first in the report; a later one after it."""
    n = len(p.tests)
    if p.holm:
        correction = (f"Holm correction over the declared family of {n} tests (contrasts x budget axes; a test that "
                      "could not run counts as p = 1), each on the p that would confirm its prediction (the "
                      "difference's; for 'none' with a margin, the equivalence test's)")
    elif p.declaration.correction == "none":
        correction = f"No correction (declared: correction none): each of the {n} tests at alpha"
    else:
        correction = f"No correction (--no-holm, not as declared): the raw p of each of the {n} tests"
    floor = min((2 / 2 ** len(t.seeds) for t in p.tests if t.seeds), default=math.nan)
    head = ("Later declaration (not pre-registered for earlier runs)" if p.later else "Pre-registered comparison")
    blocks: list[tuple[Any, ...]] = [("h2", head), ("p", _declared_in(p))]
    if p.later:
        left = f" Left out, started before it: {len(p.left_out)} run(s) ({'; '.join(p.left_out[:4])}" \
               + (f" and {len(p.left_out) - 4} more" if len(p.left_out) > 4 else "") + ")." if p.left_out else ""
        blocks.append(("p", "A declaration made after earlier runs, dated by its commit: only runs started after "
                            "that commit count towards it, and it relabels nothing above." + left))
    blocks += [
        ("table", *prereg_rows(p)),
        ("p", "Primary test: the exact sign-flip test over the paired seeds' values of the declared metric (steps: "
              "each run's last evaluation; token and time axes: both runs of a seed read at exactly the same "
              "budget, the smaller of their totals at their last evaluations, interpolated linearly between "
              f"evaluations). {correction}; a difference's direction is the sign of its mean (the test is "
              "two-sided, and assumes that without a difference the seeds' differences are symmetric about 0: "
              "a rare collapse that no seed drew cannot show; docs/comparing.md, 'What greater means'). "
              "Verdicts: a 'greater' or 'less' prediction agrees, contradicts or is not shown; a "
              "'none' prediction is 'equivalent' when two one-sided sign-flip tests put the mean within its margin "
              "(the equivalence p at alpha), 'different' when the difference p is at alpha over the family size, "
              "else 'inconclusive' (always, without a margin). A comparison that departs from the declaration "
              "(the correction off, an unfinished run counted, a declared seed missing, fewer seeds than declared) "
              "shows its numbers with the verdict 'not as declared'. "
              + (f"With these seeds no test can go below p = {floor:.3g}. " if math.isfinite(floor) else "")
              + "The per-problem crossed t-test (seeds x problems, on the same interpolated outcomes) is "
              "secondary. Everything below the declared sections is exploratory: other groups, metrics, budgets "
              "and tests were not declared. See docs/comparing.md."),
    ]
    return blocks

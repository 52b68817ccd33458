"""``creditlab compare``'s tests of each group against the baseline: seed-level sign-flip tests of
final accuracy and AUC on the seeds both groups have, the seeds x problems tests (at the last
evaluations or at equal budgets, :mod:`creditlab.analysis.budgets`), warnings for contrasts with
too few seeds for a claim, and Holm's adjustment over a table's tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditlab.analysis import significance
from creditlab.analysis.budgets import paired_problem_test, read_pair
from creditlab.analysis.group_stats import TESTED, GroupStats
from creditlab.analysis.preregistration import CLAIM_SEEDS
from creditlab.analysis.problem_records import ProblemTest

#: A test whose smallest possible p is above this says in its note that it cannot reach it.
ALPHA = 0.05


@dataclass
class Test:
    """A test of one group against the baseline on one per-seed quantity (``None``: too few runs);
    ``p_holm``: Holm-adjusted over every test of the table (None with the correction off)."""

    label: str
    quantity: str
    result: significance.DiffTest | None
    note: str
    p_holm: float | None = None



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



def claim_warnings(groups: list[GroupStats], base: GroupStats) -> list[str]:
    """A warning per contrast with fewer than :data:`CLAIM_SEEDS` paired seeds: its exact floor."""
    out = []
    for g in groups:
        paired, gv, _, _ = _pairing(g, base, "final") if g is not base else (None, [], [], "")
        if paired and len(gv) < CLAIM_SEEDS:
            out.append(f"'{g.label}' vs '{base.label}': {len(gv)} paired seeds, so the exact seed-level test cannot go "
                       f"below p = 2/2^{len(gv)} = {2 / 2 ** len(gv):.3g}; claims need >= {CLAIM_SEEDS} seeds "
                       f"(floor 2/2^{CLAIM_SEEDS} = {2 / 2 ** CLAIM_SEEDS:.2g})")
    return out


def adjust_holm(items: list[Any], p_values: list[float | None]) -> None:
    """Set ``p_holm`` of each item that has a p, Holm over those (the table's family)."""
    family = [(item, p) for item, p in zip(items, p_values) if p is not None]
    for (item, _), adjusted in zip(family, significance.holm([p for _, p in family])):
        item.p_holm = adjusted

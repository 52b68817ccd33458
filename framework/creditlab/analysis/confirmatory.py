"""The pre-registered comparison: what a sweep declared (:mod:`creditlab.analysis.preregistration`), tested
as declared (DESIGN.md section 9).

``creditlab compare`` reads the declaration from the runs' ``config.yaml`` (every run must declare
the same): what the runs recorded is the declaration. A file (``--prereg FILE``) is a *later*
declaration, its own section (:mod:`creditlab.analysis.later`): it never relabels the runs. For
every declared contrast x budget axis it tests the group against its baseline on the declared
metric:

- **primary**: the exact sign-flip test over the paired seeds' values
  (:func:`creditlab.analysis.significance.paired_test`); a ``none`` prediction with a margin by two
  one-sided sign-flip tests (:func:`creditlab.analysis.significance.equivalence_p`). The p that
  confirms each prediction is Holm-adjusted over the declared family (every contrast x budget; a
  test that cannot run counts as p = 1, so the family never shrinks) unless the declaration says
  ``correction: none``;
- **secondary**: the per-problem crossed t-test over seeds x problems
  (:func:`creditlab.analysis.significance.crossed_test`), from :data:`~creditlab.analysis.problem_records.MIN_SEEDS_FOR_P`
  seeds.

The verdict is read only as declared. Where the comparison departs from the declaration (the
correction turned off, an unfinished run counted, a declared seed missing, fewer seeds than
``min_seeds``), the numbers are still shown and the verdict is "not as declared", naming why.

A run's value on the ``steps`` axis is its last evaluation; on a token or time axis each pair of
runs is read at exactly equal budgets, interpolated between evaluations (:mod:`creditlab.analysis.budgets`),
the metric and every problem's outcome alike, as ``--at-equal`` reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditlab.analysis import significance
from creditlab.analysis.budgets import PairRead, metric_values, paired_problem_test, read_pair
from creditlab.analysis.preregistration import Preregistration, load, parse
from creditlab.analysis.problem_records import MIN_SEEDS_FOR_P
from creditlab.analysis.rundirs import CompareError, Run
from creditlab.errors import ConfigError

#: Names listed in a message before "and N more".
SHOWN = 4


@dataclass
class Declared:
    """One declared test: a contrast on one budget axis.

    Attributes:
        group: The declared group name; ``label`` the group it resolved to (None: no such group).
        budget: The budget axis (``steps``, ``tokens/generated``, ...).
        expect: The prediction: ``greater``, ``less`` or ``none``.
        baseline: The declared group it is tested against; ``base_label`` what it resolved to.
        margin: A ``none`` prediction's equivalence margin (None: none declared).
        seeds: The paired seeds.
        budgets: Per paired seed, the budget both runs were read at (steps axis: empty).
        result: The exact seed-level test (None: it could not run; ``note`` says why).
        p_equivalent: The TOST p within ``margin`` (``none`` with a margin, else None).
        problem: The per-problem crossed t-test (secondary; None where there is none).
        note: Pairing and anything left out.
        deviations: How this test departs from the declaration (its verdict is then "not as declared").
        p_holm: Holm-adjusted claim p over the declared family (None with the correction off).
    """

    group: str
    label: str | None
    budget: str
    expect: str
    baseline: str = ""
    base_label: str | None = None
    margin: float | None = None
    seeds: list[Any] = field(default_factory=list)
    budgets: list[float] = field(default_factory=list)
    result: significance.DiffTest | None = None
    p_equivalent: float | None = None
    problem: significance.CrossedTest | None = None
    note: str = ""
    deviations: list[str] = field(default_factory=list)
    p_holm: float | None = None

    @property
    def p_claim(self) -> float | None:
        """The p that would confirm the prediction: equivalence for ``none`` with a margin, else the
        difference's (two-sided)."""
        if self.result is None:
            return None
        return self.p_equivalent if self.p_equivalent is not None else self.result.p_value


#: Verdicts that confirm the prediction.
CONFIRMED = ("agrees", "equivalent")


@dataclass
class Preregistered:
    """A declared section of a comparison: the runs' own pre-registration, or a later declaration
    (``later``: a file committed after earlier runs, tested on the runs started after it).

    Attributes:
        deviations: How the whole comparison departs from the declaration (``--no-holm``,
            ``--include-unfinished`` counting an unfinished run): every verdict is "not as declared".
        left_out: Runs not counted (a later declaration: started before it), with why.
    """

    declaration: Preregistration
    source: str
    tests: list[Declared]
    holm: bool
    deviations: list[str] = field(default_factory=list)
    later: bool = False
    left_out: list[str] = field(default_factory=list)

    def p_decision(self, t: Declared) -> float | None:
        """The claim p the decision uses: Holm-adjusted, or raw with the correction off."""
        return None if t.result is None else (t.p_holm if self.holm else t.p_claim)

    def significant(self, t: Declared) -> bool:
        """A difference at alpha (Holm-adjusted; a ``none`` contrast with a margin: its difference p
        at alpha over the family size, Bonferroni, as its claim p is the equivalence test's)."""
        if t.result is None:
            return False
        if t.p_equivalent is None:
            p = self.p_decision(t)
            return p is not None and p <= self.declaration.alpha
        m = len(self.tests) if self.holm else 1
        return t.result.p_value * m <= self.declaration.alpha

    def decision(self, t: Declared) -> str:
        """``greater``/``less`` (a difference at alpha, by its sign), ``no difference shown`` or ``not tested``."""
        if t.result is None:
            return "not tested"
        if not self.significant(t):
            return "no difference shown"
        return "greater" if t.result.diff > 0 else "less"

    def verdict(self, t: Declared) -> str:
        """The result against the prediction, read as declared:

        - ``not tested``, or ``not as declared (<why>)`` where the comparison departs from it;
        - ``greater``/``less``: ``agrees`` (a difference at alpha in the predicted direction),
          ``contradicts`` (in the other), ``not shown``;
        - ``none``: ``equivalent`` (the equivalence p at alpha: within the margin, even where a
          smaller difference is significant), else ``different`` (a difference at alpha), else
          ``inconclusive`` (always so without a margin: no difference shown is not evidence of none).
        """
        if t.result is None:
            return "not tested"
        why = self.deviations + t.deviations
        if why:
            return f"not as declared ({'; '.join(why)})"
        decision = self.decision(t)
        if t.expect != "none":
            return "not shown" if decision == "no difference shown" else ("agrees" if decision == t.expect else "contradicts")
        p = self.p_decision(t)
        if t.margin is not None and p is not None and p <= self.declaration.alpha:
            return "equivalent"  # within the margin, even where a smaller difference is significant
        if decision != "no difference shown":
            return "different"
        return "inconclusive" + ("" if t.margin is not None else " (no margin declared)")

    def agrees(self, t: Declared) -> bool | None:
        """Whether the verdict confirms the prediction; None when it could not be read as declared."""
        v = self.verdict(t)
        return None if v == "not tested" or v.startswith("not as declared") else v in CONFIRMED


def _names(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _block(run: Run) -> Any:
    """A run's ``preregistration`` block rebuilt from its flattened config (None: none declared)."""
    prefix = "preregistration."
    block = {k[len(prefix):]: v for k, v in run.config.items() if k.startswith(prefix)}
    return block or run.config.get("preregistration")


def declaration(runs: list[Run], mixed_ok: bool = False) -> tuple[Preregistration | None, str, str]:
    """The declaration the runs' ``config.yaml`` record (runs without a config aside), where it
    came from, and (``mixed_ok``) why there is none though runs declare.

    Raises:
        CompareError: A run's block is invalid, or the runs declare different things (naming which
            runs declare what) and not ``mixed_ok``.
    """
    found: dict[str, tuple[Preregistration | None, list[str]]] = {}
    for run in runs:
        if not run.config:
            continue
        try:
            decl = parse(_block(run), f"run {run.name}: preregistration")
        except ConfigError as exc:
            raise CompareError(str(exc)) from None
        key = json.dumps(None if decl is None else decl.as_dict(), sort_keys=True)
        found.setdefault(key, (decl, []))[1].append(run.name)
    if len(found) > 1:
        first = next((d.as_dict() for d, _ in found.values() if d is not None), {})
        parts = []
        for d, names in found.values():
            differs = [] if d is None else [k for k, v in d.as_dict().items() if first.get(k) != v]
            verb = "differs" if len(differs) == 1 else "differ"
            what = "none" if d is None else repr(d.name or d.metric) + (f" ({', '.join(differs)} {verb})" if differs else "")
            parts.append(f"{what} in {_names(names)}")
        message = "the runs declare different pre-registrations: " + "; ".join(parts)
        if mixed_ok:
            return None, "", message + ": no pre-registered section"
        raise CompareError(message + ". Compare the runs of one declaration, or add --no-prereg for an exploratory "
                           "comparison (--prereg FILE tests a later declaration beside it).")
    decl, names = next(iter(found.values()), (None, []))
    return decl, f"config.yaml of {len(names)} run(s)", ""


def resolve(name: str, runs: list[Run], by: list[str]) -> str | None:
    """The group label ``name`` means: a label, or the ``--by`` values joined by commas."""
    labels = {r.group for r in runs}
    values = {",".join(str(r.config.get(k, "(missing)")) for k in by): r.group for r in runs}
    return name if name in labels else values.get(name)


def _read(run: Run, base: Run, metric: str, budget: str) -> PairRead:
    """Both runs on one budget axis: :func:`creditlab.analysis.budgets.read_pair` (``steps``: the last
    evaluations), the reading ``creditlab compare --at-equal`` makes too."""
    return read_pair(run, base, metric, None if budget == "steps" else budget)


def _per_problem(pairs: dict[Any, tuple[Run, Run]], budget: str, metric: str,
                 records: dict[Path, dict[int, dict[str, Any]]]) -> tuple[significance.CrossedTest | None, str]:
    """The seeds x problems test of ``pairs`` on one budget axis (:func:`creditlab.analysis.budgets.paired_problem_test`,
    as ``--at-equal`` makes it), and why there is none."""
    runs, base = ({s: pair[i] for s, pair in pairs.items()} for i in (0, 1))
    test = paired_problem_test("", runs, base, metric, None if budget == "steps" else budget, records)
    return test.result, "" if test.result is not None else test.note.removeprefix("no per-problem test: ")


def _paired(runs: list[Run], base: list[Run]) -> dict[Any, tuple[Run, Run]]:
    """Seed -> (run, baseline run) for the seeds both have once."""
    seeds, base_seeds = [r.seed for r in runs], [r.seed for r in base]
    mine = {r.seed: r for r in runs if seeds.count(r.seed) == 1 and r.seed is not None}
    theirs = {r.seed: r for r in base if base_seeds.count(r.seed) == 1 and r.seed is not None}
    return {s: (mine[s], theirs[s]) for s in sorted(set(mine) & set(theirs), key=str)}


def _test(t: Declared, pairs: dict[Any, tuple[Run, Run]], decl: Preregistration,
          records: dict[Path, dict[int, dict[str, Any]]], resamples: int, seed: int) -> None:
    """Fill one declared test in place."""
    t.seeds = list(pairs)
    if len(pairs) < 2:
        t.note = f"not tested: {len(pairs)} paired seed(s), the test needs 2"
        return
    try:
        reads = [_read(run, base, decl.metric, t.budget) for run, base in pairs.values()]
    except (CompareError, ValueError) as exc:
        t.note = f"not tested: {exc}"
        return
    t.budgets = [x.budget for x in reads] if t.budget != "steps" else []
    t.result = significance.paired_test([x.value for x in reads], [x.base_value for x in reads], resamples, seed)
    if t.margin is not None:
        t.p_equivalent = significance.equivalence_p([x.value - x.base_value for x in reads], t.margin, resamples, seed)
    t.problem, why = _per_problem(pairs, t.budget, decl.metric, records)
    t.note = f"paired on seeds {', '.join(map(str, pairs))}" + (f"; no per-problem test: {why}" if why else "")
    if t.problem is not None and len(pairs) < MIN_SEEDS_FOR_P:
        t.note += f"; per-problem p from {MIN_SEEDS_FOR_P} seeds"


def _seed_deviations(pairs: dict[Any, tuple[Run, Run]], decl: Preregistration) -> tuple[dict[Any, tuple[Run, Run]], list[str], str]:
    """The pairs the declaration covers, how the seeds depart from it, and a note on seeds left out:
    declared seeds are the ones tested (a missing one is a deviation, an undeclared one is left
    out); without a list, fewer than ``min_seeds`` paired seeds is a deviation."""
    if not decl.seeds:
        short = [f"{len(pairs)} paired seed(s), declared at least {decl.min_seeds}"] if len(pairs) < decl.min_seeds else []
        return pairs, short, ""
    missing = [s for s in decl.seeds if s not in pairs]
    extra = [s for s in pairs if s not in decl.seeds]
    kept = {s: v for s, v in pairs.items() if s in decl.seeds}
    why = [f"declared seed(s) {', '.join(map(str, missing))} missing"] if missing else []
    return kept, why, f"seeds {', '.join(map(str, extra))} not declared, left out" if extra else ""


def run_declared(decl: Preregistration, source: str, runs: list[Run], by: list[str], baseline: str,
                 records: dict[Path, dict[int, dict[str, Any]]], holm: bool = True, resamples: int = 10000,
                 seed: int = 0) -> tuple[Preregistered, list[str]]:
    """Every declared contrast x budget against its baseline (``baseline``, a group label, unless the
    contrast names its own), on the used runs that evaluated the declared metric. Returns the
    section and its warnings (a missing group, fewer paired seeds than declared)."""
    usable = [r for r in runs if r.used and metric_values(r, decl.metric)]
    tests, warnings = [], []
    for c in decl.contrasts:
        label = resolve(c.group, runs, by)
        base_label = baseline if c.baseline is None else resolve(c.baseline, runs, by)
        members = [r for r in usable if label is not None and r.group == label]
        base = [r for r in usable if base_label is not None and r.group == base_label]
        pairs, deviations, left = _seed_deviations(_paired(members, base), decl)
        against = decl.baseline_of(c)
        if label is None or not members or base_label is None or not base:
            groups = sorted({r.group for r in runs})
            missing = c.group if label is None or not members else against
            warnings.append(f"pre-registered group '{missing}' has no usable run with {decl.metric} "
                            f"(groups: {', '.join(groups)}): its tests count as p = 1")
        elif deviations:
            warnings.append(f"pre-registered contrast '{c.group}' vs '{against}': {'; '.join(deviations)}: "
                            f"its verdict is not as declared (smallest possible exact p {2 / 2 ** len(pairs):.3g})")
        unfinished = sorted(r.name for pair in pairs.values() for r in pair if r.status != "finished")
        if unfinished:
            deviations.append(f"unfinished run(s) counted: {_names(unfinished)} (--include-unfinished)")
        for budget in decl.budgets_of(c):
            t = Declared(c.group, label, budget, c.expect, against, base_label, c.margin, deviations=list(deviations))
            if label is None or not members:
                t.note = "not tested: no such group" if label is None else f"not tested: no usable run with {decl.metric}"
            elif base_label is None or not base:
                t.note = "not tested: no such baseline group" if base_label is None else \
                    f"not tested: the baseline has no usable run with {decl.metric}"
            else:
                _test(t, pairs, decl, records, resamples, seed)
                t.note += f"; {left}" if left else ""
            tests.append(t)
    applied = holm and decl.correction == "holm"
    if applied:
        for t, p in zip(tests, significance.holm([1.0 if t.p_claim is None else t.p_claim for t in tests])):
            t.p_holm = p
    off = [f"--no-holm (declared: Holm over the family of {len(tests)})"] if decl.correction == "holm" and not holm else []
    return Preregistered(decl, source, tests, applied, off), warnings

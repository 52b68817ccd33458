"""The pre-registered comparison: what a sweep declared (:mod:`creditlab.analysis.preregistration`), tested
as declared (DESIGN.md section 9).

``creditlab compare`` reads the declaration from the runs' ``config.yaml`` (every run must declare
the same, or ``--prereg FILE`` says which), and for every declared contrast x budget axis tests
the group against the baseline on the declared metric:

- **primary**: the exact sign-flip test over the paired seeds' values
  (:func:`creditlab.analysis.significance.paired_test`), Holm-adjusted over the declared family (every
  contrast x budget; a test that cannot run counts as p = 1, so the family never shrinks), and the
  decision at the declared alpha against the prediction;
- **secondary**: the per-problem crossed t-test over seeds x problems
  (:func:`creditlab.analysis.significance.crossed_test`), from :data:`~creditlab.analysis.problem_records.MIN_SEEDS_FOR_P`
  seeds.

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
        seeds: The paired seeds.
        budgets: Per paired seed, the budget both runs were read at (steps axis: empty).
        result: The exact seed-level test (None: it could not run; ``note`` says why).
        problem: The per-problem crossed t-test (secondary; None where there is none).
        note: Pairing and anything left out.
        p_holm: Holm-adjusted p over the declared family (None with the correction off).
    """

    group: str
    label: str | None
    budget: str
    expect: str
    seeds: list[Any] = field(default_factory=list)
    budgets: list[float] = field(default_factory=list)
    result: significance.DiffTest | None = None
    problem: significance.CrossedTest | None = None
    note: str = ""
    p_holm: float | None = None


@dataclass
class Preregistered:
    """The pre-registered section of a comparison."""

    declaration: Preregistration
    source: str
    tests: list[Declared]
    holm: bool

    def p_decision(self, t: Declared) -> float | None:
        """The p the decision uses: Holm-adjusted, or raw with the correction off."""
        return None if t.result is None else (t.p_holm if self.holm else t.result.p_value)

    def significant(self, t: Declared) -> bool:
        p = self.p_decision(t)
        return p is not None and p <= self.declaration.alpha

    def decision(self, t: Declared) -> str:
        """``greater``/``less`` (a difference at alpha, by its sign), ``no difference shown`` or ``not tested``."""
        if t.result is None:
            return "not tested"
        if not self.significant(t):
            return "no difference shown"
        return "greater" if t.result.diff > 0 else "less"

    def agrees(self, t: Declared) -> bool | None:
        """Whether the result agrees with the prediction (``none``: agreement is no significant
        difference); None when the test could not run."""
        if t.result is None:
            return None
        return self.decision(t) == ("no difference shown" if t.expect == "none" else t.expect)


def _names(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _block(run: Run) -> Any:
    """A run's ``preregistration`` block rebuilt from its flattened config (None: none declared)."""
    prefix = "preregistration."
    block = {k[len(prefix):]: v for k, v in run.config.items() if k.startswith(prefix)}
    return block or run.config.get("preregistration")


def declaration(runs: list[Run], file: str | Path | None = None) -> tuple[Preregistration | None, str]:
    """The declaration to test and where it came from: ``file`` when given, else the one every
    run's ``config.yaml`` records (runs without a config aside).

    Raises:
        CompareError: The file or a run's block is invalid, or the runs declare different things
            (naming which runs declare what) and no file says which to test.
    """
    if file is not None:
        try:
            return load(file), f"--prereg {file}"
        except ConfigError as exc:
            raise CompareError(str(exc)) from None
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
        raise CompareError("the runs declare different pre-registrations: " + "; ".join(parts)
                           + ". Pass --prereg FILE to say which declaration to test (or --no-prereg).")
    decl, names = next(iter(found.values()), (None, []))
    return decl, f"config.yaml of {len(names)} run(s)"


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
    t.problem, why = _per_problem(pairs, t.budget, decl.metric, records)
    t.note = f"paired on seeds {', '.join(map(str, pairs))}" + (f"; no per-problem test: {why}" if why else "")
    if t.problem is not None and len(pairs) < MIN_SEEDS_FOR_P:
        t.note += f"; per-problem p from {MIN_SEEDS_FOR_P} seeds"


def run_declared(decl: Preregistration, source: str, runs: list[Run], by: list[str], baseline: str,
                 records: dict[Path, dict[int, dict[str, Any]]], holm: bool = True, resamples: int = 10000,
                 seed: int = 0) -> tuple[Preregistered, list[str]]:
    """Every declared contrast x budget against ``baseline`` (a group label), on the used runs that
    evaluated the declared metric. Returns the section and its warnings (a missing group, fewer
    paired seeds than ``min_seeds``)."""
    usable = [r for r in runs if r.used and metric_values(r, decl.metric)]
    base = [r for r in usable if r.group == baseline]
    tests, warnings = [], []
    for c in decl.contrasts:
        label = resolve(c.group, runs, by)
        members = [r for r in usable if label is not None and r.group == label]
        pairs = _paired(members, base)
        if label is None or not members:
            groups = sorted({r.group for r in runs})
            warnings.append(f"pre-registered group '{c.group}' has no usable run with {decl.metric} "
                            f"(groups: {', '.join(groups)}): its tests count as p = 1")
        elif len(pairs) < decl.min_seeds:
            warnings.append(f"pre-registered contrast '{c.group}' vs '{baseline}': {len(pairs)} paired seed(s), fewer "
                            f"than the declared min_seeds {decl.min_seeds} (smallest possible exact p "
                            f"{2 / 2 ** len(pairs):.3g})")
        for budget in decl.budgets_of(c):
            t = Declared(c.group, label, budget, c.expect)
            if label is None or not members:
                t.note = "not tested: no such group" if label is None else f"not tested: no usable run with {decl.metric}"
            else:
                _test(t, pairs, decl, records, resamples, seed)
            tests.append(t)
    if holm:
        for t, p in zip(tests, significance.holm([1.0 if t.result is None else t.result.p_value for t in tests])):
            t.p_holm = p
    return Preregistered(decl, source, tests, holm), warnings

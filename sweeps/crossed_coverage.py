"""Coverage of the per-problem test over seeds x problems, by simulation: how often its 95%
interval holds the true mean difference, for the test ``creditlab compare`` runs
(:func:`creditlab.analysis.significance.crossed_test`, crossed random effects, ``S − 1`` degrees of
freedom when a seed component is estimated) and for the crossed bootstrap it replaced
(:func:`crossed_bootstrap`, kept here as it was).

    OMP_NUM_THREADS=1 python sweeps/crossed_coverage.py     # docs/comparing.md's table (~80 s on one core)
    python sweeps/crossed_coverage.py --reps 500 --bootstrap-reps 200
    OMP_NUM_THREADS=1 python sweeps/crossed_coverage.py --null   # false positives at alpha / m, Holm over 6

Each repetition draws a (seeds S, problems P) array of paired differences ``d[s, p]`` from one
scenario, with fresh seeds and fresh problems every time (the interval's target is the mean over
the populations of seeds and problems, what a claim about a method is about), and asks each test
for its 95% interval. Additive scenarios ``d = μ + a_s + b_p + e_sp`` with normal effects of the
standard deviations in :data:`SCENARIOS`; ``binary`` draws 0/1 outcomes of two runs per seed on
problems of logit-normal difficulty, a method that helps some problems and hurts others as much,
and run-level skill offsets (:func:`draw`): the mean difference is 0 by symmetry, so its coverage
is one minus the test's false-positive rate. Coverage has a simulation standard error of
``sqrt(0.95 · 0.05 / reps)``: 0.0034 at 4000 repetitions (the crossed t-test's), 0.0097 at 500 (the
old bootstrap's, 1000 draws each: 3 ms a repetition against the t-test's 0.3 ms).

``--null`` asks the other question Holm's correction needs answered (issue 55): with every arm the
baseline's equal, how often does the test reject at 0.05, at 0.05/6 and at 0.001, and how often
does Holm over 6 contrasts against one shared baseline reject any (the family-wise error)?
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

from creditlab.analysis.significance import crossed_test, holm

#: Scenario -> (seed sd, problem sd, noise sd) of the additive model ``d = μ + a_s + b_p + e_sp``.
#: At 5 seeds x 200 problems the mean's variance is 87% seeds (``seed``), 82% problems
#: (``problem``), all noise (``noise``), or 21% / 51% / 28% (``mixed``).
SCENARIOS: dict[str, tuple[float, float, float] | None] = {
    "seed": (0.1, 0.1, 0.5),
    "problem": (0.01, 0.5, 0.5),
    "noise": (0.0, 0.0, 0.5),
    "mixed": (0.03, 0.3, 0.5),
    "binary": None,
}
MU = 0.02
#: ``binary``: problem difficulty, the method's per-problem effect and each run's skill, on the
#: logit scale.
DIFFICULTY_SD, EFFECT_SD, RUN_SD = 1.5, 0.5, 0.15


def draw(scenario: str, seeds: int, problems: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """One (seeds, problems) array of differences and the true mean difference."""
    sds = SCENARIOS[scenario]
    if sds is not None:
        a, b, e = sds
        d = (MU + a * rng.standard_normal((seeds, 1)) + b * rng.standard_normal((1, problems))
             + e * rng.standard_normal((seeds, problems)))
        return d, MU
    theta = DIFFICULTY_SD * rng.standard_normal(problems)
    effect = EFFECT_SD * rng.standard_normal(problems)
    skill = RUN_SD * rng.standard_normal((2, seeds, 1))  # baseline's and method's run of each seed
    base = rng.random((seeds, problems)) < 1 / (1 + np.exp(-(theta + skill[0])))
    meth = rng.random((seeds, problems)) < 1 / (1 + np.exp(-(theta + effect + skill[1])))
    return meth.astype(float) - base.astype(float), 0.0


def crossed_bootstrap(d: np.ndarray, resamples: int, rng: np.random.Generator) -> tuple[float, float]:
    """The 95% percentile interval of the crossed (pigeonhole) bootstrap ``creditlab compare`` used
    before :func:`~creditlab.analysis.significance.crossed_test` (Owen 2007): each draw resamples the seeds
    and, independently, the problems with replacement and takes the mean of the crossed cells. As
    it was, but the problems' counts come from ``bincount`` of uniform draws (the same
    multinomial distribution, faster)."""
    seeds, problems = d.shape
    w_seed = rng.multinomial(seeds, np.full(seeds, 1.0 / seeds), size=resamples)
    picks = rng.integers(0, problems, size=(resamples, problems)) + problems * np.arange(resamples)[:, None]
    w_prob = np.bincount(picks.ravel(), minlength=resamples * problems).reshape(resamples, problems)
    draws = ((w_prob @ d.T) * w_seed).sum(axis=1) / (seeds * problems)
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(low), float(high)


@dataclass(frozen=True)
class Cell:
    """Coverage of both tests in one (scenario, seeds, problems) cell, with the repetitions."""

    scenario: str
    seeds: int
    problems: int
    new: float
    reps: int
    old: float | None
    old_reps: int


def coverage(scenario: str, seeds: int, problems: int, reps: int, old_reps: int, resamples: int = 1000,
             seed: int = 0) -> Cell:
    """Share of ``reps`` repetitions whose interval holds the true mean: the crossed t-test on all
    of them, the crossed bootstrap (``resamples`` draws) on the first ``old_reps`` (same arrays)."""
    rng = np.random.default_rng(seed)
    hit_new = hit_old = 0
    for rep in range(reps):
        d, truth = draw(scenario, seeds, problems, rng)
        t = crossed_test(d)
        hit_new += t.low <= truth <= t.high
        if rep < old_reps:
            low, high = crossed_bootstrap(d, resamples, rng)
            hit_old += low <= truth <= high
    return Cell(scenario, seeds, problems, hit_new / reps, reps, hit_old / old_reps if old_reps else None, old_reps)


def table(cells: list[Cell]) -> str:
    """The Markdown table of docs/comparing.md: one row per scenario and seeds, one column pair
    (crossed t-test, old bootstrap) per problem count."""
    problems = sorted({c.problems for c in cells})
    head = "| scenario | seeds | " + " | ".join(f"P = {p}: crossed t | P = {p}: old bootstrap" for p in problems) + " |"
    lines = [head, "|---|---|" + "---|" * (2 * len(problems))]
    for scenario in dict.fromkeys(c.scenario for c in cells):
        for s in sorted({c.seeds for c in cells if c.scenario == scenario}):
            row = {c.problems: c for c in cells if c.scenario == scenario and c.seeds == s}
            vals = " | ".join(f"{row[p].new:.3f} | " + ("—" if row[p].old is None else f"{row[p].old:.3f}")
                              for p in problems)
            lines.append(f"| {scenario} | {s} | {vals} |")
    return "\n".join(lines)


#: ``--null`` levels: a single test's, Holm's first threshold over 6 contrasts, and a strict one.
LEVELS = (0.05, 0.05 / 6, 0.001)
#: ``--null`` scenarios: the additive ones with the same variances (the effects of two arms'
#: outcomes, so a contrast's difference has the sds of :data:`SCENARIOS`), ``binary``, and
#: ``binary_crn``: ``binary`` with common random numbers in the evaluation (every arm of a seed
#: compares the same uniform draw with its probability of a right answer on a problem).
NULL_SCENARIOS = ("seed", "problem", "noise", "mixed", "binary", "binary_crn")


def null_draw(scenario: str, seeds: int, problems: int, arms: int, rng: np.random.Generator) -> np.ndarray:
    """``arms`` null contrasts against one shared baseline: an (arms, seeds, problems) array of
    differences whose population mean is 0 (every arm is the baseline's equal)."""
    sds = SCENARIOS.get(scenario.removesuffix("_crn"))
    if sds is not None:
        a, b, e = (x / np.sqrt(2) for x in sds)  # per arm: a difference of two arms has the sds above
        y = (a * rng.standard_normal((arms + 1, seeds, 1)) + b * rng.standard_normal((arms + 1, 1, problems))
             + e * rng.standard_normal((arms + 1, seeds, problems)))
        return y[1:] - y[:1]
    theta = DIFFICULTY_SD * rng.standard_normal(problems)
    effect = np.concatenate([np.zeros((1, problems)), EFFECT_SD * rng.standard_normal((arms, problems))])
    skill = RUN_SD * rng.standard_normal((arms + 1, seeds, 1))
    shape = (1 if scenario == "binary_crn" else arms + 1, seeds, problems)
    right = rng.random(shape) < 1 / (1 + np.exp(-(theta + effect[:, None, :] + skill)))
    return right[1:].astype(float) - right[:1].astype(float)


@dataclass(frozen=True)
class NullCell:
    """False positives of the crossed t-test in one (scenario, seeds, problems) cell: each level's
    rejection rate over all contrasts, the family-wise error with Holm over the arms, and the share
    of tests whose seed component was set to 0."""

    scenario: str
    seeds: int
    problems: int
    rates: tuple[float, ...]
    fwer_holm: float
    clipped: float
    reps: int


def null_rates(scenario: str, seeds: int, problems: int, reps: int, arms: int = 6, seed: int = 0) -> NullCell:
    """Rejection rates of ``reps`` null experiments of ``arms`` contrasts each (:func:`null_draw`)."""
    rng = np.random.default_rng(seed)
    hits, fwer, clipped = np.zeros(len(LEVELS)), 0, 0
    for _ in range(reps):
        tests = [crossed_test(d) for d in null_draw(scenario, seeds, problems, arms, rng)]
        p = np.array([t.p_value for t in tests])
        hits += (p[:, None] <= np.array(LEVELS)[None, :]).sum(axis=0)
        fwer += min(holm(p)) <= 0.05
        clipped += sum(t.var_seed == 0 for t in tests)
    n = reps * arms
    return NullCell(scenario, seeds, problems, tuple(float(h / n) for h in hits), fwer / reps, clipped / n, reps)


def null_table(cells: list[NullCell]) -> str:
    """The Markdown table of docs/comparing.md's null simulation."""
    head = ("| scenario | seeds | problems | seed variance set to 0 | "
            + " | ".join(f"rejects at {a:.4g}" for a in LEVELS) + " | family-wise error, Holm over 6 |")
    lines = [head, "|---|---|---|---|" + "---|" * (len(LEVELS) + 1)]
    for c in cells:
        lines.append(f"| {c.scenario} | {c.seeds} | {c.problems} | {c.clipped:.3f} | "
                     + " | ".join(f"{r:.4f}" for r in c.rates) + f" | {c.fwer_holm:.3f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=4000, help="repetitions per cell for the crossed t-test")
    p.add_argument("--bootstrap-reps", type=int, default=500, help="of those, how many also run the old bootstrap")
    p.add_argument("--resamples", type=int, default=1000, help="draws of each old bootstrap")
    p.add_argument("--seeds", help="default 3,5,8 (--null: 5,8)")
    p.add_argument("--problems", help="default 200,500 (--null: 500)")
    p.add_argument("--scenarios", help=f"default {','.join(SCENARIOS)} (--null: {','.join(NULL_SCENARIOS)})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--null", action="store_true",
                   help="false positives instead of coverage: 6 null contrasts against one baseline per repetition")
    args = p.parse_args()
    scenarios = (args.scenarios or ",".join(NULL_SCENARIOS if args.null else SCENARIOS)).split(",")
    seeds = [int(x) for x in (args.seeds or ("5,8" if args.null else "3,5,8")).split(",")]
    problems = [int(x) for x in (args.problems or ("500" if args.null else "200,500")).split(",")]
    start, cells = time.time(), []
    if args.null:
        null = [null_rates(sc, s, n, args.reps, seed=args.seed + 10000 * i + 100 * j + k)
                for i, sc in enumerate(scenarios) for j, s in enumerate(seeds) for k, n in enumerate(problems)]
        print(null_table(null))
        print(f"\n{args.reps} null experiments of 6 contrasts per cell; {time.time() - start:.0f} s")
        return
    for i, scenario in enumerate(scenarios):
        for j, s in enumerate(seeds):
            for k, n in enumerate(problems):
                cells.append(coverage(scenario, s, n, args.reps, args.bootstrap_reps, args.resamples,
                                      seed=args.seed + 10000 * i + 100 * j + k))
    print(table(cells))
    print(f"\n{args.reps} repetitions per cell (crossed t-test), {args.bootstrap_reps} of them also with the old "
          f"bootstrap ({args.resamples} draws each); {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()

"""Two methods per problem at *exactly* equal budgets: the run with more of the budget counter is
read between its evaluations, interpolated linearly to the other run's final total.

    python sweeps/equal_tokens.py multirun/trap --method srpo_oracle --baseline grpo
    python sweeps/equal_tokens.py multirun/trap          # every method in the sweep against grpo

`creditlab compare --at-equal` reads runs the same way since issue 38; before, it took each run's
last evaluation *within* the smaller final total, which with evaluations every 20 steps could hand
the cheaper method up to one evaluation interval of extra budget (docs/methods/positive_control.md:
20% more trained tokens for the oracle on `experiment=credit_trap`). Here the budget B is the smaller of the two runs'
totals at their last evaluations; that run is read at its last evaluation, and the other run's
per-problem outcomes at B are interpolated between its two evaluations around B (sampled
accuracy: correct / samples; greedy: 0/1 read as a probability): :mod:`creditlab.analysis.budgets`, the
interpolation ``creditlab compare``'s pre-registered section uses. Runs are
``<dir>/<method>-seed<s>``; seeds both methods finished are paired. Printed: the mean difference
per problem with the crossed random-effects t-test over seeds and problems
(``creditlab.analysis.significance.crossed_test``; the numbers in docs/methods/positive_control.md came
from the crossed bootstrap it replaced), each seed's mean, and the exact sign-flip test over seeds.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from creditlab.analysis.budgets import outcomes_at_budget, totals
from creditlab.analysis.problem_records import read_records
from creditlab.analysis.rundirs import CompareError
from creditlab.analysis.significance import crossed_test, paired_test


def _totals(run: Path, key: str) -> dict[int, float]:
    """``step -> key`` (a cumulative counter) from a run's metrics.jsonl; 0 at step 0."""
    return totals([json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()], key)


def pair(method_run: Path, base_run: Path, key: str, metric: str) -> tuple[np.ndarray, float]:
    """Per-problem differences (method − baseline) at the smaller of the two runs' totals at their
    last evaluations, and that budget."""
    runs = [(read_records(r), _totals(r, key)) for r in (method_run, base_run)]
    ends = [spent.get(max(records), float("nan")) for records, spent in runs]
    budget = min(ends)
    if budget != budget:
        raise SystemExit(f"{method_run} or {base_run}: no {key} total at the last evaluation")
    try:
        got = [outcomes_at_budget(rec, spent, budget, metric) for rec, spent in runs]
    except CompareError as exc:
        raise SystemExit(str(exc)) from None
    ids = sorted(got[0])
    return np.array([got[0][i] - got[1][i] for i in ids]), budget


def methods_in(root: Path, baseline: str) -> list[str]:
    """Every method with a ``<method>-seed<s>`` run under ``root``, the baseline left out."""
    found = {m.group(1) for d in root.iterdir() if (m := re.fullmatch(r"(.+)-seed\d+", d.name))}
    return sorted(found - {baseline})


def report(root: Path, method: str, baseline: str, key: str, metric: str) -> str:
    """The printed test of one method against the baseline over the seeds both finished."""
    seeds = sorted(int(m.group(1)) for d in root.glob(f"{method}-seed*")
                   if (m := re.fullmatch(rf"{re.escape(method)}-seed(\d+)", d.name))
                   and (root / f"{baseline}-seed{m.group(1)}").is_dir())
    if len(seeds) < 2:
        raise SystemExit(f"need >= 2 seeds with both {method} and {baseline} runs in {root}, found {seeds}")
    rows, budgets = [], []
    for s in seeds:
        d, budget = pair(root / f"{method}-seed{s}", root / f"{baseline}-seed{s}", key, metric)
        rows.append(d)
        budgets.append(budget)
    test = crossed_test(np.array(rows))
    seed_level = paired_test([r.mean() for r in rows], [0.0] * len(rows))
    return "\n".join([
        f"{method} - {baseline}, {metric} at equal {key} "
        f"({min(budgets):,.0f}-{max(budgets):,.0f}), {len(seeds)} seeds x {len(rows[0])} problems",
        f"  per problem: {test.diff:+.4f}  95% crossed t [{test.low:+.4f}, {test.high:+.4f}]  p = {test.p_value:.4f} (df {test.df:.3g})",
        f"  per seed: {' '.join(f'{r.mean():+.4f}' for r in rows)}  (seeds {seeds})",
        f"  seed level: p = {seed_level.p_value:.4f} ({seed_level.description})",
    ])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="a sweep directory holding <method>-seed<s> runs")
    p.add_argument("--method", help="one method or a comma-separated list (default: every method in dir)")
    p.add_argument("--baseline", default="grpo")
    p.add_argument("--key", default="tokens/trained", help="the cumulative budget (default tokens/trained)")
    p.add_argument("--metric", default="eval/sample_accuracy", choices=["eval/sample_accuracy", "eval/pass@1"])
    args = p.parse_args()
    root = Path(args.dir)
    if not root.is_dir():
        raise SystemExit(f"no sweep directory {root}: pass the folder holding <method>-seed<s> runs")
    methods = args.method.split(",") if args.method else methods_in(root, args.baseline)
    for method in methods:
        print(report(root, method, args.baseline, args.key, args.metric))


if __name__ == "__main__":
    main()

"""Summarize the horizon sweep (``+sweeps=horizon``): does credit assignment matter more as chains
get longer? Results and set-up: docs/methods/horizon.md.

    python sweeps/plot_horizon.py multirun/horizon --out docs/methods/img/horizon

Reads every run under the sweep folder (``h<H>/<method>-seed<k>/``; the horizon H is the
run's ``task.max_steps``) and prints Markdown tables:

* per H and method: held-out greedy pass@1 at the start and the end (mean ± standard error over
  seeds), trained and generated tokens, SRPO/RRPO's reset at the oracle's first wrong thought,
  and the trained tokens to reach a threshold (the baseline's final mean at that H);
* per H, each method against the baseline (``grpo``) *at equal trained tokens* (each pair of
  runs compared at the last evaluation within the smaller of their trained-token totals): the
  mean per-problem difference with the crossed random-effects t-test over seeds x problems
  (:func:`creditlab.analysis.significance.crossed_test`, the test ``creditlab compare`` runs; the tables of
  docs/methods/horizon.md were made with the crossed bootstrap it replaced) and the exact
  sign-flip test over the seed means beside it.

With ``--out PREFIX`` it writes ``PREFIX_curves.png`` (pass@1 against trained and against all
generated tokens, one row per H), ``PREFIX_gaps.png`` (the differences against H with their
95% intervals) and ``PREFIX_localization.png``.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from pathlib import Path

from creditlab.analysis.problem_records import MIN_SEEDS_FOR_P, matched_steps, outcomes, read_records, value_at
from creditlab.analysis.rundirs import Run, find_runs, load_run
from creditlab.analysis.significance import crossed_test, paired_test

METRIC = "eval/pass@1"
KEY = "tokens/trained"
LOCALIZATION = "train/rollout/reset/oracle_exact"


def mean_se(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return statistics.fmean(values), se


def fmt(values: list[float], digits: int = 3) -> str:
    m, se = mean_se(values)
    return "—" if math.isnan(m) else f"{m:.{digits}f} ± {se:.{digits}f}"


def last(run: Run, key: str) -> float:
    values = [r[key] for r in run.rows if isinstance(r.get(key), (int, float))]
    return float(values[-1]) if values else math.nan


def localization(run: Run) -> float | None:
    """Mean share of the run's resets at the oracle's first wrong thought (None: not a reset method)."""
    rates = run.curve(LOCALIZATION)[1]
    return statistics.fmean(rates) if rates else None


def tokens_to(run: Run, threshold: float) -> float:
    """Trained tokens at the first evaluation reaching ``threshold`` (inf: never)."""
    xs, ys = run.curve(METRIC, KEY)
    return next((x for x, y in zip(xs, ys) if y >= threshold), math.inf)


def compare_at_equal_tokens(runs: dict[int, Run], base: dict[int, Run]) -> dict:
    """Per-problem crossed t-test and seed-level sign-flip of ``runs`` minus ``base`` at equal
    trained tokens, over the seeds both have."""
    seeds = sorted(set(runs) & set(base))
    rows, means, base_means = [], [], []
    for s in seeds:
        step, base_step, _ = matched_steps(runs[s], base[s], METRIC, KEY)
        a = outcomes(read_records(runs[s].path)[step], METRIC)
        b = outcomes(read_records(base[s].path)[base_step], METRIC)
        ids = sorted(set(a) & set(b))
        rows.append([a[i] - b[i] for i in ids])
        means.append(value_at(runs[s], METRIC, step))
        base_means.append(value_at(base[s], METRIC, base_step))
    width = min(len(r) for r in rows)
    crossed = crossed_test([r[:width] for r in rows])
    sign_flip_p = paired_test(means, base_means).p_value if len(seeds) >= 2 else math.nan
    return {"seeds": len(seeds), "crossed": crossed, "sign_flip_p": sign_flip_p}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir", type=Path)
    p.add_argument("--baseline", default="grpo")
    p.add_argument("--out", default=None, help="prefix of the plot files (none: tables only)")
    args = p.parse_args()

    runs: dict[int, dict[str, dict[int, Run]]] = defaultdict(lambda: defaultdict(dict))
    for path in find_runs([args.sweep_dir]):
        run = load_run(path)
        if run.status != "finished":
            print(f"skipping {path} ({run.status}: {run.detail})")
            continue
        runs[int(run.config["task.max_steps"])][str(run.config["method"])][int(run.seed)] = run
    if not runs:
        raise SystemExit(f"no finished runs under {args.sweep_dir}")

    print("| H | method | seeds | pass@1 start | pass@1 end | Δ | trained tokens | generated tokens "
          "| reset = first wrong thought | trained tokens to the baseline's final |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for h in sorted(runs):
        base = runs[h].get(args.baseline, {})
        threshold = statistics.fmean(last(r, METRIC) for r in base.values()) if base else math.nan
        for method, seeds in sorted(runs[h].items()):
            starts = [r.curve(METRIC)[1][0] for r in seeds.values()]
            ends = [last(r, METRIC) for r in seeds.values()]
            loc = [x for x in map(localization, seeds.values()) if x is not None]
            reach = sorted(tokens_to(r, threshold) for r in seeds.values())
            print(f"| {h} | {method} | {len(seeds)} | {fmt(starts)} | {fmt(ends)} | "
                  f"{fmt([e - s for s, e in zip(starts, ends)])} | "
                  f"{statistics.fmean(last(r, 'tokens/trained') for r in seeds.values()):,.0f} | "
                  f"{statistics.fmean(last(r, 'tokens/generated') for r in seeds.values()):,.0f} | "
                  f"{fmt(loc) if loc else '—'} | "
                  f"median {statistics.median(reach):,.0f} ({sum(math.isfinite(x) for x in reach)}/{len(reach)} reach it) |")

    print(f"\nAgainst {args.baseline} at equal trained tokens (per-problem outcomes, greedy):\n")
    print("| H | method | seeds × problems | Δ pass@1 | 95% t-interval (crossed) | p (crossed t) | p (exact sign-flip over seeds) |")
    print("|---|---|---|---|---|---|---|")
    gaps: dict[str, list[tuple[int, float, float, float]]] = defaultdict(list)
    for h in sorted(runs):
        base = runs[h].get(args.baseline)
        if not base:
            continue
        for method, seeds in sorted(runs[h].items()):
            if method == args.baseline:
                continue
            res = compare_at_equal_tokens(seeds, base)
            c = res["crossed"]
            gaps[method].append((h, c.diff, c.low, c.high))
            print(f"| {h} | {method} | {c.seeds} × {c.problems} | {c.diff:+.3f} | [{c.low:+.3f}, {c.high:+.3f}] | "
                  f"{f'{c.p_value:.4f}' if c.seeds >= MIN_SEEDS_FOR_P else '— (< 5 seeds)'} | {res['sign_flip_p']:.3f} |")

    if args.out:
        plot(runs, gaps, args.out)


def plot(runs: dict, gaps: dict, prefix: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(prefix).parent.mkdir(parents=True, exist_ok=True)

    methods = sorted({m for h in runs for m in runs[h]})
    color = {m: f"C{i}" for i, m in enumerate(methods)}
    hs = sorted(runs)
    fig, axes = plt.subplots(len(hs), 2, figsize=(11, 3.3 * len(hs)), squeeze=False)
    for row, h in enumerate(hs):
        for col, axis in enumerate(("tokens/trained", "tokens/generated")):
            ax = axes[row][col]
            for method, seeds in sorted(runs[h].items()):
                curves = [r.curve(METRIC, axis) for r in seeds.values()]
                n = min(len(c[0]) for c in curves)
                xs = [statistics.fmean(c[0][i] for c in curves) for i in range(n)]
                ys = [mean_se([c[1][i] for c in curves]) for i in range(n)]
                ax.plot(xs, [y for y, _ in ys], marker="o", ms=3, label=method, color=color[method])
                ax.fill_between(xs, [y - se for y, se in ys], [y + se for y, se in ys], alpha=0.15, color=color[method])
            ax.set_title(f"H = {h}: held-out greedy pass@1 vs {axis.split('/')[1]} tokens", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{prefix}_curves.png", dpi=100)

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (method, points) in enumerate(sorted(gaps.items())):
        xs = [h + 0.12 * (i - 1) for h, *_ in points]
        ax.errorbar(xs, [m for _, m, _, _ in points], yerr=[[m - lo for _, m, lo, _ in points], [hi - m for _, m, _, hi in points]],
                    marker="o", capsize=3, label=f"{method} − grpo", color=color[method])
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(hs)
    ax.set_xlabel("horizon H (steps per problem)")
    ax.set_ylabel("Δ held-out greedy pass@1 at equal trained tokens")
    ax.set_title("gap to GRPO, 95% crossed t-intervals", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{prefix}_gaps.png", dpi=100)

    fig, ax = plt.subplots(figsize=(6, 4))
    resetting = [m for m in methods if any(localization(r) is not None for h in hs for r in runs[h].get(m, {}).values())]
    for i, method in enumerate(resetting):
        vals = [mean_se([x for x in map(localization, runs[h].get(method, {}).values()) if x is not None]) for h in hs]
        ax.bar([x + 0.25 * (i - 1) for x in range(len(hs))], [v for v, _ in vals], width=0.25,
               yerr=[se for _, se in vals], label=method, color=color[method])
    ax.set_xticks(range(len(hs)), [f"H = {h}" for h in hs])
    ax.set_ylabel("resets at the oracle's first wrong thought")
    ax.set_title("localization during RL (oracle = 1; RRPO = random)", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    if resetting:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no reset method in the sweep", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(f"{prefix}_localization.png", dpi=100)
    print(f"\nwrote {prefix}_curves.png, {prefix}_gaps.png, {prefix}_localization.png")


if __name__ == "__main__":
    main()

"""Summarize the ``resets`` sweep: held-out accuracy against trained and generated tokens, and
localization quality against the step oracle. Reads ``<sweep dir>/<method>-seed<k>/metrics.jsonl``.

    python sweeps/plot_resets.py multirun/resets --out docs/methods/img/resets.png
    python sweeps/plot_resets.py multirun/compare_methods --methods grpo,rrpo,srpo,srpo_oracle

Prints a Markdown table (mean ± standard error over seeds) and writes a three-panel plot.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path


def load(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def mean_se(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    m = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return m, se


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("sweep_dir", type=Path)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--methods", default="", help="comma-separated methods to keep (default: every one)")
    args = p.parse_args()
    keep = {m for m in args.methods.split(",") if m}
    runs: dict[str, dict[int, list[dict]]] = defaultdict(dict)
    for d in sorted(args.sweep_dir.iterdir()):
        m = re.fullmatch(r"(.+)-seed(\d+)", d.name)
        if m and (d / "metrics.jsonl").exists() and (not keep or m.group(1) in keep):
            if not (d / "summary.json").exists():  # written when a run finishes
                print(f"skipping unfinished run {d.name}")
                continue
            runs[m.group(1)][int(m.group(2))] = load(d)
    if not runs:
        raise SystemExit(f"no <method>-seed<k>/metrics.jsonl under {args.sweep_dir}")

    def curve(rows: list[dict], x: str) -> list[tuple[float, float]]:
        out, last = [], {}
        for r in rows:
            last.update({k: v for k, v in r.items() if k.startswith(("tokens/", "step"))})
            if "eval/pass@1" in r:
                xv = 0.0 if r["step"] == 0 else last.get(x, 0.0)
                out.append((xv, r["eval/pass@1"]))
        return out

    print("| method | seeds | pass@1 start | pass@1 end | Δ (end − start) | trained tokens | generated tokens | oracle exact | early | late | clean prefix |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for method, seeds in runs.items():
        starts, ends, deltas, trained, generated = [], [], [], [], []
        loc = defaultdict(list)
        for rows in seeds.values():
            evals = [r for r in rows if "eval/pass@1" in r]
            if len(evals) < 2:
                continue
            starts.append(evals[0]["eval/pass@1"])
            ends.append(evals[-1]["eval/pass@1"])
            deltas.append(ends[-1] - starts[-1])
            train = [r for r in rows if "tokens/trained" in r]
            trained.append(train[-1]["tokens/trained"])
            generated.append(train[-1]["tokens/generated"])
            for key in ("oracle_exact", "oracle_early", "oracle_late", "clean_prefix"):
                vals = [r[f"train/rollout/reset/{key}"] for r in rows if f"train/rollout/reset/{key}" in r]
                if vals:
                    loc[key].append(statistics.fmean(vals))
        fmt = lambda v: "{:.3f} ± {:.3f}".format(*mean_se(v))  # noqa: E731
        locs = [fmt(loc[k]) if loc[k] else "—" for k in ("oracle_exact", "oracle_early", "oracle_late", "clean_prefix")]
        print(f"| {method} | {len(starts)} | {fmt(starts)} | {fmt(ends)} | {fmt(deltas)} | "
              f"{statistics.fmean(trained):,.0f} | {statistics.fmean(generated):,.0f} | " + " | ".join(locs) + " |")

    if args.out is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for i, (method, seeds) in enumerate(runs.items()):
        color = f"C{i}"
        for ax, x in zip(axes[:2], ("tokens/trained", "tokens/generated")):
            curves = [curve(rows, x) for rows in seeds.values()]
            n = min(len(c) for c in curves)
            xs = [statistics.fmean(c[i][0] for c in curves) for i in range(n)]
            ys = [mean_se([c[i][1] for c in curves]) for i in range(n)]
            ax.plot(xs, [y for y, _ in ys], marker="o", label=method, color=color)
            ax.fill_between(xs, [y - se for y, se in ys], [y + se for y, se in ys], alpha=0.15, color=color)
        steps = defaultdict(list)
        for rows in seeds.values():
            for r in rows:
                if "train/rollout/reset/oracle_exact" in r:
                    steps[r["step"]].append(r["train/rollout/reset/oracle_exact"])
        if steps:
            xs = sorted(steps)
            axes[2].plot(xs, [statistics.fmean(steps[s]) for s in xs], label=method, alpha=0.8, color=color)
    for ax, title in zip(axes, ("held-out greedy pass@1 vs trained tokens", "... vs all generated tokens", "reset at the oracle's first wrong thought (rate)")):
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_xlabel("trained tokens")
    axes[1].set_xlabel("generated tokens (seeds, localizations included)")
    axes[2].set_xlabel("RL step")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()

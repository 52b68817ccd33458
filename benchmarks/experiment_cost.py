"""The wall-clock of a whole experiment, not of one step: a run's steps with its evaluation
schedule, split into generation, update, evaluation and the rest, for several settings side by
side in one invocation (issue 54).

Each variant is one ``creditlab train`` process with the shared overrides and its own, run one
after the other on this machine (never two at once: they would share its cores). The split comes
from the run's ``metrics.jsonl``:

* generation and update: the sums of ``time/generate_s`` and ``time/update_s`` over the steps
  (generation includes scoring and the advantages);
* evaluation: the sum of ``time/eval_s`` over the evaluations (at step 0, every ``eval.every``
  steps and after the last);
* other: the process's wall-clock minus those three: start-up, model load, checkpoints, logging.

The first variant is the baseline that the others' ratios are taken against.

``--project STEPS,EVALUATIONS,ANSWERS`` also projects each variant to a longer schedule (a
preset's own, too long to measure several times): STEPS steps at the measured seconds a step
(generation and update), EVALUATIONS evaluations of ANSWERS answers each (problems x (1 +
samples)) at the measured seconds an answer, and the measured rest once. It assumes a step and an
answer cost what they did in the short run; a policy whose answers grow or shrink as it learns
drifts from it.

Usage::

    python benchmarks/experiment_cost.py experiment=smollm2_word_problems_grpo trainer.max_steps=4 eval.every=2 \\
        eval.problems=32 --variant "before=loss.skip_zero_advantage=false" --variant after=
    python benchmarks/experiment_cost.py trainer.max_steps=6 eval.every=3            # the embedded default
    python benchmarks/experiment_cost.py experiment=smollm2_word_problems_grpo trainer.max_steps=4 eval.every=4 \
        eval.problems=32 --project 60,7,1500       # projected to the preset's 60 steps, 7 x 300 x (1 + 4)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_VARIANTS = ("before=loss.skip_zero_advantage=false", "after=loss.skip_zero_advantage=true")
PARTS = ("generation", "update", "evaluation", "other")


def split(metrics: Path, wall: float) -> dict[str, float]:
    """Seconds per part of one run from its ``metrics.jsonl`` and the process's wall-clock."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    out = {
        "generation": sum(r.get("time/generate_s", 0.0) for r in rows),
        "update": sum(r.get("time/update_s", 0.0) for r in rows),
        "evaluation": sum(r.get("time/eval_s", 0.0) for r in rows),
    }
    out["other"] = wall - sum(out.values())
    out["total"] = wall
    out["steps"] = max((r["step"] for r in rows if "time/step_s" in r), default=0)
    out["evaluations"] = sum(1 for r in rows if "time/eval_s" in r)
    return out


def answers(run_dir: Path) -> int:
    """Answers per evaluation of a finished run: its problems scored (``eval/problems``) times one
    greedy answer plus ``eval.samples`` sampled ones (from its ``config.yaml``)."""
    import yaml

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    problems = next((r["eval/problems"] for r in rows if "eval/problems" in r), 0)
    samples = (yaml.safe_load((run_dir / "config.yaml").read_text()).get("eval") or {}).get("samples", 0)
    return int(problems) * (1 + int(samples or 0))


def project(row: dict[str, float], steps: int, evaluations: int, answers_each: int) -> dict[str, float]:
    """One variant's measured split scaled to ``steps`` steps and ``evaluations`` evaluations of
    ``answers_each`` answers; ``row`` holds the measured split and ``answers`` (per evaluation)."""
    per_step = {p: row[p] / row["steps"] for p in ("generation", "update")} if row["steps"] else {}
    measured = row["evaluations"] * row["answers"]
    out = {p: steps * per_step.get(p, 0.0) for p in ("generation", "update")}
    out["evaluation"] = evaluations * answers_each * (row["evaluation"] / measured if measured else 0.0)
    out["other"] = row["other"]
    out["total"] = sum(out[p] for p in PARTS)
    return out


def parse_schedule(text: str) -> tuple[int, int, int]:
    """``STEPS,EVALUATIONS,ANSWERS`` of ``--project``."""
    try:
        steps, evaluations, answers_each = (int(x) for x in text.split(","))
    except ValueError:
        sys.exit(f"--project {text!r}: expected STEPS,EVALUATIONS,ANSWERS as three integers (e.g. 60,7,1500)")
    if min(steps, evaluations, answers_each) < 0:
        sys.exit(f"--project {text!r}: the three numbers must be >= 0")
    return steps, evaluations, answers_each


def table(rows: dict[str, dict[str, float]], base: str, title: str) -> None:
    """Print the rows with each total's speed-up over ``base``'s."""
    print(title)
    print(f"{'variant':>10} " + " ".join(f"{p + ' s':>13}" for p in PARTS) + f" {'total s':>9} {'speed-up':>8}")
    for name, r in rows.items():
        print(f"{name:>10} " + " ".join(f"{r[p]:>13.1f}" for p in PARTS)
              + f" {r['total']:>9.1f} {rows[base]['total'] / r['total']:>7.2f}x")


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``NAME=override,override`` (``NAME=`` alone: the shared overrides only)."""
    name, sep, rest = text.partition("=")
    if not sep or not name:
        sys.exit(f"--variant {text!r}: expected NAME=OVERRIDE[,OVERRIDE...] (e.g. before=loss.skip_zero_advantage=false)")
    return name, [o for o in rest.split(",") if o]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", help="NAME=OVERRIDE[,OVERRIDE...]; the first is the baseline "
                    f"(default: {' and '.join(DEFAULT_VARIANTS)})")
    ap.add_argument("--project", help="STEPS,EVALUATIONS,ANSWERS: also project each variant to this schedule "
                    "(answers per evaluation: problems x (1 + samples))")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("overrides", nargs="*", help="run-config overrides every variant shares")
    args = ap.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant or DEFAULT_VARIANTS]
    schedule = parse_schedule(args.project) if args.project else None
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="experiment_cost_") as tmp:
        for name, extra in variants:
            run_dir = Path(tmp) / name
            cmd = [sys.executable, "-m", "creditlab.cli", "train", "logger=none", *args.overrides, *extra,
                   f"run_dir={run_dir}"]
            t0 = time.perf_counter()
            done = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if done.returncode != 0:
                sys.exit(f"variant {name} failed ({' '.join(cmd)}):\n{done.stderr[-3000:]}")
            rows[name] = {**split(run_dir / "metrics.jsonl", wall), "answers": answers(run_dir)}
            print(f"[{name}] {wall:.1f} s", flush=True)
    base = variants[0][0]
    print(f"shared overrides: {' '.join(args.overrides) or '(none)'}")
    first = rows[base]
    table(rows, base, f"measured: {first['steps']:.0f} steps, {first['evaluations']:.0f} evaluations of "
          f"{first['answers']:.0f} answers")
    projected = None
    if schedule is not None:
        projected = {name: project(r, *schedule) for name, r in rows.items()}
        table(projected, base, f"projected: {schedule[0]} steps, {schedule[1]} evaluations of {schedule[2]} answers "
              "(the measured seconds a step and an answer, the measured rest once)")
    if args.json:
        Path(args.json).write_text(json.dumps({"overrides": args.overrides, "variants": dict(variants), "rows": rows,
                                               "project": schedule, "projected": projected}, indent=2))


if __name__ == "__main__":
    main()

"""Step time of reset-based and Monte-Carlo methods against GRPO, at equal trained completions.

Every method trains on ``prompts_per_step x group_size`` completions per step (8 x 8 by default)
of the embedded task (arith + the tiny warm-started model, CPU), so their step times compare the
extra work each does: SRPO/RRPO draw seeds, localize (SRPO) and continue suffixes; VinePPO-style
Monte-Carlo values sample ``advantage.rollouts`` continuations per thought boundary.

Methods run one after another in this process, interleaved over ``--rounds`` (round r runs every
method once with seed r), so a change in machine load hits all of them alike. Each run is a real
``creditlab train`` (no logger, no evaluation, no checkpoints); the first ``--warmup`` steps of
each run are dropped and ``time/step_s`` of the others is collected. Prints, per method, the
median step, generation and update times, the tokens generated, prefilled (the HF backend's
``train/backend/prefill_tokens``: context tokens run through a prefill) and trained per step, and
the ratio of median step times to GRPO's.

Usage::

    python benchmarks/resets_step_time.py                        # grpo, rrpo, srpo, vineppo
    python benchmarks/resets_step_time.py --methods grpo,srpo --steps 8 --rounds 3 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path


def run_one(method: str, seed: int, steps: int, threads: int, out: Path, extra: list[str]) -> list[dict]:
    from creditlab.run.compose import compose
    from creditlab.run.launch import run
    from creditlab.run.loggers import read_metrics

    overrides = [
        f"method={method}", f"seed={seed}", f"trainer.max_steps={steps}", "eval.every=0", "prompts_per_step=8",
        "logger=none", "checkpoint_every=0", f"threads={threads}", f"run_dir={out}", "resume=null",
        *extra,
    ]
    run(compose(overrides), out)
    return [r for r in read_metrics(out / "metrics.jsonl") if "time/step_s" in r]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--methods", default="grpo,rrpo,srpo,vineppo")
    p.add_argument("--steps", type=int, default=6, help="RL steps per run")
    p.add_argument("--warmup", type=int, default=1, help="steps dropped at the start of each run")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="write the per-step rows here")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    methods = args.methods.split(",")
    rows: dict[str, list[dict]] = {m: [] for m in methods}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for m in methods:
                got = run_one(m, r, args.steps, args.threads, Path(tmp) / f"{m}-{r}", args.overrides)
                rows[m] += got[args.warmup :]
                print(f"[round {r}] {m}: {len(got)} steps", file=sys.stderr)

    def med(m: str, key: str) -> float:
        values = [row[key] for row in rows[m] if key in row]
        return statistics.median(values) if values else float("nan")

    base = med(methods[0], "time/step_s")
    print(f"\nmedian over {args.rounds} rounds x {args.steps - args.warmup} steps, "
          f"threads={args.threads}, baseline {methods[0]}")
    print(f"{'method':<14}{'step s':>8}{'gen s':>8}{'update s':>10}{'gen tok':>9}{'prefill tok':>13}"
          f"{'trained tok':>13}{'ratio':>7}")
    for m in methods:
        step = med(m, "time/step_s")
        trained = statistics.median(
            b["tokens/trained"] - a["tokens/trained"] for a, b in zip(rows[m], rows[m][1:])
        ) if len(rows[m]) > 1 else float("nan")
        print(f"{m:<14}{step:>8.2f}{med(m, 'time/generate_s'):>8.2f}{med(m, 'time/update_s'):>10.2f}"
              f"{med(m, 'train/tokens_generated'):>9.0f}{med(m, 'train/backend/prefill_tokens'):>13.0f}"
              f"{trained:>13.0f}{step / base:>7.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

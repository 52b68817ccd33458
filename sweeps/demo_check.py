"""Does the demo learn on every stand-in for another CPU? (README "Set-up", docs/reproducing.md)

    python sweeps/demo_check.py                      # or: make demo-check
    python sweeps/demo_check.py --only "seed 0,seed 0 AVX2" --min-gain 0.05 trainer.max_steps=100

Runs the demo (``creditlab train`` with the default config plus any overrides given) once per
stand-in, one at a time, each in its own process: recipe seeds 0, 1 and 2 of the warm start, and
seed 0 with torch's, oneDNN's and MKL's kernels restricted to AVX2 (as on a CPU without AVX-512).
The AVX2 stand-in builds its warm start in a cache of its own (``<cache>/isa-avx2``: the cache key
does not see the instruction set), and its run must record that torch used AVX2 kernels. Prints
each stand-in's held-out greedy pass@1 before and after RL and exits with status 1 when a gain
is below ``--min-gain`` (or a run failed). Run it after a lock refresh (``locks/README.md``):
about 5 minutes per stand-in on 2 cores when its warm start is not cached yet.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


@dataclass(frozen=True)
class StandIn:
    """One stand-in for another machine: extra overrides and environment for the demo's run."""

    name: str
    overrides: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return self.name.replace(" ", "_").lower()


STANDINS = (
    StandIn("seed 0"),
    StandIn("seed 1", ("+model.recipe_args={seed: 1}",)),
    StandIn("seed 2", ("+model.recipe_args={seed: 2}",)),
    StandIn("seed 0 AVX2", (), AVX2),
)


def cache_root() -> Path:
    """The model cache the demo uses (``$CREDITLAB_CACHE`` or ``~/.cache/creditlab``)."""
    return Path(os.environ.get("CREDITLAB_CACHE") or Path.home() / ".cache" / "creditlab")


def run_env(standin: StandIn, base: dict[str, str]) -> dict[str, str]:
    """The environment of ``standin``'s run: ``base`` plus its variables; an ISA-restricted
    stand-in gets its own model cache under the usual one."""
    env = {**base, "HF_HUB_OFFLINE": "1", **standin.env}
    if standin.env:
        env["CREDITLAB_CACHE"] = str(cache_root() / f"isa-{standin.env['ATEN_CPU_CAPABILITY']}")
    return env


def summarize(run_dir: Path, standin: StandIn) -> dict[str, object]:
    """Start, end and gain of held-out greedy pass@1 of a finished run, and the kernels it used.

    Raises:
        ValueError: The run has fewer than two evaluations, or an ISA-restricted stand-in's run
            did not record the restricted kernels (the variables did not take effect).
    """
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if "eval/pass@1" in r]
    if len(evals) < 2:
        raise ValueError(f"{run_dir}: {len(evals)} evaluation(s) in metrics.jsonl; need the first and the last")
    capability = json.loads((run_dir / "environment.json").read_text()).get("cpu", {}).get("torch_capability")
    want = standin.env.get("ATEN_CPU_CAPABILITY")
    if want and str(capability).lower() != want.lower():
        raise ValueError(f"{standin.name}: torch used {capability} kernels, not {want}: the restriction did not take effect")
    start, end = evals[0]["eval/pass@1"], evals[-1]["eval/pass@1"]
    return {"stand-in": standin.name, "start": start, "end": end, "gain": end - start,
            "steps": evals[-1]["step"], "kernels": capability}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="Hydra overrides added to every run")
    p.add_argument("--out", type=Path, default=Path("runs/demo_check"), help="run folders (default runs/demo_check)")
    p.add_argument("--min-gain", type=float, default=0.05, help="fail below this gain (default 0.05)")
    p.add_argument("--only", default="", help="comma-separated stand-in names (default: all)")
    args = p.parse_args(argv)
    chosen = [s for s in STANDINS if not args.only or s.name in args.only.split(",")]
    if not chosen:
        p.error(f"--only names no stand-in; choose from: {', '.join(s.name for s in STANDINS)}")
    results, failed = [], False
    for standin in chosen:
        run_dir = args.out / standin.slug
        cmd = [sys.executable, "-m", "creditlab.cli", "train", f"run_dir={run_dir}", "logger=none",
               *standin.overrides, *args.overrides]
        print(f"[demo-check] {standin.name}: {' '.join(cmd[3:])}", flush=True)
        began = time.time()
        done = subprocess.run(cmd, env=run_env(standin, dict(os.environ)))
        if done.returncode != 0:
            print(f"[demo-check] {standin.name}: the run failed (status {done.returncode})")
            failed = True
            continue
        row = summarize(run_dir, standin)
        row["seconds"] = round(time.time() - began)
        results.append(row)
        failed |= row["gain"] < args.min_gain
    print(f"\n| stand-in | kernels | start | end | gain | RL steps | seconds |\n|---|---|---|---|---|---|---|")
    for r in results:
        mark = "" if r["gain"] >= args.min_gain else f" (below {args.min_gain})"
        print(f"| {r['stand-in']} | {r['kernels']} | {r['start']:.3f} | {r['end']:.3f} | "
              f"{r['gain']:+.3f}{mark} | {r['steps']} | {r['seconds']} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "demo_check.json").write_text(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

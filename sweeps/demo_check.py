"""Does the demo learn on every stand-in for another machine? (README "Set-up", docs/reproducing.md)

    python sweeps/demo_check.py                      # or: make demo-check
    python sweeps/demo_check.py --only "RL seed 0,AVX2 kernels" --min-gain 0.05 trainer.max_steps=100

Runs the demo (``creditlab train`` with the default config plus any overrides given) once per
stand-in, one at a time, each in its own process. Every stand-in starts from the same shipped warm
start (the same bytes on every machine, ``creditlab_arith.shipped``); what varies is what another
machine or user would vary: the RL seed (0, 1, 2), and torch's, oneDNN's and MKL's kernels
restricted to AVX2 (as on a CPU without AVX-512) or to torch's baseline (``default``, SSE4). A
restricted stand-in's run must record that torch used those kernels. Each stand-in's headline
(:mod:`creditlab.analysis.headline`: held-out sampled accuracy, the mean of the last 5 evaluations minus
step 0, with its 95% interval over problems) is printed, and the check exits with status 1 when a
gain is below ``--min-gain`` or its interval reaches 0 (or a run failed). Run it after a lock
refresh (``locks/README.md``): about 5 minutes per stand-in on 2 cores.
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

from creditlab.run.environment import CPU_ISA_ENV

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
BASELINE = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}


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
    StandIn("RL seed 0"),
    StandIn("RL seed 1", ("seed=1",)),
    StandIn("RL seed 2", ("seed=2",)),
    StandIn("AVX2 kernels", (), AVX2),
    StandIn("default kernels", (), BASELINE),
)


def run_env(standin: StandIn, base: dict[str, str]) -> dict[str, str]:
    """The environment of ``standin``'s run: ``base`` without any kernel restriction it carries
    (an ``ATEN_CPU_CAPABILITY`` exported in the shell would otherwise run the "RL seed" stand-ins,
    meant for this CPU's own kernels, on restricted ones, and label them so), plus the stand-in's
    own variables, offline."""
    inherited = {k: v for k, v in base.items() if k not in CPU_ISA_ENV}
    return {**inherited, "HF_HUB_OFFLINE": "1", **standin.env}


def summarize(run_dir: Path, standin: StandIn) -> dict[str, object]:
    """The headline of a finished run (``summary.json``), its last greedy pass@1 and its kernels.

    Raises:
        ValueError: The run wrote no headline (fewer than two evaluations), or a restricted
            stand-in's run did not record the restricted kernels (the variables did not take effect).
    """
    summary = json.loads((run_dir / "summary.json").read_text())
    if "headline" not in summary:
        raise ValueError(f"{run_dir}: no headline in summary.json; the run needs its step-0 evaluation and a later one")
    capability = json.loads((run_dir / "environment.json").read_text()).get("cpu", {}).get("torch_capability")
    want = standin.env.get("ATEN_CPU_CAPABILITY")
    if want and str(capability).lower() != want.lower():
        raise ValueError(f"{standin.name}: torch used {capability} kernels, not {want}: the restriction did not take effect")
    h = summary["headline"]
    return {"stand-in": standin.name, "start": h["start"], "end": h["end"], "gain": h["gain"],
            "low": h["ci95"][0], "high": h["ci95"][1], "steps": h["steps"], "kernels": capability,
            "greedy": [summary.get("eval_pass@1_first"), summary.get("eval_pass@1_last")]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="Hydra overrides added to every run")
    p.add_argument("--out", type=Path, default=Path("runs/demo_check"), help="run folders (default runs/demo_check)")
    p.add_argument("--min-gain", type=float, default=0.05,
                   help="fail below this headline gain, or when its interval reaches 0 (default 0.05)")
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
        failed |= row["gain"] < args.min_gain or row["low"] <= 0
    print("\n| stand-in | kernels | sampled accuracy: step 0 | mean of the last evaluations | gain [95% CI] | "
          "greedy pass@1: step 0 -> last | seconds |\n|---|---|---|---|---|---|---|")
    for r in results:
        bad = r["gain"] < args.min_gain or r["low"] <= 0
        mark = f" (below {args.min_gain} or interval reaches 0)" if bad else ""
        g0, g1 = r["greedy"]
        greedy = f"{g0:.3f} -> {g1:.3f}" if g0 is not None and g1 is not None else "-"
        print(f"| {r['stand-in']} | {r['kernels']} | {r['start']:.3f} | {r['end']:.3f} | "
              f"{r['gain']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}]{mark} | {greedy} | {r['seconds']} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "demo_check.json").write_text(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

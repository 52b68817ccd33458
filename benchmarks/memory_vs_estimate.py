"""creditlab.run.memory's estimate against the memory a short run really takes, on the CPU.

    .venv/bin/python benchmarks/memory_vs_estimate.py [--json OUT] [--steps 2] OVERRIDE...

Runs ``creditlab train`` in a fresh process (``trainer.max_steps=2 eval.every=0 logger=none
threads=1`` before the given overrides) and samples its resident set size (RSS) every 2 ms. The
baseline is the RSS after every import and the config, before the model loads (the runtime:
Python, torch, Lightning, transformers); every figure is RSS growth above it. Phases are marked by
wrapping the model loader and the module's step: ``load`` (model, tokenizer, parts), per step
``generation`` (the rollouts), ``estimate`` (collate, segment, advantages) and ``update``, and
``checkpoint`` (``Trainer.save_checkpoint``; the last one is at the end of the run). glibc
keeps freed memory in its heap, so RSS never falls by itself: ``malloc_trim(0)`` at every phase
start returns it, and a phase's peak is then its own. Step 2 is the steady state (the optimizer's
state exists); step 1 has none yet. Prints a table of estimate vs. measured (docs/gpu.md, "Memory
before the model loads"). One run at a time: it measures the whole process.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

FIXED = ["trainer.max_steps=2", "eval.every=0", "logger=none", "threads=1", "checkpoint_every=100"]
PAGE = os.sysconf("SC_PAGE_SIZE")
GIB = 2**30


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def child(overrides: list[str], out: str) -> None:
    """Run the configured training here, writing the per-phase RSS peaks to ``out`` (JSON)."""
    import creditlab.step.module as module_mod
    import creditlab.run.runner as runner
    from creditlab.run.compose import compose
    from creditlab.run.launch import run

    trim = ctypes.CDLL("libc.so.6").malloc_trim
    cfg = compose(overrides)
    trim(0)
    base = rss()
    peaks: dict[str, int] = {}
    state = {"phase": "setup", "step": 0, "stop": False}

    def mark(phase: str) -> None:
        trim(0)
        state["phase"] = phase

    def sample() -> None:
        while not state["stop"]:
            key = state["phase"]
            peaks[key] = max(peaks.get(key, 0), rss())
            time.sleep(0.002)

    def wrap(owner, name, before, after=None):
        inner = getattr(owner, name)

        def wrapped(*args, **kwargs):
            before()
            try:
                return inner(*args, **kwargs)
            finally:
                if after:
                    after()
        setattr(owner, name, wrapped)

    loaded = {}

    def after_load():
        trim(0)
        loaded["rss"] = rss()
        mark("loaded")

    def step_start():
        state["step"] += 1
        mark(f"step{state['step']}:generation")

    import lightning

    wrap(runner, "load_policy", lambda: mark("load"), after_load)
    wrap(lightning.Trainer, "save_checkpoint", lambda: mark("checkpoint"), lambda: mark("after checkpoint"))
    wrap(module_mod.CreditAssignmentModule, "training_step", step_start, lambda: mark("between steps"))
    wrap(module_mod, "collate", lambda: mark(f"step{state['step']}:estimate"))
    wrap(module_mod.CreditAssignmentModule, "update", lambda: mark(f"step{state['step']}:update"))
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    with tempfile.TemporaryDirectory() as run_dir:
        run(cfg, run_dir)
    state["stop"] = True
    thread.join()
    result = {"base": base, "loaded": loaded.get("rss", 0) - base, "maxrss": resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss * 1024 - base, "phases": {k: v - base for k, v in peaks.items()}}
    Path(out).write_text(json.dumps(result, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None, help="write estimate and measurement here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    overrides = FIXED + args.overrides
    if args.child:
        return child(overrides, args.child)

    from creditlab.run.compose import compose
    from creditlab.run.config import validate
    from creditlab.run.memory import plan_run

    cfg = compose(overrides)
    plan, resolved = plan_run(cfg, validate(cfg))
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        subprocess.run([sys.executable, __file__, "--child", f.name, *args.overrides], check=True, env=env)
        measured = json.loads(Path(f.name).read_text())
    phases = measured["phases"]
    est = {k: v / GIB for k, v in plan.phases.items()}
    no_state = plan.parts["optimizer"] / GIB
    rows = [
        ("step 1 generation (no optimizer state yet)", est["generation"] - no_state,
         phases.get("step1:generation", 0) / GIB),
        ("step 2 generation", est["generation"], phases.get("step2:generation", 0) / GIB),
        ("step 2 update", est["update"], phases.get("step2:update", 0) / GIB),
        ("checkpoint (the last)", est.get("checkpoint", 0), phases.get("checkpoint", 0) / GIB),
        ("peak of the whole run (ru_maxrss)", max(est.values()), measured["maxrss"] / GIB),
    ]
    print(f"runtime baseline: {measured['base'] / GIB:.3f} GiB; after the model loaded: +{measured['loaded'] / GIB:.3f}"
          f" GiB; phases: { {k: round(v / GIB, 3) for k, v in phases.items()} }")
    print("\n".join(f"{k}: {v}" for k, v in resolved))
    print("| | estimate (GiB) | measured RSS growth (GiB) | measured / estimate |\n|---|---|---|---|")
    for name, e, m in rows:
        ratio = f"{m / e:.2f}" if e else ""
        print(f"| {name} | {'' if e is None else f'{e:.3f}'} | {m:.3f} | {ratio} |")
    print({k: f"{v / GIB:.3f}" for k, v in plan.parts.items()})
    if args.json:
        Path(args.json).write_text(json.dumps({"overrides": overrides, "parts": plan.parts, "phases": plan.phases,
                                               "measured": measured}, indent=2))


if __name__ == "__main__":
    main()

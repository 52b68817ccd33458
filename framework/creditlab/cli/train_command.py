"""``creditlab train [overrides] [-m]``: check the overrides (:mod:`creditlab.cli.overrides`),
then hand over to Hydra, which runs one job or a multirun sweep; ``--dry-run`` prints the resolved
parts and the memory estimate instead, ``--plan`` each run's predicted wall-clock
(:mod:`creditlab.run.cost_plan`). The training stack (:mod:`creditlab.run.hydra_main`) is
imported when the command runs (see :mod:`creditlab.cli`)."""

from __future__ import annotations

import shlex
import signal
import sys
from typing import Any

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console
from rich.table import Table

from creditlab.cli.overrides import check
from creditlab.errors import ConfigError, InputError, RegistryError, exit_with
from creditlab.run.compose import searchpath_override, split_searchpath
from creditlab.run.config import validate
from creditlab.run.cost_plan import Plan, evaluations, plan
from creditlab.run.memory import GIB, plan_run
from creditlab.run.parallel import JOB_LOG, SweepStopped, check_memory, prepare_models, run_jobs, sweep_jobs, thread_count
from creditlab.run.rundir_guard import RunDirError, check_run_dir

HYDRA_FLAGS_WITH_VALUE = {
    "--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd", "--cfg", "-c",
    "--package", "-p", "--experimental-rerun",
}
INFO_VALUES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def dry_run(cfg: Any, prompt_tokens: int | None, memory_gib: float | None = None) -> None:
    """Print what ``cfg`` resolves to and its memory estimate (:mod:`creditlab.run.memory`), with
    ``loss.micro_batch_tokens=auto`` sized for ``memory_gib`` (else this machine's memory for the
    config's accelerator); no model is loaded and nothing is written."""
    memory = None if memory_gib is None else (int(memory_gib * GIB), "--memory-gib")
    try:
        plan, resolved = plan_run(cfg, validate(cfg), prompt_tokens, memory)
    except (ConfigError, RegistryError) as exc:
        exit_with(str(exc))
    console = Console(width=120)
    facts = Table(title="creditlab train --dry-run", show_header=False)
    for key, value in resolved:
        facts.add_row(key, value)
    table = Table(title="memory estimate per device (docs/gpu.md: Memory before the model loads)")
    for col in ("component", "GiB", "counted in"):
        table.add_column(col, justify="right" if col == "GiB" else "left")
    for name, value in plan.parts.items():
        phases = [p for p, parts in plan.phase_parts.items() if name in parts and p in plan.phases]
        table.add_row(name, f"{value / GIB:.3f}", ", ".join(phases) or "host memory (see the note)")
    for name, value in plan.phases.items():
        table.add_row(f"[bold]{name}[/bold]", f"[bold]{value / GIB:.3f}[/bold]", "phase total")
    console.print(facts, table)
    for note in plan.notes:
        console.print(f"note: {note}")
    phase, peak = plan.peak
    console.print(f"[bold]peak: {peak / GIB:.2f} GiB in {phase}[/bold] (the runtime: Python, torch, a CUDA context, "
                  "is not counted)")


def clock(seconds: float) -> str:
    """``1 h 02 min``, ``3 min 05 s`` or ``42 s``."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def print_plan(result: Plan) -> None:
    """Each job's predicted wall-clock, the calibrations it came from, and the total."""
    console = Console(width=140)
    jobs = [j.overrides for j in result.jobs]
    varying = [i for i in range(max(map(len, jobs))) if len({o[i] if i < len(o) else "" for o in jobs}) > 1]
    label = (lambda o: " ".join(o[i] for i in varying if i < len(o)) or " ".join(o) or "(defaults)")
    table = Table(title="creditlab train --plan: predicted wall-clock per run, calibrated on this machine")
    for col in ("run", "steps", "evaluations", "predicted"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for job, seconds in zip(result.jobs, result.seconds):
        evals = evaluations(job.max_steps, job.eval_every)
        done = f" ({job.done_steps} done)" if job.done_steps else ""
        table.add_row(label(job.overrides), f"{job.max_steps}{done}", str(evals),
                      f"finished: reloads, {clock(seconds)}" if job.finished else clock(seconds))
    cal = Table(title="calibrations (one short run per configuration, seeds aside; seconds)")
    for col in ("configuration", "steps run", "first step", "step (mean)", "evaluation", "set-up", "wall"):
        cal.add_column(col, justify="left" if col == "configuration" else "right")
    for job, c in result.calibrations.values():
        cal.add_row(label(job.overrides), str(c.steps), f"{c.first_s:.2f}", f"{c.step_s:.2f}", f"{c.eval_s:.2f}",
                    f"{c.setup_s:.2f}", f"{c.wall_s:.1f}")
    console.print(table, cal)
    todo = sum(not j.finished for j in result.jobs)
    console.print(f"[bold]predicted: {clock(result.total_s)} for {todo} run(s) to train[/bold] ({len(result.jobs) - todo} "
                  f"already finished; start-up and imports {result.import_s:.1f} s once), one run at a time on this "
                  "machine. It assumes every step costs what the calibration's did, and leaves out checkpoints after "
                  "the first and W&B (creditlab.run.cost_plan).")


def parallel_sweep(overrides: list[str], jobs: int) -> None:
    """``-m ... --jobs N``: the sweep's jobs as separate processes, at most ``N`` at a time
    (:mod:`creditlab.run.parallel`), after its thread and memory checks; every error one line."""
    launcher = [o for o in overrides if o.lstrip("+~").startswith("hydra/launcher=") and not o.endswith("=basic")]
    if launcher:
        exit_with(f"--jobs runs the sweep's jobs on this machine; {launcher[0]} runs them elsewhere. Give one of the two.")
    say = (lambda line: print(line, flush=True))
    todo: list[Any] = []
    try:
        todo = sweep_jobs(overrides)
        jobs = min(jobs, len(todo))  # fewer jobs than slots: the cores and memory go to the jobs there are
        threads = thread_count(overrides, jobs)
        notes = check_memory(todo, jobs)
        say(f"creditlab: {len(todo)} runs, at most {jobs} at a time, {threads} thread(s) each; memory: " + "; ".join(notes))
        prepare_models(todo, threads, say=say)
        failed = run_jobs(todo, jobs, threads, say=say)
    except (ConfigError, RegistryError, InputError, HydraException, OmegaConfBaseException, OSError) as exc:
        exit_with(str(exc) if str(exc).startswith("--jobs") else f"--jobs: {exc}")
    except (KeyboardInterrupt, SweepStopped) as exc:
        signum = exc.signum if isinstance(exc, SweepStopped) else signal.SIGINT
        again = resume_line(overrides, todo, jobs) if todo else "the same command"
        print(f"creditlab: {str(exc) or 'interrupted (Ctrl-C)'}\n  resume with: {again}", file=sys.stderr)
        sys.exit(128 + signum)
    if failed:
        print("creditlab: error: failed: " + ", ".join(f"{j.folder} (log: {j.folder / JOB_LOG})" for j in failed)
              + f"\n  after fixing it, resume with: {resume_line(overrides, todo, jobs)}", file=sys.stderr)
        sys.exit(1)


def resume_line(overrides: list[str], todo: list[Any], jobs: int) -> str:
    """The command that resumes this sweep: its overrides with the sweep folder pinned (a folder
    named by the time would be a new one)."""
    kept = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] != "hydra.sweep.dir"]
    return shlex.join(["creditlab", "train", "-m", *kept, f"hydra.sweep.dir={todo[0].sweep}", "--jobs", str(jobs)])


def _jobs_flag(argv: list[str]) -> tuple[int | None, list[str]]:
    """``--jobs N`` (or ``--jobs=N``) taken out of ``argv``."""
    for i, arg in enumerate(argv):
        if arg == "--jobs" or arg.startswith("--jobs="):
            value = arg.partition("=")[2] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            if not value.isdigit() or int(value) < 1:
                exit_with(f"--jobs {value or '(missing)'}: give the number of runs at once, an integer >= 1 "
                          "(e.g. --jobs 2 on 2 cores: each run gets one thread).")
            return int(value), argv[:i] + argv[i + (1 if "=" in arg else 2) :]
    return None, argv


def train(argv: list[str]) -> None:
    """Check the overrides, then run Hydra's main (one job, or a sweep with ``-m``); with
    ``--dry-run [--prompt-tokens N] [--memory-gib M]``, print the resolved parts and the memory
    estimate instead."""
    dry = "--dry-run" in argv
    tokens, memory = None, None
    if "--prompt-tokens" in argv:
        i = argv.index("--prompt-tokens")
        value = argv[i + 1] if i + 1 < len(argv) else ""
        if not dry or not value.isdigit():
            exit_with("--prompt-tokens N (the longest prompt in tokens, an integer) goes with --dry-run")
        tokens, argv = int(value), argv[:i] + argv[i + 2 :]
    if "--memory-gib" in argv:
        i = argv.index("--memory-gib")
        value = argv[i + 1] if i + 1 < len(argv) else ""
        if not dry or not value.replace(".", "", 1).isdigit() or not float(value) > 0:
            exit_with("--memory-gib M (the device's memory in GiB that auto sizes for, a number > 0, e.g. 24) "
                      "goes with --dry-run")
        memory, argv = float(value), argv[:i] + argv[i + 2 :]
    steps = None
    for i, arg in enumerate(argv):
        if arg == "--calibrate-steps" or arg.startswith("--calibrate-steps="):
            value = arg.partition("=")[2] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            if "--plan" not in argv or not value.isdigit() or int(value) < 2:
                exit_with("--calibrate-steps N (steps of each calibration run, an integer >= 2, e.g. 4) goes with --plan")
            steps, argv = int(value), argv[:i] + argv[i + (1 if "=" in arg else 2) :]
            break
    jobs, argv = _jobs_flag(argv)
    if jobs is not None and not {"-m", "--multirun"} & set(argv):
        exit_with("--jobs N runs a sweep's jobs side by side; it goes with -m (e.g. creditlab train -m seed=0,1 --jobs 2).")
    if jobs is not None and ("--plan" in argv or dry):
        exit_with("--jobs runs the sweep; --plan and --dry-run only look at it. Give them without --jobs "
                  "(--plan predicts one run at a time).")
    planning = "--plan" in argv
    if planning and dry:
        exit_with("--plan and --dry-run are separate: --dry-run prints the memory estimate without running "
                  "anything, --plan runs a short calibration and predicts the wall-clock. Give one.")
    other = [a for a in argv if a.split("=")[0] in (*HYDRA_FLAGS_WITH_VALUE, "--info", "-i", "--help", "-h",
                                                     "--hydra-help")]
    if planning and other:
        exit_with(f"--plan plans creditlab's own config with key=value overrides; {other[0]} is not "
                  "supported with it.")
    if jobs is not None and other:
        exit_with(f"--jobs launches creditlab's own config with key=value overrides; {other[0]} is not "
                  "supported with it.")
    argv = [a for a in argv if a not in ("--dry-run", "--plan")]
    overrides, skip, first = [], False, None
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in HYDRA_FLAGS_WITH_VALUE or arg in ("--info", "-i") and i + 1 < len(argv) and argv[i + 1] in INFO_VALUES:
            skip = True
        elif not arg.startswith("-"):
            overrides.append(arg)
            first = i if first is None else first
    if not any(a in ("--help", "-h", "--cfg", "-c", "--info", "-i", "--hydra-help") for a in argv):
        cfg = check(overrides, machine=not dry)  # a dry run may plan for another machine
        if dry:  # the first combination of a sweep
            return dry_run(cfg, tokens, memory)
        if planning:
            try:
                return print_plan(plan(overrides, bool({"-m", "--multirun"} & set(argv)), steps or 4))
            except (ConfigError, HydraException, OmegaConfBaseException, OSError) as exc:
                exit_with(f"--plan: {exc}")
        if jobs is not None:
            return parallel_sweep(overrides, jobs)
        if not {"-m", "--multirun"} & set(argv):  # before Hydra creates the folder and its log
            try:
                check_run_dir(cfg.run_dir)
            except RunDirError as exc:
                exit_with(str(exc))
    from creditlab.run.hydra_main import main as hydra_main  # the training stack (see the module doc)

    # Hydra's argparse wants the overrides in one run: the search path joins the user's overrides
    # (a user's own hydra.searchpath is merged into it, not left to replace it).
    at = first if first is not None else len(argv)
    user, rest = split_searchpath(argv[at:])
    sys.argv = ["creditlab train", *argv[:at], *searchpath_override(user), *rest]
    hydra_main()

"""A sweep's runs side by side on one machine (issue 54): ``creditlab train -m ... --jobs N``.

Hydra's basic launcher runs a sweep's jobs one after another in one process. On a small CPU a
run does not keep every core busy (generation is a chain of small matrix products), and two runs
of one thread each finished more runs an hour than one run of two threads (``docs/sweeps.md``,
"Two runs at once"). ``--jobs N`` therefore starts each job of the sweep as its own
``creditlab train`` process, at most ``N`` at a time, in Hydra's order:

* **the same runs**: every job gets the overrides Hydra's basic sweeper would give it
  (:func:`creditlab.run.cost_plan.job_overrides`) and the folder it would run in
  (``hydra.sweep.dir/hydra.sweep.subdir``, the sweep folder resolved once), as its ``run_dir``; a
  run's randomness is a function of (seed, step, stream), so a job's ``metrics.jsonl`` is the one
  the basic launcher writes at the same thread count (``tests/integration/test_parallel_sweep.py``);
  the command run again resumes every unfinished run, as a sweep does;
* **the cores shared**: each job gets ``threads = cores // N`` unless the command sets
  ``threads`` (then ``threads * N`` may not exceed the cores), and ``OMP_WAIT_POLICY=PASSIVE``
  (an idle OpenMP thread sleeps instead of spinning on a core another run needs);
* **the memory shared**, checked before anything starts: each configuration's memory plan
  (:func:`creditlab.run.memory.plan_run`, as ``--dry-run`` prints it) is made for ``1/N`` of this
  machine's memory and must fit the usable part of that share; the runs then size
  ``loss.micro_batch_tokens=auto`` for the same share (:data:`SHARE_ENV`,
  :func:`creditlab.run.memory_budget.available_memory`);
* **each model built once**: a recipe model (a warm start) the jobs use is built in this process
  before they start (:func:`prepare_models`), not by N jobs at once;
* **one log a job**: its output goes to ``<run folder>/job.log``; a line is printed as each job
  starts and ends, and each job that ends adds a line to ``<sweep folder>/jobs.jsonl`` with its
  exit status, wall-clock and peak resident memory (``os.wait4``: the largest of the job's
  process and its children; a child starts from this process's pages, so a peak below this
  launcher's own size reads as that size). The first failure starts no new job; the running ones finish, and the command
  exits 1 naming each failed job and its log.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from creditlab.errors import ConfigError
from creditlab.run.compose import compose
from creditlab.run.config import validate
from creditlab.run.layout import cpu_cores
from creditlab.run.cost_plan import compose_with_hydra, describe, job_overrides, override_key
from creditlab.run.memory import GIB, plan_run
from creditlab.run.memory_budget import MARGIN_BYTES, MARGIN_FRACTION, SHARE_ENV, available_memory, usable
from creditlab.run.models import resolve_model_path

#: The file in each run folder that holds its job's output, and the sweep folder's record of the
#: jobs that ended (one JSON line each: folder, exit status, seconds, peak resident memory).
JOB_LOG, JOBS_RECORD = "job.log", "jobs.jsonl"
#: Overrides the launcher sets itself for every job (a command line's own value is refused or kept).
SET_BY_LAUNCHER = ("run_dir", "hydra.run", "hydra.sweep", "hydra.job")


@dataclass(frozen=True)
class SweepJob:
    """One job of the sweep: its place in Hydra's order, its overrides, its run folder, its
    configuration class (:attr:`creditlab.run.cost_plan.Job.cost_key`) and the sweep folder (job
    0's ``hydra.sweep.dir``, where ``jobs.jsonl`` goes)."""

    num: int
    overrides: tuple[str, ...]
    folder: Path
    cost_key: str
    sweep: Path


def _quoted(value: str) -> str:
    """``value`` as a Hydra override value: plain if it is a plain path, else single-quoted."""
    if re.fullmatch(r"[\w./@:+-]+", value):
        return value
    return "'" + value.replace("'", "\\'") + "'"


def sweep_jobs(overrides: list[str]) -> list[SweepJob]:
    """Every job of the sweep ``overrides`` describe, with the folder Hydra's basic launcher would
    give it: each job's ``hydra.sweep.dir/subdir`` from its own config, with job 0's resolver
    cache (a ``${now:...}`` names one time for all, as in Hydra's launcher).

    Raises:
        ConfigError: A ``hydra.job`` override or another sweeper (not run by ``--jobs``), a folder
            that cannot be resolved before launch, or two jobs in one folder.
    """
    for text in overrides:
        if override_key(text).startswith("hydra.job.") or (override_key(text) == "hydra/sweeper" and not text.endswith("=basic")):
            raise ConfigError(f"--jobs runs each job as `creditlab train ... run_dir=<its folder>` with Hydra's basic "
                              f"sweeper's grid; {text} is not passed to the jobs. Leave it out, or run the sweep "
                              "without --jobs.")
    jobs = job_overrides(overrides, multirun=True)
    first = compose_with_hydra([*jobs[0], "hydra.job.num=0"])
    out: list[SweepJob] = []
    for num, job in enumerate(jobs):
        described = describe(job, True, num, like=first)
        if described.folder is None:
            raise ConfigError(f"--jobs: the run folder of job {num} ({' '.join(job)}) cannot be resolved before "
                              "launch: hydra.sweep.dir and subdir may use the job's config values, ${now:...} and "
                              "${hydra.job.num}.")
        same = [j for j in out if j.folder == described.folder]
        if same:
            raise ConfigError(f"--jobs: jobs {same[0].num} ({' '.join(same[0].overrides)}) and {num} ({' '.join(job)}) "
                              f"would both run in {described.folder}: make hydra.sweep.subdir name what differs "
                              "(e.g. ${hydra.job.num}).")
        out.append(SweepJob(num, tuple(job), described.folder, described.cost_key, Path(str(first.hydra.sweep.dir))))
    return out


def thread_count(overrides: list[str], jobs: int, available: int | None = None) -> int:
    """Threads each job gets: the command's ``threads`` if set (non-zero), else ``available // jobs``.

    Raises:
        ConfigError: ``jobs`` above the cores, or ``threads * jobs`` above them.
    """
    available = available or cpu_cores()
    if jobs > available:
        raise ConfigError(f"--jobs {jobs}: this machine lets the process use {available} cores, so at most "
                          f"--jobs {available} runs get a core each.")
    given = [o for o in overrides if override_key(o) == "threads"]
    value = given[-1].partition("=")[2] if given else "0"
    if not value.isdigit():
        raise ConfigError(f"--jobs: {given[-1]} is not one thread count; give threads=N (one number) or leave it "
                          f"out (each job then gets {available} // {jobs} = {available // jobs}).")
    threads = int(value)
    if threads == 0:
        return available // jobs
    if threads * jobs > available:
        raise ConfigError(f"--jobs {jobs} with threads={threads} asks {threads * jobs} threads of {available} cores: "
                          f"use threads={max(available // jobs, 1)}, or leave threads out (set to cores // jobs).")
    return threads


def check_memory(jobs: list[SweepJob], share: int, memory: tuple[int, str] | None = None) -> list[str]:
    """Each configuration's memory plan (one per ``cost_key``) for ``1/share`` of the memory,
    against the usable part of that share. Returns one line per planned peak, naming the jobs
    whose configurations plan it (each for itself and the jobs like it, seeds aside).

    Raises:
        ConfigError: A configuration's planned peak does not fit its share (the message names the
            ``--jobs`` that fits it), or this machine's memory is unknown.
    """
    memory = memory or available_memory("cpu")
    if memory is None:
        raise ConfigError("--jobs: this machine's memory is unknown, so the runs' memory cannot be checked.")
    part = (memory[0] // share, f"{memory[1]}, shared by {share} jobs")
    room = usable(part[0])
    plans: dict[str, list[int]] = {}  # what a configuration plans -> the jobs that head such configurations
    seen: set[str] = set()
    for job in jobs:
        if job.cost_key in seen:
            continue
        seen.add(job.cost_key)
        cfg = compose(list(job.overrides))
        checked = validate(cfg)
        accelerator = str(cfg.trainer.get("accelerator", "cpu"))
        if accelerator != "cpu" or checked["launch"].world_size > 1:
            raise ConfigError(f"--jobs shares this machine's CPU cores and memory among one-process CPU runs; job "
                              f"{job.num} runs on {accelerator} with {checked['launch'].world_size} rank(s). Run "
                              "that sweep without --jobs (or with hydra/launcher=slurm for GPU nodes).")
        plan, _ = plan_run(cfg, checked, None, part)
        phase, peak = plan.peak
        # n jobs fit while peak <= usable(M / n) = (1 - fraction) M / n - margin
        fits = int(memory[0] * (1 - MARGIN_FRACTION) // (peak + MARGIN_BYTES))
        if peak > room:
            advice = f"use --jobs {fits}" if fits >= 1 else "it does not fit even alone"
            raise ConfigError(
                f"--jobs {share}: job {job.num} ({' '.join(job.overrides)}) plans {peak / GIB:.2f} GiB at its peak "
                f"({phase}), more than the {room / GIB:.2f} GiB usable of each job's share ({part[0] / GIB:.1f} GiB of "
                f"{memory[0] / GIB:.1f} GiB): {advice} (creditlab train --dry-run shows the plan).")
        plans.setdefault(f"{peak / GIB:.2f} GiB planned at the peak ({phase})", []).append(job.num)
    return [f"{text} for job{'s' if len(nums) > 1 else ''} {', '.join(map(str, nums))} and those like "
            f"{'them' if len(nums) > 1 else 'it'}, {room / GIB:.2f} GiB usable of each job's share"
            for text, nums in plans.items()]


def prepare_models(jobs: list[SweepJob], threads: int, say: Callable[[str], Any] = print) -> None:
    """Build each recipe model the jobs use once, here, at the jobs' thread count, before any job
    starts. Jobs started together would otherwise each build the same warm start at the same time:
    the recipe cache survives that race (one copy wins the rename), but the work and the memory
    would be N-fold."""
    seen_configs, seen_models = set(), set()
    for job in jobs:
        if job.cost_key in seen_configs:
            continue
        seen_configs.add(job.cost_key)
        model = validate(compose(list(job.overrides)))["model"]
        key = json.dumps([model.recipe, model.recipe_args], sort_keys=True, default=str)
        if not model.recipe or model.name_or_path or key in seen_models:
            continue
        seen_models.add(key)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            path = resolve_model_path(model)
        finally:
            torch.set_num_threads(before)
        say(f"model recipe {model.recipe}: {path}")


@dataclass
class _Running:
    job: SweepJob
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    start: float


def _record(r: _Running, seconds: float, peak_gib: float) -> None:
    """One line of ``<sweep folder>/jobs.jsonl`` for a job that ended."""
    row = {"num": r.job.num, "folder": str(r.job.folder), "exit": r.process.returncode, "seconds": round(seconds, 2),
           "peak_rss_gib": round(peak_gib, 3), "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "overrides": list(r.job.overrides)}
    r.job.sweep.mkdir(parents=True, exist_ok=True)
    with (r.job.sweep / JOBS_RECORD).open("a") as f:
        f.write(json.dumps(row) + "\n")


def _command(job: SweepJob, threads: int) -> list[str]:
    kept = [o for o in job.overrides if not any(override_key(o) == k or override_key(o).startswith(k + ".") for k in SET_BY_LAUNCHER)]
    kept = [o for o in kept if override_key(o) != "threads"]
    return [sys.executable, "-m", "creditlab.cli", "train", *kept, f"threads={threads}",
            f"run_dir={_quoted(str(job.folder))}"]


def _env(share: int) -> dict[str, str]:
    env = {**os.environ, SHARE_ENV: str(share)}
    if share > 1:  # idle OpenMP threads sleep instead of spinning on a core another job needs
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def _ended(rc: int) -> str:
    """How a job ended, in words: its exit status, or the signal that killed it."""
    if rc >= 0:
        return f"exit {rc}"
    name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else f"signal {-rc}"
    return f"killed by {name}" + (" (out of memory? its peak is in jobs.jsonl)" if -rc == signal.SIGKILL else "")


class SweepStopped(Exception):
    """The sweep was stopped by a signal (``signum``) after its running jobs stopped."""

    def __init__(self, signum: int, unfinished: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}: {unfinished} job(s) not finished")
        self.signum, self.unfinished = signum, unfinished


#: Exit statuses of a job that stopped because it was asked to (a run's own, or the signal's).
STOPPED = {128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP, -signal.SIGINT, -signal.SIGTERM,
           -signal.SIGHUP}


def _signal(r: _Running, signum: int) -> None:
    if r.process.returncode is None:  # not reaped yet, so its pid is still its own
        try:
            os.kill(r.process.pid, signum)
        except ProcessLookupError:
            pass


def run_jobs(jobs: list[SweepJob], parallel: int, threads: int, say: Callable[[str], Any] = print) -> list[SweepJob]:
    """Run ``jobs`` as child processes, at most ``parallel`` at a time, in order. Returns the jobs
    that failed (empty: all finished). A SIGINT, SIGTERM or SIGHUP is passed on to the running
    jobs (each stops at its next step and can be resumed), no new job starts, and
    :class:`SweepStopped` is raised once they have ended. An error here stops the running jobs
    (SIGTERM) before it propagates. A job outlives only a SIGKILL of this process."""
    pending, running, failed = list(jobs), [], []
    stopped_by = 0

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopped_by
        stopped_by = stopped_by or signum
        for r in running:
            _signal(r, signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        while running or (pending and not failed and not stopped_by):
            while pending and len(running) < parallel and not failed and not stopped_by:
                job = pending.pop(0)
                job.folder.mkdir(parents=True, exist_ok=True)
                log = (job.folder / JOB_LOG).open("ab")
                process = subprocess.Popen(_command(job, threads), stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT, env=_env(parallel), start_new_session=True)
                running.append(_Running(job, process, log, time.monotonic()))
                if stopped_by:  # a signal between the start and the line above
                    _signal(running[-1], stopped_by)
                say(f"[{job.num + 1}/{len(jobs)}] started {job.folder} (threads={threads})")
            time.sleep(0.2)
            for r in list(running):
                pid, status, usage = os.wait4(r.process.pid, os.WNOHANG)
                if pid == 0:
                    continue
                r.process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, with its resource use
                running.remove(r)
                r.log.close()
                seconds, peak = time.monotonic() - r.start, usage.ru_maxrss * 1024 / GIB  # Linux: KiB
                _record(r, seconds, peak)
                head = f"[{r.job.num + 1}/{len(jobs)}]"
                if r.process.returncode == 0:
                    say(f"{head} done {r.job.folder} in {seconds:.0f} s, peak {peak:.2f} GiB resident")
                elif stopped_by and r.process.returncode in STOPPED:
                    pending.append(r.job)
                    say(f"{head} stopped ({_ended(r.process.returncode)}) {r.job.folder}")
                else:
                    failed.append(r.job)
                    say(f"{head} FAILED ({_ended(r.process.returncode)}) {r.job.folder}: see {r.job.folder / JOB_LOG}")
    except BaseException:
        for r in running:
            _signal(r, signal.SIGTERM)
        for r in running:
            r.process.wait()
        raise
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    if stopped_by:
        raise SweepStopped(stopped_by, len(pending) + len(failed))
    return failed

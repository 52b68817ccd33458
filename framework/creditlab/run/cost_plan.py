"""A run's or a sweep's wall-clock before it runs (issue 54): ``creditlab train [-m] ... --plan``.

Each distinct job configuration, seeds aside, is **calibrated** once on this machine: the job
itself runs for a few steps (``trainer.max_steps=N``, ``eval.every=N``: evaluations at step 0
and N; ``checkpoint_every=N``: one checkpoint) in a temporary folder, in a child process, with
``logger=none``, and its ``metrics.jsonl`` gives

* ``first_s``: the first RL step (it warms caches up), and ``step_s``: the mean of the others;
* ``eval_s``: the mean of its evaluations (``time/eval_s``);
* ``setup_s``: the rest of the child's wall-clock (configuration, model load, one checkpoint, the
  run's files), less ``import_s``, what a child that only imports the training stack takes.

A job of S steps, evaluated every E steps, is then predicted to take
``setup_s + first_s + (S - 1) * step_s + evaluations(S, E) * eval_s``; a sweep adds ``import_s``
once (Hydra's basic launcher runs its jobs in one process). A job whose folder already holds a
run is predicted from the last step it logged: the steps and evaluations left, plus ``setup_s``
(a finished run still loads its model and checkpoint before the sweep moves on). Not predicted:
checkpoints after the first (seconds each on the models here), a logger other than ``none``
(W&B's start and finish), and anything a run does differently as it learns (answers that grow
or shrink), which is why ``docs/sweeps.md`` reports the prediction beside a measured sweep.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from creditlab.errors import ConfigError
from creditlab.run.compose import CONF_DIR, searchpath_override, split_searchpath

#: Keys that set where and how a run is recorded, or its randomness: jobs differing only in these
#: share a calibration. ``trainer.max_steps`` and ``eval.every`` enter the prediction instead.
NOT_COST = ("seed", "run_dir", "logger", "tags", "preregistration", "resume", "resume_mismatch")
#: Overrides the calibration sets itself (a job's own value of these, or of a key under them, is
#: dropped): its length, schedule, folder and logger.
CALIBRATION_KEYS = ("trainer.max_steps", "eval.every", "checkpoint_every", "logger", "run_dir", "resume",
                    "hydra.run", "hydra.sweep", "hydra.job")
IMPORT_PROBE = "import creditlab.run.hydra_main"


@dataclass(frozen=True)
class Job:
    """One run of a plan: its overrides, schedule, folder and whether it already finished."""

    overrides: tuple[str, ...]
    max_steps: int
    eval_every: int
    folder: Path | None
    done_steps: int
    cost_key: str

    @property
    def finished(self) -> bool:
        """Whether its folder already holds every step (a sweep then only reloads it)."""
        return self.done_steps >= self.max_steps


@dataclass(frozen=True)
class Calibration:
    """Seconds measured by a short run of a job on this machine (module docstring)."""

    steps: int
    first_s: float
    step_s: float
    eval_s: float
    setup_s: float
    wall_s: float

    def predict(self, max_steps: int, eval_every: int, done: int = 0) -> float:
        """Predicted seconds of a run of ``max_steps`` steps evaluated every ``eval_every``, of
        which ``done`` were run before (a resume: no first step's warm-up counted again)."""
        left = max(max_steps - done, 0)
        steps = (self.first_s + max(left - 1, 0) * self.step_s) if done == 0 and left else left * self.step_s
        return self.setup_s + steps + evaluations(max_steps, eval_every, done) * self.eval_s


def evaluation_steps(max_steps: int, eval_every: int) -> list[int]:
    """The steps a run evaluates after (:mod:`creditlab.step.eval_hooks`): 0, every
    ``eval_every`` steps, and the last step when it is not one of them; none when ``eval_every``
    is 0."""
    if eval_every <= 0:
        return []
    steps = list(range(0, max_steps + 1, eval_every))
    return steps if steps[-1] == max_steps else [*steps, max_steps]


def evaluations(max_steps: int, eval_every: int, done: int = 0) -> int:
    """How many evaluations a run makes, or has left after ``done`` steps."""
    return sum(1 for s in evaluation_steps(max_steps, eval_every) if s > done or done == 0 == s)


def override_key(text: str) -> str:
    """The key an override sets, its prefix (``+``, ``++``, ``~``) and value aside."""
    return text.lstrip("+~").partition("=")[0]


def compose_with_hydra(overrides: list[str]) -> Any:
    user, rest = split_searchpath(overrides)
    # job_name: as Hydra names the job of ``creditlab train`` (its main's module), for ${hydra.job.name}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="hydra_main"):
        return hydra_compose("train", overrides=[*searchpath_override(user), *rest], return_hydra_config=True)


def job_overrides(overrides: list[str], multirun: bool) -> list[list[str]]:
    """Every job's override list, in Hydra's order: one job without ``multirun``; else the grid of
    the config's ``hydra.sweeper.params`` (a sweep file's) and the command line's ``a=1,2``
    sweeps, the command line winning on a shared key, as Hydra's basic sweeper builds it."""
    if not multirun:
        return [list(overrides)]
    cfg = compose_with_hydra([*_first_values(overrides), "hydra.job.num=0"])
    params = [f"{k}={v}" for k, v in (cfg.hydra.sweeper.params or {}).items()]
    parsed = OverridesParser.create().parse_overrides([*params, *overrides])
    return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def _first_values(overrides: list[str]) -> list[str]:
    """The overrides with every sweep at its first value (to read the sweep's own config)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    out = []
    for text, ov in zip(overrides, parsed):
        if ov.is_sweep_override():  # the key element keeps its prefix (+ or ++)
            text = f"{ov.get_key_element()}={next(iter(ov.sweep_string_iterator()))}"
        out.append(text)
    return out


def describe(overrides: list[str], multirun: bool, num: int = 0, like: Any = None) -> Job:
    """A job's schedule, its folder (a sweep job's ``hydra.sweep.dir/subdir``, ``num`` being its
    place in the sweep, as Hydra's ``hydra.job.num``; a single run's ``run_dir``), the steps a run
    there already logged, and its calibration class. ``like``: a config whose resolver cache the
    job's takes (``${now:...}`` then names the same time, as Hydra's launcher does for a sweep)."""
    cfg = compose_with_hydra([*overrides, f"hydra.job.num={num}"])
    if like is not None:
        OmegaConf.copy_cache(from_config=like, to_config=cfg)
    try:
        folder = Path(f"{cfg.hydra.sweep.dir}/{cfg.hydra.sweep.subdir}") if multirun else Path(cfg.run_dir)
    except OmegaConfBaseException:  # a value set only when Hydra launches the job
        folder = None
    plain = OmegaConf.to_container(cfg, resolve=False)
    for key in (*NOT_COST, "hydra"):
        plain.pop(key, None)
    plain.get("trainer", {}).pop("max_steps", None)
    plain.get("eval", {}).pop("every", None)
    return Job(tuple(overrides), int(cfg.trainer.max_steps), int(cfg.eval.every), folder, logged_steps(folder),
               json.dumps(plain, sort_keys=True, default=str))


def logged_steps(folder: Path | None) -> int:
    """The last RL step a run in ``folder`` logged (0: none there). A resume restarts from its last
    checkpoint, up to ``checkpoint_every`` steps earlier, so a stopped run is predicted a little short."""
    metrics = folder / "metrics.jsonl" if folder is not None else None
    if metrics is None or not metrics.is_file():
        return 0
    steps = [0]
    for line in metrics.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut off by a kill
            continue
        if "time/step_s" in row:
            steps.append(int(row["step"]))
    return max(steps)


def import_seconds() -> float:
    """Wall-clock of a child that only starts Python and imports the training stack."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORT_PROBE], check=True, capture_output=True)
    return time.perf_counter() - t0


def calibrate(overrides: tuple[str, ...], steps: int, eval_every: int, import_s: float) -> Calibration:
    """Run the job for ``steps`` steps in a temporary folder (evaluating at 0 and ``steps`` when the
    job evaluates at all) and measure it (module docstring).

    Raises:
        ConfigError: The short run failed (its error output's end is in the message).
    """
    kept = [o for o in overrides if not any(override_key(o) == k or override_key(o).startswith(k + ".") for k in CALIBRATION_KEYS)]
    with tempfile.TemporaryDirectory(prefix="creditlab_plan_") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "creditlab.cli", "train", *kept, f"trainer.max_steps={steps}",
               f"eval.every={steps if eval_every > 0 else 0}", f"checkpoint_every={steps}", "logger=none",
               f"run_dir={run_dir}"]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise ConfigError(f"the calibration run failed ({' '.join(cmd[2:])}):\n{done.stderr[-2000:]}")
        metrics = run_dir / "metrics.jsonl"
        if not metrics.is_file():
            raise ConfigError(f"the calibration run ({' '.join(cmd[2:])}) wrote no {metrics}.")
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    step_times = [r["time/step_s"] for r in sorted(rows, key=lambda r: r["step"]) if "time/step_s" in r]
    eval_times = [r["time/eval_s"] for r in rows if "time/eval_s" in r]
    if not step_times:
        raise ConfigError(f"the calibration run ({' '.join(cmd[2:])}) logged no step time (time/step_s).")
    first, rest = step_times[0], step_times[1:] or step_times
    evals = statistics.fmean(eval_times) if eval_times else 0.0
    setup = wall - sum(step_times) - sum(eval_times) - import_s
    return Calibration(len(step_times), first, statistics.fmean(rest), evals, max(setup, 0.0), wall)


@dataclass(frozen=True)
class Plan:
    """Every job with its prediction, the calibrations and the one-off import time."""

    jobs: list[Job]
    seconds: list[float]
    calibrations: dict[str, tuple[Job, Calibration]]
    import_s: float

    @property
    def total_s(self) -> float:
        return self.import_s + sum(self.seconds)


def plan(overrides: list[str], multirun: bool, steps: int = 4) -> Plan:
    """Describe every job, calibrate each class of jobs once (``steps`` steps), predict each job.

    Raises:
        ConfigError: ``steps`` below 2, a launcher other than Hydra's basic one, or a calibration
            run failed.
    """
    launchers = [o for o in overrides if override_key(o) == "hydra/launcher" and not o.endswith("=basic")]
    if launchers:
        raise ConfigError(f"--plan predicts runs one at a time on this machine; {launchers[0]} runs them "
                          "elsewhere. Plan without it (the calibration then measures this machine).")
    if steps < 2:
        raise ConfigError(f"--calibrate-steps {steps}: a calibration needs at least 2 steps (the first warms "
                          "up; the others give the step time); e.g. --calibrate-steps 4.")
    jobs = [describe(o, multirun, i) for i, o in enumerate(job_overrides(overrides, multirun))]
    import_s = import_seconds()
    calibrations: dict[str, tuple[Job, Calibration]] = {}
    for job in jobs:
        if not job.finished and job.cost_key not in calibrations:
            calibrations[job.cost_key] = (job, calibrate(job.overrides, steps, job.eval_every, import_s))
    # A class whose every job finished is not calibrated: its reloads (set-up only) count 0 s.
    seconds = [calibrations[j.cost_key][1].predict(j.max_steps, j.eval_every, j.done_steps)
               if j.cost_key in calibrations else 0.0 for j in jobs]
    return Plan(jobs, seconds, calibrations, import_s)

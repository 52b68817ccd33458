"""Process plumbing of a run: validate, write the run directory's records, start the processes
(one, or the data-parallel ranks of this machine) and record how the run ended in ``status.json``.

One process (the default): :func:`run` fits in this process (:func:`creditlab.run.runner.fit`).

Several ranks on this machine (``trainer=ddp trainer.devices=N``): this process becomes a
``torch.distributed`` elastic agent (the launcher behind ``torchrun``) and starts N workers, each
``python -m creditlab.run.launch <run_dir>``; the workers read the run's resolved ``config.yaml``,
so every rank has the same config and run folder, in single runs and in Hydra sweeps alike
(Lightning's own ``ddp`` launcher re-runs ``sys.argv``, which under a Hydra multirun starts the
whole sweep again: Lightning-AI/pytorch-lightning#11300, facebookresearch/hydra#2070; ``ddp_spawn``
pickles every part into fresh interpreters). Lightning sees processes created externally and joins
them. When one worker fails, the agent stops the others and the run is marked ``failed``.

When a cluster already created the processes (SLURM ``srun``, ``torchrun``), every process runs
:func:`run` as one rank and nothing is started here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.environments import (
    LSFEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from creditlab.errors import ConfigError
from creditlab.run.config import provenance, validate
from creditlab.run.environment import environment
from creditlab.run.layout import LaunchPlan, threads_per_rank
from creditlab.run.loggers import read_metrics
from creditlab.run.models import resolve_model_path
from creditlab.run.rundir_guard import RunDirLock, RunStopped, check_resume, check_run_dir
from creditlab.run.runner import fit

#: Environment variables set for the workers (and restored in this process afterwards).
WORKER_ENV = ("OMP_NUM_THREADS", "CREDITLAB_THREADS")


def _process_rank() -> int:
    """This process's global rank when a cluster launcher started it (0 otherwise)."""
    for key in ("RANK", "SLURM_PROCID"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def launched_externally() -> bool:
    """Whether a cluster (SLURM, torchrun, ...) or creditlab's launcher created this process."""
    if "LOCAL_RANK" in os.environ:
        return True
    return any(env.detect() for env in (SLURMEnvironment, TorchElasticEnvironment, LSFEnvironment))


def processes_to_start(layout: LaunchPlan) -> int:
    """Ranks to start on this node (1 = this process is the only one, or it is one of many a
    cluster launcher already started).

    Raises:
        ConfigError: Several nodes, not started by a cluster launcher.
    """
    if layout.strategy == "single" or layout.devices == 1 or launched_externally():
        return 1
    if layout.num_nodes > 1:
        raise ConfigError(
            f"trainer.num_nodes={layout.num_nodes}: start the processes of every node with a cluster "
            "launcher (hydra/launcher=slurm, srun or torchrun; docs/scaling.md)."
        )
    return layout.devices


@rank_zero_only
def write_status(out_dir: Path, status: str, started: str, error: BaseException | None = None) -> None:
    """Write ``<out_dir>/status.json`` atomically: ``running``, ``finished`` or ``failed``.

    ``creditlab compare`` reads it to tell a crashed run (``failed``, with the exception) from one
    still running or killed (``running`` with a pid that is, or is no longer, alive on ``host``).
    """
    state: dict[str, Any] = {"status": status, "pid": os.getpid(), "host": socket.gethostname(), "started": started}
    if status != "running":
        state["ended"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    if error is not None:
        state["error"] = {"type": type(error).__name__, "message": str(error)}
    tmp = out_dir / "status.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, out_dir / "status.json")


@contextlib.contextmanager
def recorded(out_dir: Path) -> Iterator[None]:
    """``status.json`` says ``running`` during the body, then ``finished``, ``stopped`` (a signal
    stopped it; resumable) or ``failed``."""
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    write_status(out_dir, "running", started)
    try:
        yield
    except RunStopped as exc:
        write_status(out_dir, "stopped", started, exc)
        raise
    except BaseException as exc:
        write_status(out_dir, "failed", started, exc)
        raise
    write_status(out_dir, "finished", started)


def run(cfg: DictConfig, out_dir: str | Path, records: dict[str, str] | None = None) -> dict[str, Any]:
    """Train as configured, writing everything under ``out_dir``. Returns the run's summary.

    The launching process (rank 0) locks ``out_dir`` for the run's life and refuses a config that
    differs from the run already there (:mod:`creditlab.run.rundir_guard`) before it writes anything:
    ``config.yaml``, ``plugins.json``, ``environment.json`` and ``records`` (``{relative path:
    text}``, e.g. Hydra's ``.hydra/overrides.yaml``).

    With a multi-process strategy on one machine (``trainer=ddp``), the ranks run as workers of
    a ``torch.distributed`` elastic agent (this process); they read ``out_dir/config.yaml``.
    ``threads`` holds for the run only: the process's torch thread count is restored after it.

    Raises:
        RunDirError: ``out_dir`` is not a writable folder, is in use, or holds another run.
        RunStopped: A signal stopped the run (its message says what a resume continues from).
    """
    checked = validate(cfg)
    out_dir = Path(out_dir)
    check_run_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    layout = checked.get("launch")
    processes = processes_to_start(layout) if layout is not None else 1
    with contextlib.ExitStack() as held:
        if _process_rank() == 0:
            held.enter_context(RunDirLock(out_dir))
            note = check_resume(cfg, out_dir)
            if note:
                print(note, file=sys.stderr)
            (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
            (out_dir / "plugins.json").write_text(json.dumps(provenance(cfg), indent=2))
            chosen = {"precision": checked["precision"]} if checked["precision"] else {}
            if chosen:
                print(f"[creditlab] {checked['precision']}", file=sys.stderr)
            (out_dir / "environment.json").write_text(json.dumps({**environment(), **chosen}, indent=2))
            for name, text in (records or {}).items():
                (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
                (out_dir / name).write_text(text)
        return _run(cfg, checked, out_dir, layout, processes)


def _run(cfg: DictConfig, checked: dict[str, Any], out_dir: Path, layout: LaunchPlan | None,
         processes: int) -> dict[str, Any]:
    threads = checked["run"].threads
    if processes > 1 or (layout is not None and layout.world_size > 1):
        ranks_here = processes if processes > 1 else int(os.environ.get("LOCAL_WORLD_SIZE", layout.devices))
        threads = threads_per_rank(threads, ranks_here)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with recorded(out_dir):
        if processes > 1:
            resolve_model_path(checked["model"])  # a model recipe builds its cache once, here
            started = time.time()
            try:
                start_ranks(out_dir, processes, threads)
            except SignalException as exc:  # the agent stopped the ranks with the signal it got
                ckpt = out_dir / "checkpoints" / "interrupted.ckpt"
                saved = ckpt.is_file() and ckpt.stat().st_mtime >= started
                raise RunStopped(signal.Signals(exc.sigval).name, _last_step(out_dir / "metrics.jsonl"),
                                 int(cfg.trainer.max_steps), ckpt if saved else None, saved) from None
            summary = out_dir / "summary.json"
            return json.loads(summary.read_text()) if summary.is_file() else {}
        before = torch.get_num_threads()  # restored: a run leaves no thread count to the next
        if threads:
            torch.set_num_threads(threads)
        try:
            return fit(cfg, checked, out_dir)
        finally:
            torch.set_num_threads(before)


class RankFailed(RuntimeError):
    """A worker rank failed; the agent stopped the others."""


def start_ranks(out_dir: Path, processes: int, threads: int, module: str = "creditlab.run.launch") -> None:
    """Run ``processes`` ranks of the run in ``out_dir`` on this machine as workers of an elastic
    agent (``python -m <module> <out_dir>`` each, with ``threads`` torch threads); return when all
    finished.

    Raises:
        RankFailed: A worker failed (the agent stopped the others); the message names it.
    """
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=processes, run_id=f"creditlab-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", rdzv_configs={"is_host": True},
        max_restarts=0, monitor_interval=0.5,
    )
    saved = {k: os.environ.get(k) for k in WORKER_ENV}
    os.environ.update(OMP_NUM_THREADS=str(threads), CREDITLAB_THREADS=str(threads))
    try:
        elastic_launch(config, sys.executable)("-m", module, str(out_dir))
    except ChildFailedError as exc:
        failures = "; ".join(
            f"rank {rank} exited with code {f.exitcode}" for rank, f in sorted(exc.failures.items())
        )
        raise RankFailed(f"{failures}; the other ranks were stopped") from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main(argv: list[str] | None = None) -> None:
    """Entry of a worker rank: ``python -m creditlab.run.launch <run_dir>`` (started by
    :func:`start_ranks`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.exit("usage: python -m creditlab.run.launch RUN_DIR (started by creditlab train)")
    out_dir = Path(args[0])
    cfg = OmegaConf.load(out_dir / "config.yaml")
    torch.set_num_threads(int(os.environ.get("CREDITLAB_THREADS", "1")))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        fit(cfg, validate(cfg), out_dir)
    except RunStopped as exc:  # the agent reports it; a rank only ends with the signal's code
        sys.exit(exc.exit_code)


def _last_step(metrics: Path) -> int:
    """The last RL step ``metrics.jsonl`` logged training metrics for (0: none)."""
    rows = read_metrics(metrics) if metrics.is_file() else []
    return max((int(r["step"]) for r in rows if "train/reward/mean" in r), default=0)


if __name__ == "__main__":
    main()

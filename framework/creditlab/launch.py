"""Starting the data-parallel ranks of one run on this machine.

Lightning's ``ddp`` launcher starts each extra rank by re-running the command line
(``sys.argv``) with ``hydra.run.dir=...`` appended. With creditlab that command is the console
script ``creditlab train ...`` (its ``argv[0]`` is not a script Lightning can re-run), and under a
Hydra multirun the re-run would start the whole sweep again (Lightning-AI/pytorch-lightning#11300,
facebookresearch/hydra#2070). ``ddp_spawn`` instead pickles the module and every part (tokenizer,
verifier worker pools, ...) into fresh interpreters.

So creditlab starts the ranks itself: the Hydra job's process is rank 0 and starts ranks
1..N-1 as ``python -m creditlab.launch <run_dir>``; those read the run's resolved ``config.yaml``,
so every rank has the same config and run folder, in single runs and in sweeps alike. The usual
variables (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``NODE_RANK``, ``LOCAL_RANK``,
``RANK``) are set, so Lightning sees processes created externally and only joins them. When a
cluster already created the processes (SLURM ``srun``, ``torchrun``), nothing is launched here.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditlab.registry import ConfigError

#: Strategy names (string form or class) whose ranks are separate processes on each node.
MULTI_PROCESS = {"DDPStrategy": "ddp", "FSDPStrategy": "fsdp", "DeepSpeedStrategy": "deepspeed"}
#: Environment variables this module sets for the ranks.
RANK_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK", "RANK",
            "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS", "CREDITLAB_THREADS")


@dataclass(frozen=True)
class LaunchPlan:
    """How the run's processes are laid out.

    Attributes:
        strategy: ``ddp``, ``fsdp``, ``deepspeed`` or ``single`` (one process per node).
        devices: Ranks per node (``trainer.devices`` resolved to a number).
        num_nodes: ``trainer.num_nodes``.
    """

    strategy: str
    devices: int
    num_nodes: int = 1

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes if self.strategy != "single" else 1


def cpu_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _strategy(node: Any) -> str:
    """``ddp`` / ``fsdp`` / ``deepspeed`` / ``single`` from ``trainer.strategy``."""
    if isinstance(node, Mapping):
        cls = str(node.get("_target_", "")).rsplit(".", 1)[-1]
        if cls not in MULTI_PROCESS:
            return "single"
        method = node.get("start_method", "popen")
        name = MULTI_PROCESS[cls] if method == "popen" else f"{MULTI_PROCESS[cls]}_{method}"
    else:
        name = str(node or "auto")
    if any(s in name for s in ("spawn", "fork", "notebook")):
        raise ConfigError(
            f"trainer.strategy '{name}' starts its ranks by pickling the module and every part "
            "into new processes, which creditlab does not support: use trainer=ddp (creditlab "
            "starts the ranks itself; docs/scaling.md)."
        )
    return next((s for s in ("ddp", "fsdp", "deepspeed") if name.startswith(s)), "single")


def _devices(value: Any, accelerator: str) -> int:
    """``trainer.devices`` as a number of ranks per node."""
    gpu = accelerator in ("gpu", "cuda")
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__") and not isinstance(value, str):
        return len(value)
    text = str(value).strip()
    if text in ("auto", "-1"):
        if not gpu:
            return 1
        import torch

        return max(torch.cuda.device_count(), 1)
    if "," in text:
        return len([t for t in text.split(",") if t.strip()])
    try:
        n = int(text)
    except ValueError:
        raise ConfigError(f"trainer.devices must be a number, a list or 'auto'; got {value!r}.") from None
    if n < 1:
        raise ConfigError(f"trainer.devices must be >= 1; got {n}.")
    return n


def plan(trainer: Mapping[str, Any], prompts_per_step: int) -> LaunchPlan:
    """Check the trainer section's process layout.

    Raises:
        ConfigError: A spawn-based strategy; more CPU ranks than cores; fewer prompts per step
            than ranks.
    """
    strategy = _strategy(trainer.get("strategy", "auto"))
    accelerator = str(trainer.get("accelerator", "auto"))
    devices = _devices(trainer.get("devices", 1), accelerator)
    nodes = int(trainer.get("num_nodes", 1) or 1)
    cores = cpu_cores()
    if accelerator == "cpu" and strategy != "single" and devices > cores:
        raise ConfigError(
            f"trainer.devices={devices} would start {devices} CPU ranks but this machine has "
            f"{cores} cores: use trainer.devices<={cores} (one rank per core at least)."
        )
    out = LaunchPlan(strategy, devices, nodes)
    if prompts_per_step < out.world_size:
        raise ConfigError(
            f"prompts_per_step={prompts_per_step} is smaller than the {out.world_size} ranks; every "
            f"rank needs at least one prompt: set prompts_per_step>={out.world_size}."
        )
    return out


def launched_externally() -> bool:
    """Whether a cluster (SLURM, torchrun, ...) or creditlab already created this process."""
    if "LOCAL_RANK" in os.environ:
        return True
    from lightning.fabric.plugins.environments import (
        LSFEnvironment, SLURMEnvironment, TorchElasticEnvironment,
    )

    return any(env.detect() for env in (SLURMEnvironment, TorchElasticEnvironment, LSFEnvironment))


def processes_to_start(layout: LaunchPlan) -> int:
    """Ranks to start on this node (1 = none beyond this process)."""
    if layout.strategy == "single" or layout.devices == 1 or launched_externally():
        return 1
    if layout.num_nodes > 1:
        raise ConfigError(
            f"trainer.num_nodes={layout.num_nodes}: start the processes of every node with a cluster "
            "launcher (hydra/launcher=slurm, srun or torchrun; docs/scaling.md)."
        )
    return layout.devices


def threads_per_rank(threads: int, ranks_here: int) -> int:
    """``threads`` when set, else the cores shared out between this node's ranks (>= 1)."""
    return threads if threads > 0 else max(1, cpu_cores() // max(ranks_here, 1))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Watcher(threading.Thread):
    """Polls the child ranks; when one fails, stops the others and this process (which would
    otherwise wait in a collective until the process group's timeout)."""

    def __init__(self, procs: list[subprocess.Popen], on_failure: Callable[[str], None]) -> None:
        super().__init__(daemon=True, name="creditlab-rank-watcher")
        self.procs, self.on_failure, self.done = procs, on_failure, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            for rank, proc in enumerate(self.procs, start=1):
                code = proc.poll()
                if code:  # non-zero exit (None = running, 0 = finished)
                    message = f"rank {rank} exited with code {code}; stopping the run"
                    print(f"creditlab: error: {message}", file=sys.stderr, flush=True)
                    _terminate(self.procs)
                    with contextlib.suppress(Exception):
                        self.on_failure(message)
                    os._exit(1)


def _terminate(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.wait(timeout=10)


@contextlib.contextmanager
def local_ranks(
    out_dir: Path, processes: int, threads: int, on_failure: Callable[[str], None] = lambda m: None
) -> Iterator[None]:
    """Make this process rank 0 of ``processes`` ranks on this machine for the ``with`` body.

    Ranks 1.. run ``python -m creditlab.launch <out_dir>`` (``out_dir/config.yaml`` must be
    written). On leaving, waits for them and restores the environment; if this rank fails, they
    are killed; if one of them fails, ``on_failure(message)`` runs and this process exits.

    Args:
        out_dir: The run folder.
        processes: Ranks on this machine (1: nothing is started).
        threads: torch threads per rank.
        on_failure: Called with a message when a child rank fails.
    """
    if processes <= 1:
        yield
        return
    shared = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(processes),
              "NODE_RANK": "0", "LOCAL_WORLD_SIZE": str(processes), "OMP_NUM_THREADS": str(threads),
              "CREDITLAB_THREADS": str(threads)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "creditlab.launch", str(out_dir)],
            env={**os.environ, **shared, "LOCAL_RANK": str(r), "RANK": str(r)},
            stdin=subprocess.DEVNULL,
        )
        for r in range(1, processes)
    ]
    saved = {k: os.environ.get(k) for k in RANK_ENV}
    os.environ.update(shared, LOCAL_RANK="0", RANK="0")
    watcher = _Watcher(procs, on_failure)
    watcher.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        watcher.done.set()
        if not ok:  # say which rank went first, if one did (rank 0 then fails in a collective)
            for rank, proc in enumerate(procs, start=1):
                if proc.poll():
                    print(f"creditlab: error: rank {rank} exited with code {proc.returncode}",
                          file=sys.stderr, flush=True)
            _terminate(procs)
        _leave_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    deadline = time.monotonic() + 300
    codes = [proc.wait(timeout=max(deadline - time.monotonic(), 1)) for proc in procs]
    failed = [f"rank {r} exited with code {c}" for r, c in enumerate(codes, start=1) if c]
    if failed:
        raise RuntimeError("; ".join(failed))


def _leave_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    """Entry of ranks 1..N-1: ``python -m creditlab.launch <run_dir>``."""
    from omegaconf import OmegaConf

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.exit("usage: python -m creditlab.launch RUN_DIR (started by creditlab train)")
    out_dir = Path(args[0])
    import torch

    from creditlab.runner import fit
    from creditlab.train import validate

    cfg = OmegaConf.load(out_dir / "config.yaml")
    checked = validate(cfg)
    torch.set_num_threads(int(os.environ.get("CREDITLAB_THREADS", "1")))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    fit(cfg, checked, out_dir)


if __name__ == "__main__":
    main()

"""The process layout a run's ``trainer`` section asks for, checked before anything starts.

:func:`plan` reads ``trainer.strategy``, ``trainer.devices``, ``trainer.accelerator`` and
``trainer.num_nodes`` into a :class:`LaunchPlan` and refuses layouts creditlab cannot run;
:mod:`creditlab.run.launch` starts the processes of a valid one. (No Lightning import here: checking
a config must stay fast.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from creditlab.errors import ConfigError

#: Strategy names (string form or class) whose ranks are separate processes on each node.
MULTI_PROCESS = {"DDPStrategy": "ddp", "FSDPStrategy": "fsdp", "DeepSpeedStrategy": "deepspeed"}


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
        return max(torch.cuda.device_count(), 1) if gpu else 1
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


def threads_per_rank(threads: int, ranks_here: int) -> int:
    """``threads`` when set, else the cores shared out between this node's ranks (>= 1)."""
    return threads if threads > 0 else max(1, cpu_cores() // max(ranks_here, 1))

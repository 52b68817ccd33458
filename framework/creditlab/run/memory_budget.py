"""How much memory there is for a run and what ``loss.micro_batch_tokens=auto`` makes of it
(:mod:`creditlab.run.memory`, module docstring): :func:`available_memory` of the run's device,
the share of it a plan may fill (:func:`usable`), the token budget search
(:func:`resolve_token_budget`) and plain notes on what does not fit (:func:`fit_notes`)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

GIB = 2**30
#: Usable memory for auto: ``MARGIN_FRACTION`` of it and ``MARGIN_BYTES`` stay free (the runtime:
#: Python, torch, a CUDA context; allocator slack); budgets are multiples of ``BUDGET_STEP`` tokens.
MARGIN_FRACTION, MARGIN_BYTES, BUDGET_STEP = 0.1, 2 * GIB, 256
#: Under auto, a micro-batch's own tensors (activations kept for the backward and the loss's
#: vocabulary tensors) hold at most this share of the memory: beyond a few thousand tokens a larger
#: micro-batch buys no speed (measured on SmolLM2-135M, AMD EPYC Zen 4, 2 threads: 2,048-token
#: micro-batches updated in 44 s against 62 s for the whole 64-row batch, at 5.3 against 14.2 GiB;
#: docs/real-model.md), and the rest stays free for the estimators' phases and the machine.
BATCH_SHARE = 1 / 8
#: Set by ``creditlab train -m ... --jobs N`` (:mod:`creditlab.run.parallel`) in each job's
#: environment: N runs share the CPU's memory, so each sizes ``auto`` for ``1/N`` of it.
SHARE_ENV = "CREDITLAB_MEMORY_SHARE"


def available_memory(accelerator: str, device: int | None = None) -> tuple[int, str] | None:
    """``(bytes, what they are)`` the run's device has, or ``None`` where this machine cannot
    tell: the CPU's RAM (the smaller of the machine's and its cgroup's limit), a CUDA device's free
    memory (``device``, else ``LOCAL_RANK``'s); no CUDA device, or another accelerator: ``None``.
    The CPU's is divided by :data:`SHARE_ENV` where a parallel sweep set it."""
    if accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", 0)) if device is None else device
        free, _ = torch.cuda.mem_get_info(index)
        return int(free), f"free memory of CUDA device {index} ({torch.cuda.get_device_name(index)})"
    if accelerator not in ("cpu", "auto"):
        return None
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            value = Path(limit).read_text().strip()
        except OSError:
            continue
        if value.isdigit() and 0 < int(value) < ram:
            return _shared(int(value), f"this machine's cgroup memory limit ({limit})")
    return _shared(int(ram), "this machine's RAM")


def _shared(memory: int, what: str) -> tuple[int, str]:
    """``memory`` divided among the jobs of a parallel sweep (:data:`SHARE_ENV`), if any."""
    share = os.environ.get(SHARE_ENV, "")
    if not share.isdigit() or int(share) <= 1:
        return memory, what
    return memory // int(share), f"{what}, shared by {share} parallel sweep jobs"


def usable(memory: float) -> float:
    """What a plan may fill of ``memory``: all but ``MARGIN_FRACTION`` of it and ``MARGIN_BYTES``."""
    return memory * (1 - MARGIN_FRACTION) - MARGIN_BYTES


def batch_bytes(plan: Any) -> float:
    """What one micro-batch itself holds in a plan's update: activations and vocabulary tensors."""
    return plan.parts["activations"] + plan.parts["logits"]


def resolve_token_budget(
    plan_at: Any, row: int, mini_tokens: int, room: float, batch_room: float = math.inf,
) -> tuple[int, str]:
    """``(loss.micro_batch_tokens, why)`` for ``auto``: 0 when the update of the whole mini-batch
    fits in ``room`` bytes and its micro-batch tensors (:func:`batch_bytes`) in ``batch_room``,
    else the largest multiple of :data:`BUDGET_STEP` tokens (at least one longest row of ``row``
    tokens) for which both hold, else the smallest such budget.

    Args:
        plan_at: ``budget -> plan`` (:func:`creditlab.run.memory.estimate` at that ``token_budget``).
        row: The longest row, prompt + response budget, in tokens.
        mini_tokens: The whole mini-batch at that length, in tokens.
        room: Usable bytes (:func:`usable`).
        batch_room: Bytes a micro-batch's own tensors may take (:data:`BATCH_SHARE` of the memory).
    """
    def ok(plan: Any) -> bool:
        return plan.phases["update"] <= room and batch_bytes(plan) <= batch_room

    def fits(k: int) -> bool:
        return ok(plan_at(k * BUDGET_STEP))

    whole = plan_at(0)
    if ok(whole):
        return 0, "the update of the whole mini-batch fits"
    lo, hi = math.ceil(row / BUDGET_STEP), max(math.ceil(row / BUDGET_STEP), mini_tokens // BUDGET_STEP)
    one_row = plan_at(lo * BUDGET_STEP)
    if not ok(one_row):
        if one_row.phases["update"] > room:
            return lo * BUDGET_STEP, "the smallest budget, one longest row: not even one row's update fits"
        return lo * BUDGET_STEP, (f"the smallest budget, one longest row: its tensors alone exceed {BATCH_SHARE:.3g} "
                                  "of the memory, but its update fits")
    while lo < hi:  # the update grows with the budget: the largest k that fits
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    if whole.phases["update"] <= room:
        return lo * BUDGET_STEP, (f"the largest budget whose micro-batch holds at most {BATCH_SHARE:.3g} of the memory "
                                  "(the whole mini-batch would fit, at no gain in speed)")
    return lo * BUDGET_STEP, "the largest budget whose update fits"


def fit_notes(plan: Any, memory: int, what: str, lora: bool, checkpointing: bool) -> list[str]:
    """Plain notes on every phase of ``plan`` (a :class:`~creditlab.run.memory.Plan`) that does
    not fit ``memory`` bytes (``what``: where the number comes from), with what would make it fit:
    first whether the model's state alone (weights, a KL reference, the optimizer state and, in
    the update, the gradients) is too large, which no batch setting helps."""
    room, out = usable(memory), []
    state = sum(plan.parts[p] for p in ("weights", "reference", "optimizer"))
    fixes = {"update": "set loss.micro_batch_tokens lower" + ("" if checkpointing else " or model.gradient_checkpointing=true"),
             "evaluation": "lower eval.batch_size and backend.max_batch_size",
             "generation": "lower backend.max_batch_size",
             "checkpoint": "checkpoint less often (its buffer is the trained state once more)"}
    for phase, need in plan.phases.items():
        held = state + (plan.parts["gradients"] if phase == "update" else 0)
        if need <= room:
            continue
        if held > room:
            fix = (f"the model's state alone (weights{', gradients' if phase == 'update' else ''} and optimizer state) "
                   f"takes {held / GIB:.1f} GiB: " + ("" if lora else "train LoRA adapters (model.lora.enabled=true), ")
                   + "shard it over more devices (trainer=fsdp or deepspeed), or use a device with more memory")
        elif phase.startswith("advantage"):
            fix = ("an upper bound (every response at its budget, every state and answer distinct); lower the "
                   "estimator's rows per call (advantage.chunk_size, advantage.max_rows) or loss.micro_batch_size")
        else:
            fix = fixes.get(phase, "lower the batch")
        out.append(f"does not fit: {phase} needs {need / GIB:.1f} GiB, {room / GIB:.1f} GiB usable of "
                   f"{memory / GIB:.1f} GiB ({what}); {fix}")
    return out


def reset_peak_memory() -> None:
    """Start a new peak of this process's resident memory (Linux: ``/proc/self/clear_refs``
    ``5`` resets ``VmHWM``); nothing elsewhere."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_memory() -> dict[str, float]:
    """``{"peak_rss_gib": ...}``: the process's peak resident memory since
    :func:`reset_peak_memory` (``VmHWM``), or ``{}`` where the system does not tell."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return {"peak_rss_gib": int(line.split()[1]) / 2**20}
    except OSError:
        pass
    return {}

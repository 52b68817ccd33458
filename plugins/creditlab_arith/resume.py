"""Resume points for long supervised warm starts (a real-model build takes hours on 2 cores, and a
killed process used to lose all of it).

A resume point is one file holding everything the warm-start loop needs to carry on as if it had
never stopped: the trainable parameters (a LoRA adapter's, or all of a small model's), AdamW's
moments, the learning-rate schedule's position, the data-order generator's state and the rows it
has still to serve, the step, the loss averages and the held-out checks so far. Resuming from it
on the same machine and thread count gives the same weights, bit for bit, as a run that never
stopped (``tests/unit/test_warm_start_resume.py``). It is written every ``save_every`` steps to a
temporary name and renamed, so a kill while writing leaves the previous point intact.

The file is only ever read back for the same build: its name carries the build's cache key (every
argument that changes the weights), and :func:`load` also checks the step count it was made for.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

#: Bump when the file's contents change shape.
FORMAT = 1


def trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters the optimizer moves, by name (detached; not copies)."""
    return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}


def save(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any,
         gen: torch.Generator, loop: dict[str, Any]) -> None:
    """Write a resume point for the state after ``loop["step"]`` finished steps (atomically)."""
    state = {"format": FORMAT, "params": trainable(model), "optimizer": opt.state_dict(),
             "scheduler": sched.state_dict(), "generator": gen.get_state(), "loop": loop}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load(path: Path | None, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any,
         gen: torch.Generator, steps: int) -> dict[str, Any] | None:
    """Restore the state saved at ``path`` into ``model``, ``opt``, ``sched`` and ``gen``; returns
    the loop's state, or ``None`` (and touches nothing) when there is no usable point: no file, an
    older format, a run of another length or other parameters. A point that cannot be used is
    said, never silently mixed into another build."""
    if path is None or not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    params = dict(model.named_parameters())
    names = trainable(model).keys()
    why = None
    if state.get("format") != FORMAT:
        why = f"format {state.get('format')!r}, not {FORMAT}"
    elif state["loop"].get("steps") != steps:
        why = f"made for {state['loop'].get('steps')} steps, not {steps}"
    elif set(state["params"]) != set(names) or any(
            state["params"][n].shape != params[n].shape for n in names):
        why = "its parameters are not this model's"
    if why is not None:
        print(f"[warm start] not resuming from {path}: {why}; starting over")
        return None
    with torch.no_grad():
        for name in names:
            params[name].copy_(state["params"][name])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    gen.set_state(state["generator"])
    print(f"[warm start] resuming from {path} after step {state['loop']['step']} of {steps}")
    return state["loop"]

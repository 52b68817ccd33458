"""What IBPO holds while it estimates, for the memory plan (``creditlab train --dry-run``,
loss.micro_batch_tokens=auto): entry point ``creditlab.advantage_memory`` ``ibpo``, a callable
``(config, step) -> {component: bytes}`` (``step``: ``creditlab.run.memory_phases.StepDims``).

``mode=contrast`` holds nothing beyond the batch. ``mode=repair``: one repair request a row,
generated as rollouts are, ``step.generation`` for ``R`` rows whose context holds the prompt and
two attempts, ``prompt + 2T`` tokens (the repair prompt's own words not counted).
"""

from __future__ import annotations

from typing import Any


def ibpo_memory(config: Any, step: Any) -> dict[str, float]:
    """The repairs' generation tensors and KV cache (bytes); nothing in ``contrast`` mode."""
    if config.mode != "repair":
        return {}
    tensors, cache = step.generation(step.rows, step.prompt + 2 * step.T)
    return {"advantage generation tensors": tensors, "advantage kv cache": cache}

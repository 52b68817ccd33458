"""What Monte-Carlo values hold while they estimate, for the memory plan (``creditlab train
--dry-run``, loss.micro_batch_tokens=auto): entry point ``creditlab.advantage_memory``
``mc_value``, a callable ``(config, step) -> {component: bytes}`` (``step``:
``creditlab.run.memory_phases.StepDims``).

``rollouts`` continuations of each of the ``R · S`` states (``S`` = ``step.segments``, the
segmenter's segments a row at most), generated as rollouts are: ``step.generation`` for ``R · S ·
rollouts`` rows (at most ``backend.max_batch_size`` a batch) whose context is the prompt and up to
``T`` response tokens.
"""

from __future__ import annotations

from typing import Any


def mc_value_memory(config: Any, step: Any) -> dict[str, float]:
    """The continuations' generation tensors and KV cache (bytes)."""
    states = step.rows * max(1, step.segments)
    tensors, cache = step.generation(states * int(config.rollouts), step.prompt + step.T)
    return {"advantage generation tensors": tensors, "advantage kv cache": cache}

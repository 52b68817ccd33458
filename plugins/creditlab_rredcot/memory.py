"""What RREDCoT holds while it estimates, for the memory plan (``creditlab train --dry-run``,
loss.micro_batch_tokens=auto): entry point ``creditlab.advantage_memory`` ``rredcot``, a callable
``(config, step) -> {component: bytes}`` (``step``: ``creditlab.run.memory_phases.StepDims``; ``R``
rows, ``G`` the group size, ``L = prompt + T``, ``kv`` bytes of keys and values per token, ``m``
the handle's rows per forward, 0 = all).

One ``branch_logprobs`` call per ``j = max_rows`` branches (0: all ``J = R · S · A``: ``S`` states
a row, 1 + the segmenter's segments at most, ``step.segments``; ``A = G`` answers per pool), no
grad. A call's trunks (``t = R``, or ``min(R, j)`` with ``max_rows``) run once: ``t · L · kv`` of
cache and ``step.no_grad(t · L)`` of temporaries. Each of the ``b = min(j, m)`` branches of a
forward gets a copy of its trunk's cache and continues it by ``M = answer + 8`` tokens (cue, an
answer of at most ``step.answer`` = 16 tokens, suffix): ``b · (L + M) · kv``; then
``step.logprob_tensors(b, M)``. An upper bound: every segment boundary a new state, every row of
a group a distinct answer (the estimator deduplicates both).
"""

from __future__ import annotations

from typing import Any


def rredcot_memory(config: Any, step: Any) -> dict[str, float]:
    """RREDCoT's tensors while it estimates, by component (bytes; the module docstring)."""
    L, R, M = step.prompt + step.T, step.rows, step.answer + 8
    branches = R * (1 + step.segments) * step.group
    j = min(int(config.max_rows) or branches, branches)
    t = min(R, j) if config.max_rows else R
    b = min(j, step.micro) if step.micro else j
    return {"advantage kv cache": t * L * step.kv + b * (L + M) * step.kv,
            "advantage activations": step.no_grad(t * L), "advantage logits": step.logprob_tensors(b, M)}

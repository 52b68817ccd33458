"""Contract checks and fakes for testing creditlab parts, shipped for plug-in authors.

``check_part(kind, part)`` runs the contract every part of ``kind`` must pass;
``check_config(overrides)`` composes and validates a run's config as ``creditlab train`` would.
"""

from creditlab.testing.contracts import (
    check_advantage,
    check_backend,
    check_common,
    check_config,
    check_part,
    check_reset_selector,
    check_rollout_strategy,
    check_segmenter,
    check_task,
    check_verifier,
)
from creditlab.testing.fakes import FakePolicyHandle, FakeSampler, make_batch, pad_batch

__all__ = [
    "check_advantage", "check_backend", "check_common", "check_config", "check_part",
    "check_reset_selector", "check_rollout_strategy", "check_segmenter", "check_task",
    "check_verifier", "FakePolicyHandle", "FakeSampler", "make_batch", "pad_batch",
]

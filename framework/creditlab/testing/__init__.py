"""Contract checks and fakes for testing creditlab parts, shipped for plug-in authors."""

from creditlab.testing.contracts import (
    check_advantage,
    check_backend,
    check_common,
    check_part,
    check_reset_selector,
    check_segmenter,
    check_task,
    check_verifier,
)
from creditlab.testing.fakes import FakePolicyHandle, make_batch, pad_batch

__all__ = [
    "check_advantage", "check_backend", "check_common", "check_part", "check_reset_selector",
    "check_segmenter", "check_task", "check_verifier", "FakePolicyHandle", "make_batch", "pad_batch",
]

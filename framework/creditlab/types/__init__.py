"""Data that crosses interfaces: frozen dataclasses (tensor shapes in the docstrings,
:mod:`~creditlab.types.data`), the rollout settings every part may read
(:mod:`~creditlab.types.rollout_settings`), and typed metric values
(:mod:`~creditlab.types.metric_values`). Import them from here (or from ``creditlab``).

Coordinates: a trajectory's *response* is every token after the prompt, including a prefix the
rollout strategy copied from another trajectory. Response positions are 0-based;
``trainable_from`` is the first response position that is trained on (0 normally, the copied
prefix's length for a continuation that trains only on what it generated).
"""

from creditlab.types.data import (
    Advantages,
    Completion,
    GenerationRequest,
    Problem,
    ResetPoint,
    Rewards,
    RolloutBatch,
    SamplingParams,
    Segments,
    Spans,
    StepOracle,
    Trajectory,
)
from creditlab.types.metric_values import Max, Mean, Metric, Min, Sum, reduction
from creditlab.types.rollout_settings import TRUNCATION_POLICIES, RolloutConfig, ThoughtConfig

__all__ = [
    "StepOracle", "Problem", "SamplingParams", "GenerationRequest", "Completion", "Rewards",
    "Trajectory", "Spans", "Segments", "ResetPoint", "RolloutBatch", "Advantages",
    "TRUNCATION_POLICIES", "ThoughtConfig", "RolloutConfig",
    "Metric", "Sum", "Mean", "Max", "Min", "reduction",
]

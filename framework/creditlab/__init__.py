"""creditlab: a plug-in research framework for credit assignment in RL of language models with
verifiable rewards.

This module is the public API for plug-in authors: import from ``creditlab`` (and the contract
checks from ``creditlab.testing``), not from the modules behind it, which may move. It holds the
interfaces a part implements, the data types that cross them, the errors to raise, the registry
helpers, the shared advantage and thought-span helpers, the typed metric values and
``__version__``. ``docs/writing-a-plugin.md`` shows a complete plug-in.
"""

from importlib import metadata as _metadata

from creditlab import testing  # contract checks and fakes: creditlab.testing
from creditlab.errors import ConfigError, InputError, RegistryError
from creditlab.interfaces import (
    AdvantageEstimator,
    DecodeWatch,
    GenerationBackend,
    Part,
    PolicyHandle,
    ResetSelector,
    RolloutStrategy,
    SampleFn,
    Segmenter,
    Task,
    Verifier,
)
from creditlab.registry import REGISTRIES, build_config, build_part, conf_dirs, registry
from creditlab.step.advantages import STD_OPTIONS, broadcast, group_advantages
from creditlab.step.generation import completion_spans, span_texts, thought_spans
from creditlab.step.policy import encode_prompt
from creditlab.types import (
    Advantages,
    Completion,
    GenerationRequest,
    Max,
    Mean,
    Metric,
    Min,
    Problem,
    ResetPoint,
    Rewards,
    RolloutBatch,
    RolloutConfig,
    SamplingParams,
    Segments,
    Spans,
    StepOracle,
    Sum,
    Trajectory,
)

try:
    __version__ = _metadata.version("creditlab")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "__version__",
    # interfaces
    "Part", "Task", "GenerationBackend", "Verifier", "Segmenter", "ResetSelector",
    "RolloutStrategy", "AdvantageEstimator", "PolicyHandle", "SampleFn", "DecodeWatch",
    # data types
    "Problem", "SamplingParams", "GenerationRequest", "Completion", "Rewards", "Trajectory",
    "Spans", "Segments", "ResetPoint", "RolloutBatch", "Advantages", "StepOracle", "RolloutConfig",
    # metric values
    "Metric", "Sum", "Mean", "Max", "Min",
    # errors
    "ConfigError", "InputError", "RegistryError",
    # registry helpers
    "REGISTRIES", "registry", "build_config", "build_part", "conf_dirs",
    # helpers for estimators and selectors
    "group_advantages", "broadcast", "STD_OPTIONS", "thought_spans", "completion_spans",
    "span_texts", "encode_prompt",
    # contract checks and fakes
    "testing",
]

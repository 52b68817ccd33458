"""The abstract interfaces every part implements (:mod:`~creditlab.interfaces.parts`) and what a
part may ask of the policy (:mod:`~creditlab.interfaces.handle`). Import them from here (or from
``creditlab``).

Each kind has one main abstract method, a nested ``Config`` dataclass (YAML keys are validated
against its fields; an unknown key is an error) and ``metrics()`` logged as
``train/<kind>/<key>``, each value saying how it combines over ranks
(:class:`~creditlab.types.Sum`, :class:`~creditlab.types.Mean`, ...). Parts are built through
:mod:`creditlab.registry`, never ``_target_``.
"""

from creditlab.interfaces.handle import PolicyHandle, check_frozen, offset_embeddings
from creditlab.interfaces.parts import (
    INTERFACES,
    AdvantageEstimator,
    DecodeWatch,
    EmptyConfig,
    GenerationBackend,
    Part,
    ResetSelector,
    RolloutStrategy,
    SampleFn,
    Segmenter,
    Task,
    Verifier,
)

__all__ = [
    "SampleFn", "EmptyConfig", "Part", "check_frozen", "offset_embeddings", "PolicyHandle", "Task",
    "GenerationBackend", "DecodeWatch", "Verifier", "Segmenter", "ResetSelector", "RolloutStrategy",
    "AdvantageEstimator", "INTERFACES",
]

"""The abstract interfaces every part implements.

Each kind has one main abstract method, a nested ``Config`` dataclass (YAML keys are validated
against its fields; an unknown key is an error) and ``metrics()`` logged as
``train/<kind>/<key>``, each value saying how it combines over ranks
(:class:`~creditlab.types.Sum`, :class:`~creditlab.types.Mean`, ...). Parts are built through
:mod:`creditlab.registry`, never ``_target_``. What a part may ask of the policy is
:class:`~creditlab.interfaces.handle.PolicyHandle`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from creditlab.interfaces.handle import PolicyHandle
from creditlab.types import (
    Advantages,
    Completion,
    GenerationRequest,
    Problem,
    ResetPoint,
    Rewards,
    RolloutBatch,
    RolloutConfig,
    SamplingParams,
    Segments,
    Spans,
    Trajectory,
)

#: ``(problems, requests, seed) -> trajectories``: sample one completion per request (continuing
#: its ``prefix_ids``) with the run's rollout settings and score it with the run's verifier.
#: ``requests[i]`` belongs to ``problems[i]``; the trajectories come back in request order with
#: ``group_id`` -1 (for the caller to assign) and ``trainable_from`` at the prefix end.
SampleFn = Callable[[Sequence[Problem], Sequence[GenerationRequest], int], "list[Trajectory]"]


@dataclass
class EmptyConfig:
    """A part with no options."""


class Part(abc.ABC):
    """Shared base: holds the validated config and reports metrics."""

    #: Registry kind, set on each interface below.
    kind: ClassVar[str] = ""
    #: The part's config schema. Subclasses override with their own dataclass.
    Config: ClassVar[type] = EmptyConfig

    def __init__(self, config: Any | None = None) -> None:
        self.config = config if config is not None else self.Config()

    def metrics(self) -> dict[str, float]:
        """Scalars accumulated since the last call (then reset), logged as train/<kind>/<key>.

        Each value is a :class:`~creditlab.types.Sum`, :class:`~creditlab.types.Mean`,
        :class:`~creditlab.types.Max` or :class:`~creditlab.types.Min` (a plain float is a mean):
        that decides how it combines over data-parallel ranks.
        """
        return {}

    def reset_metrics(self) -> None:
        """Forget what :meth:`metrics` would report now (e.g. counts an evaluation caused), so the
        next call covers only what follows."""
        self.metrics()


class Task(Part):
    """A source of problems."""

    kind = "task"

    @abc.abstractmethod
    def load(self, split: str) -> Sequence[Problem]:
        """Problems of ``split`` (``"train"`` or ``"test"``)."""


class DecodeWatch(abc.ABC):
    """Reads a decoding pass token by token and ends rows early: how thought-by-thought
    generation runs in one backend call (:func:`creditlab.step.generation.generate_thoughts`)."""

    @abc.abstractmethod
    def observe(self, row: int, token: int) -> str | None:
        """Called once for each token sampled for request ``row`` that neither is its EOS nor
        completes one of the call's stop strings (those end the row as usual), in order.
        Returns ``"stop"`` or ``"length"`` to end the row after this token (its finish
        reason), else ``None``."""


class GenerationBackend(Part):
    """Samples completions from the policy."""

    kind = "backend"
    #: Whether :meth:`generate_watched` is implemented.
    watches: ClassVar[bool] = False

    def __init__(self, config: Any | None = None, *, model: Any, tokenizer: Any) -> None:
        """Args: config: the backend's Config; model: the policy (a ``transformers`` causal LM,
        the very module being trained); tokenizer: its tokenizer."""
        super().__init__(config)
        self.model = model
        self.tokenizer = tokenizer

    @abc.abstractmethod
    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams
    ) -> list[Completion]:
        """One completion per request, in request order."""

    def generate_watched(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams, watch: DecodeWatch
    ) -> list[Completion]:
        """:meth:`generate`, with ``watch`` shown every token and ending rows where it says
        (backends with ``watches = True``)."""
        raise NotImplementedError(f"{type(self).__name__} does not decode with a DecodeWatch")

    def load_weights(self, state_dict: dict[str, torch.Tensor] | None) -> None:  # noqa: B027
        """Sync the engine's weights with the trainer's, after every RL step.

        Args:
            state_dict: Checkpoint-format tensors, or None: the backend takes the current weights
                of ``self.model`` itself (what the module passes). No-op for backends sampling
                from the module itself.
        """

    def release(self) -> None:  # noqa: B027
        """Free what the backend keeps between ``generate`` calls (e.g. the keys/values of rows
        it decoded, for later calls that continue them): called before every update, so that
        the update's memory is its own. Default: nothing kept."""

    def describe(self) -> dict[str, Any]:
        """What a run records about how this backend generates (``environment.json``'s
        ``backend`` entry and the W&B config), e.g. the speed path it chose. Default: nothing."""
        return {}

    def close(self) -> None:  # noqa: B027
        """Release engines, worker processes or other resources (the run calls it at the end)."""


class Verifier(Part):
    """Scores completions."""

    kind = "verifier"

    @abc.abstractmethod
    def score(self, problems: Sequence[Problem], completions: Sequence[Completion]) -> Rewards:
        """One reward per (problem, completion) pair."""

    def close(self) -> None:  # noqa: B027
        """Release worker processes or other resources."""


class Segmenter(Part):
    """Splits responses into spans (steps, thoughts, segments)."""

    kind = "segmenter"

    def __init__(self, config: Any | None = None, *, tokenizer: Any = None) -> None:
        """Args: config: the segmenter's Config; tokenizer: the policy's tokenizer (segmenters
        that look at token text need it)."""
        super().__init__(config)
        self.tokenizer = tokenizer

    @abc.abstractmethod
    def segment(self, batch: RolloutBatch) -> Segments:
        """Spans per trajectory, partitioning ``batch.response_mask`` exactly."""


class ResetSelector(Part):
    """Picks where to reset a failed trajectory (for rollout strategies that reset, e.g. RRPO's
    and SRPO's; arXiv 2605.25507)."""

    kind = "reset_selector"

    @abc.abstractmethod
    def select(self, trajectory: Trajectory, spans: Spans, ctx: PolicyHandle) -> ResetPoint:
        """A segment index of ``trajectory`` to regenerate from, or ``ResetPoint(None)``.

        Args:
            trajectory: A failed chain (the seed); never trained on.
            spans: Its thought spans ``((start, end), ...)`` over ``completion.response_ids``.
            ctx: The current policy.
        """

    def select_many(
        self, trajectories: Sequence[Trajectory], spans: Sequence[Spans], ctx: PolicyHandle
    ) -> list[ResetPoint]:
        """:meth:`select` for several seeds at once; override to batch model calls."""
        return [self.select(t, s, ctx) for t, s in zip(trajectories, spans)]


class RolloutStrategy(Part):
    """Turns one RL step's problems into trajectories placed in advantage groups.

    ``plain`` (the core's) samples ``group_size`` i.i.d. completions per problem, one group per
    problem; a strategy may instead build a tree (continuations of prefixes of earlier chains),
    asking the run's :class:`ResetSelector` where to branch. Whatever it builds, a strategy trains
    on ``rollout.group_size`` trajectories per problem, so methods compare on equal budgets.

    The ``rollout`` config section holds ``name`` (the strategy), the core's
    :class:`~creditlab.types.RolloutConfig` keys (sampling, thoughts, truncation) and the
    strategy's own ``Config`` keys.
    """

    kind = "rollout"
    #: Whether :meth:`collect` asks the run's reset selector (which must then not be ``none``);
    #: strategies that do not use one refuse any other selector, so no setting is silently idle.
    uses_reset_selector: ClassVar[bool] = False

    def __init__(
        self,
        config: Any | None = None,
        *,
        rollout: RolloutConfig | None = None,
        tokenizer: Any = None,
        reset_selector: ResetSelector | None = None,
    ) -> None:
        """Args: config: the strategy's Config; rollout: the run's core rollout settings;
        tokenizer: the policy's tokenizer; reset_selector: the run's selector (``none`` unless
        :attr:`uses_reset_selector`)."""
        super().__init__(config)
        self.rollout = rollout if rollout is not None else RolloutConfig()
        self.tokenizer = tokenizer
        self.reset_selector = reset_selector

    @classmethod
    def check(cls, config: Any, rollout: RolloutConfig) -> None:
        """Raise :class:`~creditlab.errors.ConfigError` when this strategy cannot run with these
        settings (called before the model loads). Default: nothing to check."""

    @abc.abstractmethod
    def collect(
        self, problems: Sequence[Problem], ctx: PolicyHandle, sample: SampleFn, seed: int
    ) -> list[Trajectory]:
        """The step's trajectories to train on.

        Args:
            problems: This rank's problems of the step.
            ctx: The current policy (``encode`` gives each problem's prompt ids).
            sample: Samples and scores continuations (see :data:`SampleFn`); every token it
                generates is counted as generated, trained on or not.
            seed: The step's seed (same seed, same trajectories).

        Returns:
            ``group_size`` trajectories per problem, each with its advantage ``group_id``
            (>= 0; a group holds trajectories of one problem) and ``trainable_from``.
        """


class AdvantageEstimator(Part):
    """Turns rewards (and anything it asks of the policy) into per-token advantages."""

    kind = "advantage"

    @abc.abstractmethod
    def estimate(self, batch: RolloutBatch, ctx: PolicyHandle) -> Advantages:
        """``(B, T)`` advantages, zero wherever ``batch.loss_mask`` is 0.

        ``batch`` arrives on the policy's device; an estimator may return its values on that
        device or on the host (the step moves them once). Per-row Python bookkeeping is best done
        on ``batch.to("cpu")`` (one copy), never element by element on an accelerator."""


#: Registry kind -> interface. The order is the order of ``creditlab plugins``.
INTERFACES: dict[str, type[Part]] = {
    cls.kind: cls
    for cls in (
        Task, GenerationBackend, Verifier, Segmenter, ResetSelector, RolloutStrategy,
        AdvantageEstimator,
    )
}

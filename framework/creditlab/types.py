"""Data that crosses interfaces: frozen dataclasses (tensor shapes in the docstrings), the rollout
settings every part may read, and typed metric values.

Coordinates: a trajectory's *response* is every token after the prompt, including a prefix the
rollout strategy copied from another trajectory. Response positions are 0-based;
``trainable_from`` is the first response position that is trained on (0 normally, the copied
prefix's length for a continuation that trains only on what it generated).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

import torch

#: Given the thoughts (strings) of a trajectory, return the 0-based index of the first wrong
#: thought, or ``None`` when every thought is correct.
StepOracle = Callable[[Sequence[str]], "int | None"]


@dataclass(frozen=True)
class Problem:
    """One task instance.

    Attributes:
        id: Stable identifier (unique within a task split).
        prompt: The text the policy is conditioned on.
        answer: The reference answer, as text, for the verifier.
        metadata: Free-form task data (e.g. the gold solution steps).
        oracle: Optional step oracle (see :data:`StepOracle`); ``None`` when the task has none.
    """

    id: str
    prompt: str
    answer: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    oracle: StepOracle | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one ``generate`` call. Backends must honour every field exactly.

    ``top_k=0`` means no top-k truncation; ``temperature=0`` means greedy decoding.
    ``stop`` strings end a sequence after the token that completes them (kept in the output).
    ``seed`` seeds the call's sampling RNG (same seed + same requests => same completions).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class GenerationRequest:
    """Generate a continuation of ``prompt_ids + prefix_ids``.

    Attributes:
        prompt_ids: Token ids of the prompt.
        prefix_ids: Response token ids to continue from (a reset prefix); never re-tokenized.
        prefix_segment_ids: Optional thought index of each prefix token (shape (len(prefix_ids),),
            e.g. the seed's ``Completion.segment_ids[:len(prefix)]``), read by thought-by-thought
            generation instead of recounting delimiters, which would merge a thought capped
            without delimiter with the next one. Backends ignore it.
    """

    prompt_ids: tuple[int, ...]
    prefix_ids: tuple[int, ...] = ()
    prefix_segment_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Completion:
    """One sampled response.

    Attributes:
        prompt_ids: The prompt token ids, shape (P,).
        response_ids: prefix ids + generated ids, shape (R,). ``response_ids[:prefix_len]`` equal
            the request's ``prefix_ids`` exactly.
        logprobs: Log-probabilities of the *generated* tokens under the sampling distribution's
            temperature (before top-p/top-k truncation), shape (R - prefix_len,).
        finish_reason: ``"eos"``, ``"stop"`` (a stop string) or ``"length"`` (budget exhausted).
        text: Decoded response (prefix included).
        prefix_len: Number of response tokens copied from the request's prefix.
        segment_ids: Optional thought index per response token, shape (R,), from thought-by-thought
            generation.
        entropies: Optional predictive entropy (nats) of the distribution each *generated* token
            was drawn from, shape (R - prefix_len,): ``H(softmax(logits / T))`` at the sampling
            temperature T (T = 1 when greedy), before top-p/top-k truncation, like ``logprobs``.
            ``None`` when the backend did not record them; prefix tokens have none.
    """

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    text: str
    prefix_len: int = 0
    segment_ids: tuple[int, ...] | None = None
    entropies: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Rewards:
    """Verifier output for a list of completions.

    Attributes:
        values: One float reward per completion.
        info: One dict per completion: at least ``parsed`` (the extracted answer or ``None``) and
            ``outcome`` (``"correct"``, ``"wrong"``, ``"no_answer"``, ``"timeout"``, ``"error"``).
    """

    values: tuple[float, ...]
    info: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class Trajectory:
    """A scored completion placed in the rollout tree.

    Attributes:
        problem: The problem it answers.
        completion: The sampled response.
        reward: Scalar reward from the verifier.
        group_id: Advantage group (trajectories compared with one another share it).
        trainable_from: First trainable response position (0, or the reset prefix length).
        role: A label set by the rollout strategy: ``"base"`` for a fresh chain (the ``plain``
            strategy's only role); strategies that build trees add their own (e.g. ``"reset"``).
        info: Verifier info and the rollout strategy's annotations.
    """

    problem: Problem
    completion: Completion
    reward: float
    group_id: int
    trainable_from: int = 0
    role: str = "base"
    info: Mapping[str, Any] = field(default_factory=dict)


#: Token spans ``(start, end)`` (end exclusive) per trajectory, in response coordinates.
Spans = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Segments:
    """Segmentation of each trajectory's response; spans partition ``response_mask`` exactly."""

    spans: tuple[Spans, ...]


@dataclass(frozen=True)
class ResetPoint:
    """Where to reset a failed trajectory (a :class:`~creditlab.interfaces.ResetSelector`'s answer).

    Attributes:
        segment: 0-based index of the segment to regenerate from (the prefix is every segment
            before it), or ``None`` for "no reset".
        info: Selector diagnostics (e.g. parse failure, raw model answer).
    """

    segment: int | None
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutBatch:
    """Padded tensors for one rollout batch of B trajectories.

    Layout: ``input_ids`` is the left-padded prompt (P columns) followed by the right-padded
    response (T columns); logits at column ``P + t - 1`` predict response token ``t``.

    Attributes:
        input_ids: (B, P+T) long.
        attention_mask: (B, P+T) long, 1 on real tokens.
        prompt_len: P, the number of prompt columns.
        response_ids: (B, T) long, pad where ``response_mask`` is 0.
        response_mask: (B, T) float, 1 on real response tokens.
        loss_mask: (B, T) float, 1 on trained tokens (``response_mask`` from ``trainable_from`` on,
            minus tokens removed by the truncation policy).
        group_ids: (B,) long.
        rewards: (B,) float.
        gen_logprobs: (B, T) float, the backend's log-probs of generated tokens (0 elsewhere).
        trajectories: The B trajectories in row order.
        segments: Filled by the segmenter; ``None`` before.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_len: int
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    loss_mask: torch.Tensor
    group_ids: torch.Tensor
    rewards: torch.Tensor
    gen_logprobs: torch.Tensor
    trajectories: tuple[Trajectory, ...]
    segments: Segments | None = None

    @property
    def size(self) -> int:
        return self.response_ids.shape[0]

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The batch with every tensor on ``device`` (itself when they are there already)."""
        device = torch.device(device)
        if self.input_ids.device == device:
            return self
        moved = {f.name: v.to(device) for f in fields(self)
                 if isinstance(v := getattr(self, f.name), torch.Tensor)}
        return replace(self, **moved)


@dataclass(frozen=True)
class Advantages:
    """Estimator output.

    Attributes:
        values: (B, T) float, zero wherever ``loss_mask`` is 0.
        metrics: Scalars to log under ``train/advantage/<key>``.
    """

    values: torch.Tensor
    metrics: Mapping[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Rollout settings (the ``rollout`` config section's core keys)
# ---------------------------------------------------------------------------------------------
TRUNCATION_POLICIES = ("keep", "mask", "penalize")


@dataclass
class ThoughtConfig:
    """Thought-level generation settings (:func:`creditlab.step.generation.generate_thoughts`).

    Attributes:
        delimiter: Text ending a thought; a stop string of each round, kept in the tokens.
        max_thoughts: At most this many thoughts per response, thoughts of a request's prefix
            included (a prefix ending mid-thought: that thought counts once it is finished).
        max_thought_tokens: Token cap of one thought; a thought hitting it without the delimiter
            still counts as a thought.
        final_marker: A thought whose text contains it ends the response (``""`` disables).
        end_at_eos: A thought ending with EOS ends the response; ``False`` asks for the next
            thought after it (EOS kept in the tokens) until ``final_marker`` or the thought budget,
            as some official thought loops do (docs/paper-presets.md).
    """

    delimiter: str = "</thought>"
    max_thoughts: int = 20
    max_thought_tokens: int = 256
    final_marker: str = "\\boxed{"
    end_at_eos: bool = True


@dataclass
class RolloutConfig:
    """How completions are sampled and turned into trainable rows: the ``rollout`` section's
    core keys (the chosen rollout strategy adds its own keys to the same section).

    Attributes:
        group_size: Trainable completions per prompt (G; the budget a strategy fills).
        temperature, top_p, top_k: Sampling settings for training rollouts.
        max_new_tokens: Response budget for plain generation.
        thoughts: Generate thought by thought (METHODS.md §2) instead of in one call.
        delimiter, max_thoughts, max_thought_tokens, final_marker, end_at_eos: Thought generation
            settings (:class:`ThoughtConfig`).
        truncation: Completions that hit the budget: ``keep`` (train as is), ``mask`` (no loss on
            them) or ``penalize`` (reward replaced by ``truncation_reward``).
        truncation_reward: Reward given to truncated completions under ``penalize``.
        success_reward: A chain with at least this reward is correct, for every part that asks
            (credit metrics, rollout strategies, estimators that contrast outcomes).
        chat_template: How problem prompts of rollouts and evaluation are encoded: ``"auto"``
            (the tokenizer's chat template when it has one), ``True`` (the template, required) or
            ``False`` (the plain text, for prompts written as a raw completion).
    """

    group_size: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    thoughts: bool = False
    delimiter: str = "</thought>"
    max_thoughts: int = 20
    max_thought_tokens: int = 256
    final_marker: str = "\\boxed{"
    end_at_eos: bool = True
    truncation: str = "keep"
    truncation_reward: float = 0.0
    success_reward: float = 1.0
    chat_template: bool | str = "auto"

    def __post_init__(self) -> None:
        if not (self.chat_template == "auto" or isinstance(self.chat_template, bool)):
            raise ValueError(f"rollout.chat_template must be auto, true or false, got {self.chat_template!r}")
        if not isinstance(self.end_at_eos, bool):
            raise ValueError(f"rollout.end_at_eos must be true or false, got {self.end_at_eos!r}")
        if self.group_size < 1:
            raise ValueError(f"rollout.group_size must be >= 1, got {self.group_size}")
        if self.truncation not in TRUNCATION_POLICIES:
            raise ValueError(
                f"rollout.truncation must be one of {TRUNCATION_POLICIES}, got '{self.truncation}'"
            )

    def sampling(self, seed: int | None) -> SamplingParams:
        """The training rollouts' :class:`SamplingParams`, seeded with ``seed``."""
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            seed=seed,
        )

    @property
    def thought_config(self) -> ThoughtConfig:
        return ThoughtConfig(
            delimiter=self.delimiter,
            max_thoughts=self.max_thoughts,
            max_thought_tokens=self.max_thought_tokens,
            final_marker=self.final_marker,
            end_at_eos=self.end_at_eos,
        )

    @property
    def response_budget(self) -> int:
        """The most response tokens one completion can have (Dr. GRPO's constant)."""
        if self.thoughts:
            return self.max_thoughts * self.max_thought_tokens
        return self.max_new_tokens


# ---------------------------------------------------------------------------------------------
# Metric values that say how they combine over data-parallel ranks
# ---------------------------------------------------------------------------------------------
class Metric(float):
    """A metric value (a ``float``) that says how it combines over data-parallel ranks.

    Parts return these from ``metrics()`` (and estimators in :attr:`Advantages.metrics`); a plain
    ``float`` counts as a :class:`Mean`. The reduction is a property of the value's type, never
    of the key's spelling. Arithmetic on them gives plain floats: wrap the final value.
    """

    reduce: ClassVar[str] = "mean"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({float(self)!r})"


class Sum(Metric):
    """A count or a total: summed over ranks (e.g. groups, tokens, calls)."""

    reduce = "sum"


class Mean(Metric):
    """A rate or a mean: averaged over ranks, weighted by each rank's rows."""

    reduce = "mean"


class Max(Metric):
    """A maximum over ranks."""

    reduce = "max"


class Min(Metric):
    """A minimum over ranks."""

    reduce = "min"


def reduction(value: float) -> str:
    """How ``value`` combines over ranks: its :class:`Metric` type's ``reduce``, ``"mean"`` for a
    plain float."""
    return value.reduce if isinstance(value, Metric) else "mean"

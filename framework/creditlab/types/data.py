"""The data that crosses interfaces: frozen dataclasses (tensor shapes in the docstrings).

Coordinates: a trajectory's *response* is every token after the prompt, including a prefix the
rollout strategy copied from another trajectory. Response positions are 0-based;
``trainable_from`` is the first response position that is trained on (0 normally, the copied
prefix's length for a continuation that trains only on what it generated).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from dataclasses import dataclass, field, fields, replace
from typing import Any

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
    ``seed`` seeds the call's sampling RNG (same seed + same requests => same completions from a
    backend in the same state; one that reuses keys/values it stored, as the HF backend's
    ``prefix_cache_mb``, may differ by float rounding).
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

    @cached_property
    def row_lengths(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) real prompt tokens and (B,) real response tokens of every row, on the CPU
        (computed once per batch: the masks never change)."""
        p = self.prompt_len
        return self.attention_mask[:, :p].sum(1).cpu(), self.response_mask.sum(1).cpu()

    @cached_property
    def prompt_keys(self) -> torch.Tensor:
        """(B,) long on the CPU, equal for rows whose prompts (tokens and padding) are equal: the
        rows a forward can run one prompt for (computed once per batch)."""
        p = self.prompt_len
        key = torch.cat([self.input_ids[:, :p], self.attention_mask[:, :p].to(self.input_ids.dtype)], 1)
        return torch.unique(key.cpu(), dim=0, return_inverse=True)[1]

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

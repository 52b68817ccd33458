"""Rollout settings: the ``rollout`` config section's core keys, which every part may read."""

from __future__ import annotations

from dataclasses import dataclass

from creditlab.types.data import SamplingParams

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
        decoding: ``rounds``: one backend call per thought, each continuing the sequence so far,
            round r seeded by ``round_seed(seed, r)``; ``one_pass``: one call, the thoughts ended
            token by token by the same rules (:class:`~creditlab.step.stops.ThoughtWatch`): the
            same distribution, other draws, no re-reading of the sequence at each thought.
    """

    delimiter: str = "</thought>"
    max_thoughts: int = 20
    max_thought_tokens: int = 256
    final_marker: str = "\\boxed{"
    end_at_eos: bool = True
    decoding: str = "rounds"


#: How thoughts are decoded: ``rounds`` (one backend call per thought) or ``one_pass`` (one call,
#: thoughts ended token by token: a backend with ``watches``, ``end_at_eos`` true).
THOUGHT_DECODINGS = ("rounds", "one_pass")


@dataclass
class RolloutConfig:
    """How completions are sampled and turned into trainable rows: the ``rollout`` section's
    core keys (the chosen rollout strategy adds its own keys to the same section).

    Attributes:
        group_size: Trainable completions per prompt (G; the budget a strategy fills).
        temperature, top_p, top_k: Sampling settings for training rollouts.
        max_new_tokens: Response budget for plain generation.
        thoughts: Generate thought by thought (METHODS.md §2) instead of in one call.
        delimiter, max_thoughts, max_thought_tokens, final_marker, end_at_eos, thought_decoding:
            Thought generation settings (:class:`ThoughtConfig`; ``thought_decoding`` is its
            ``decoding``).
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
    thought_decoding: str = "rounds"
    truncation: str = "keep"
    truncation_reward: float = 0.0
    success_reward: float = 1.0
    chat_template: bool | str = "auto"

    def __post_init__(self) -> None:
        if not (self.chat_template == "auto" or isinstance(self.chat_template, bool)):
            raise ValueError(f"rollout.chat_template must be auto, true or false, got {self.chat_template!r}")
        if not isinstance(self.end_at_eos, bool):
            raise ValueError(f"rollout.end_at_eos must be true or false, got {self.end_at_eos!r}")
        if self.thought_decoding not in THOUGHT_DECODINGS:
            raise ValueError(f"rollout.thought_decoding must be rounds or one_pass, got {self.thought_decoding!r}")
        if self.thought_decoding == "one_pass" and not self.end_at_eos:
            raise ValueError("rollout.thought_decoding=one_pass ends a chain at EOS: it needs rollout.end_at_eos=true "
                             "(or use rollout.thought_decoding=rounds)")
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
            decoding=self.thought_decoding,
        )

    @property
    def response_budget(self) -> int:
        """The most response tokens one completion can have (Dr. GRPO's constant)."""
        if self.thoughts:
            return self.max_thoughts * self.max_thought_tokens
        return self.max_new_tokens

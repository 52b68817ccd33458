"""The rollout tree: prompts -> trajectories (-> reset prefixes -> suffixes) -> a padded batch.

:class:`RolloutPlanner` samples groups of completions per prompt through a
:class:`~creditlab.interfaces.GenerationBackend`, scores them with a
:class:`~creditlab.interfaces.Verifier` and places them in advantage groups. Reset-based methods
extend the tree through their :class:`~creditlab.interfaces.ResetSelector` (``none`` here: plain
i.i.d. groups). :func:`collate` pads trajectories into a :class:`~creditlab.types.RolloutBatch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from creditlab.buffer import ResetBuffer, parse_split
from creditlab.generation import ThoughtConfig, generate_thoughts
from creditlab.interfaces import GenerationBackend, PolicyHandle, ResetSelector, Verifier
from creditlab.types import (
    Completion,
    GenerationRequest,
    Problem,
    ResetPoint,
    RolloutBatch,
    SamplingParams,
    Spans,
    Trajectory,
)

TRUNCATION_POLICIES = ("keep", "mask", "penalize")


@dataclass
class RolloutConfig:
    """How completions are sampled and turned into trainable rows.

    Attributes:
        group_size: Completions per prompt (G).
        temperature, top_p, top_k: Sampling settings for training rollouts.
        max_new_tokens: Response budget for plain generation.
        thoughts: Generate thought by thought (METHODS.md §2) instead of in one call.
        delimiter, max_thoughts, max_thought_tokens, final_marker: Thought generation settings.
        truncation: Completions that hit the budget: ``keep`` (train as is), ``mask`` (no loss on
            them) or ``penalize`` (reward replaced by ``truncation_reward``).
        truncation_reward: Reward given to truncated completions under ``penalize``.
        resets: ``"RxK"`` turns on the reset buffer of RRPO/SRPO (:mod:`creditlab.buffer`): per
            prompt, R reset groups of K suffixes plus a base group of ``group_size - R*K`` fresh
            chains; ``""`` = plain groups. Needs a reset selector other than ``none``.
        max_seed_draws: Fresh chains drawn per prompt while looking for seeds (failed chains).
        success_reward: A chain with at least this reward is correct (not a seed).
        mask_prefix: Suffixes train only after their reset prefix; ``false`` is the ``no_mask``
            ablation (the prefix tokens get the suffix's advantage too).
        draw_ahead: A prompt still lacking seeds after the first draw round draws all its
            remaining draws at once (at most two draw rounds; unused chains are counted as
            ``reset/speculative``); ``false`` draws as many as it can place, round after round.
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
    truncation: str = "keep"
    truncation_reward: float = 0.0
    resets: str = ""
    max_seed_draws: int = 12
    success_reward: float = 1.0
    mask_prefix: bool = True
    draw_ahead: bool = True

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"rollout.group_size must be >= 1, got {self.group_size}")
        if self.truncation not in TRUNCATION_POLICIES:
            raise ValueError(
                f"rollout.truncation must be one of {TRUNCATION_POLICIES}, got '{self.truncation}'"
            )
        if self.resets:
            parse_split(self.resets, self.group_size)
            if self.max_seed_draws < 1:
                raise ValueError(f"rollout.max_seed_draws must be >= 1, got {self.max_seed_draws}")

    def sampling(self, seed: int | None) -> SamplingParams:
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
        )

    @property
    def response_budget(self) -> int:
        """The most response tokens one completion can have (Dr. GRPO's constant)."""
        if self.thoughts:
            return self.max_thoughts * self.max_thought_tokens
        return self.max_new_tokens


class NoResetSelector(ResetSelector):
    """Never resets: plain GRPO-style groups."""

    def select(self, trajectory: Trajectory, spans: Spans, ctx: PolicyHandle) -> ResetPoint:
        return ResetPoint(None)


def sample(
    backend: GenerationBackend,
    requests: Sequence[GenerationRequest],
    cfg: RolloutConfig,
    sampling: SamplingParams,
) -> list[Completion]:
    """Plain or thought-by-thought generation, as configured."""
    if cfg.thoughts:
        return generate_thoughts(backend, requests, sampling, cfg.thought_config)
    return backend.generate(requests, sampling)


class RolloutPlanner:
    """Builds the trajectories of one RL step: plain groups, or the reset buffer.

    Args:
        cfg: Sampling, truncation and reset-buffer settings.
        backend: Generation backend.
        verifier: Scores completions.
        reset_selector: Chooses reset points; must be ``none`` exactly when ``cfg.resets`` is off.

    ``generated_tokens`` counts every token sampled through the planner since the last
    :meth:`take_generated_tokens` (trained or not: seeds, discarded chains, value rollouts).
    """

    def __init__(
        self,
        cfg: RolloutConfig,
        backend: GenerationBackend,
        verifier: Verifier,
        reset_selector: ResetSelector | None = None,
    ) -> None:
        self.cfg = cfg
        self.backend = backend
        self.verifier = verifier
        self.reset_selector = reset_selector
        self._counts: dict[str, float] = {}
        self.generated_tokens = 0
        plain = reset_selector is None or isinstance(reset_selector, NoResetSelector)
        if bool(cfg.resets) == plain:
            name = type(reset_selector).__name__
            raise ValueError(
                f"rollout.resets='{cfg.resets}' needs a reset selector (reset_selector=random, "
                "self_localize or oracle)"
                if cfg.resets
                else f"reset selector {name} does nothing without a reset buffer: set "
                "rollout.resets (e.g. rollout.resets=1x4) or use reset_selector=none"
            )
        self.buffer = None
        if cfg.resets:
            delim = backend.tokenizer.encode(cfg.delimiter, add_special_tokens=False)
            self.buffer = ResetBuffer(
                cfg.group_size, cfg.resets, cfg.max_seed_draws, cfg.success_reward,
                cfg.mask_prefix, delim, backend.tokenizer.eos_token_id, cfg.draw_ahead,
            )

    def collect(self, problems: Sequence[Problem], ctx: PolicyHandle, seed: int) -> list[Trajectory]:
        """The step's trajectories: G i.i.d. completions per problem (each problem its own
        advantage group), or the reset buffer when ``cfg.resets`` is set."""
        prompts = [ctx.encode(p.prompt) for p in problems]
        if self.buffer is not None:
            result = self.buffer.build(
                problems, prompts, self.sample_and_score, self.reset_selector, ctx, seed
            )
            for key, value in result.stats.items():
                self._count(f"reset/{key}", value)
            return result.trajectories
        g = self.cfg.group_size
        owners = [p for p in problems for _ in range(g)]
        requests = [GenerationRequest(ids) for ids in prompts for _ in range(g)]
        trajs = self.sample_and_score(owners, requests, seed)
        return [replace(t, group_id=i // g) for i, t in enumerate(trajs)]

    def sample_and_score(
        self, problems: Sequence[Problem], requests: Sequence[GenerationRequest], seed: int
    ) -> list[Trajectory]:
        """Sample one completion per request (continuing its prefix) and score it.

        Group ids are left at -1 for the caller to assign; ``trainable_from`` is the prefix end.
        """
        completions = sample(self.backend, requests, self.cfg, self.cfg.sampling(seed))
        self.generated_tokens += sum(len(c.logprobs) for c in completions)
        return self.score(problems, completions, group_ids=[-1] * len(completions))

    def take_generated_tokens(self) -> int:
        """Tokens generated through the planner since the last call (then reset)."""
        n, self.generated_tokens = self.generated_tokens, 0
        return n

    def score(
        self,
        problems: Sequence[Problem],
        completions: Sequence[Completion],
        group_ids: Sequence[int],
        role: str = "base",
        trainable_from: Sequence[int] | None = None,
    ) -> list[Trajectory]:
        """Verify completions and wrap them as trajectories (applying the truncation policy)."""
        rewards = self.verifier.score(problems, completions)
        out = []
        for i, (p, c) in enumerate(zip(problems, completions)):
            reward, info = float(rewards.values[i]), dict(rewards.info[i])
            truncated = c.finish_reason == "length"
            info["truncated"] = truncated
            if truncated and self.cfg.truncation == "penalize":
                reward = self.cfg.truncation_reward
            self._count("completions", 1)
            self._count("truncated", truncated)
            start = trainable_from[i] if trainable_from is not None else c.prefix_len
            out.append(Trajectory(p, c, reward, group_ids[i], start, role, info))
        return out

    def _count(self, key: str, value: float) -> None:
        self._counts[key] = self._counts.get(key, 0.0) + float(value)

    def metrics(self) -> dict[str, float]:
        c = self._counts
        n = max(c.get("completions", 0.0), 1.0)
        out = {"completions": c.get("completions", 0.0)}
        out["truncated_rate"] = c.get("truncated", 0.0) / n
        if "reset/prompts" in c:
            out.update(_reset_rates(c))
        self._counts = {}
        return out


def _reset_rates(c: dict[str, float]) -> dict[str, float]:
    """Reset-buffer counts -> the rates of METHODS.md §2."""
    prompts, seeds = max(c["reset/prompts"], 1.0), max(c["reset/seeds"], 1.0)
    known = max(c["reset/oracle_known"], 1.0)
    out = {
        "reset/fallback_rate": c["reset/fallback"] / prompts,
        "reset/seeds_per_prompt": c["reset/seeds"] / prompts,
        "reset/draws_per_prompt": c["reset/draws"] / prompts,
        "reset/discarded": c["reset/discarded"],
        "reset/speculative": c["reset/speculative"],
        "reset/suffix_success": c["reset/suffix_correct"] / max(c["reset/suffixes"], 1.0),
        "reset/position": c["reset/reset_thought"] / seeds,
        "reset/position_relative": c["reset/reset_relative"] / seeds,
    }
    if c["reset/oracle_known"] > 0:
        for key in ("oracle_exact", "oracle_early", "oracle_late", "clean_prefix"):
            out[f"reset/{key}"] = c[f"reset/{key}"] / known
    return out


def collate(
    trajectories: Sequence[Trajectory],
    pad_id: int,
    truncation: str = "keep",
) -> RolloutBatch:
    """Pad trajectories into a :class:`RolloutBatch` (prompt left-padded, response right-padded).

    ``loss_mask`` is the response mask from each trajectory's ``trainable_from`` on; under the
    ``mask`` truncation policy truncated completions get no loss at all.
    """
    if not trajectories:
        raise ValueError("collate() got no trajectories")
    b = len(trajectories)
    p = max(len(t.completion.prompt_ids) for t in trajectories)
    t_max = max(max(len(t.completion.response_ids) for t in trajectories), 1)
    input_ids = torch.full((b, p + t_max), pad_id, dtype=torch.long)
    attention = torch.zeros((b, p + t_max), dtype=torch.long)
    response_mask = torch.zeros((b, t_max))
    loss_mask = torch.zeros((b, t_max))
    gen_logprobs = torch.zeros((b, t_max))
    for i, traj in enumerate(trajectories):
        c = traj.completion
        prompt, resp = torch.tensor(c.prompt_ids, dtype=torch.long), c.response_ids
        input_ids[i, p - len(prompt) : p] = prompt
        attention[i, p - len(prompt) : p] = 1
        if resp:
            input_ids[i, p : p + len(resp)] = torch.tensor(resp, dtype=torch.long)
            attention[i, p : p + len(resp)] = 1
            response_mask[i, : len(resp)] = 1
        drop = truncation == "mask" and c.finish_reason == "length"
        if not drop:
            loss_mask[i, traj.trainable_from : len(resp)] = 1
        if c.logprobs:
            gen_logprobs[i, c.prefix_len : len(resp)] = torch.tensor(c.logprobs)
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention,
        prompt_len=p,
        response_ids=input_ids[:, p:].clone(),
        response_mask=response_mask,
        loss_mask=loss_mask,
        group_ids=torch.tensor([t.group_id for t in trajectories], dtype=torch.long),
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        gen_logprobs=gen_logprobs,
        trajectories=tuple(trajectories),
    )


def with_segments(batch: RolloutBatch, segments: Any) -> RolloutBatch:
    """The batch with its segmenter output attached."""
    return replace(batch, segments=segments)

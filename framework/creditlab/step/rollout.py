"""Rollouts of one RL step: the sampler every rollout strategy uses, the core's ``plain`` strategy,
and :func:`collate` of trajectories into a padded :class:`~creditlab.types.RolloutBatch`.

:class:`RolloutSampler` is the :data:`~creditlab.interfaces.SampleFn` of a run: it samples
through the :class:`~creditlab.interfaces.GenerationBackend` (plain or thought by thought),
scores with the :class:`~creditlab.interfaces.Verifier`, applies the truncation policy and counts
every generated token. A :class:`~creditlab.interfaces.RolloutStrategy` decides what to sample and
how to group it: :class:`PlainRolloutStrategy` draws ``group_size`` i.i.d. completions per
problem; strategies that build trees live in plug-ins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from creditlab.interfaces import (
    GenerationBackend,
    PolicyHandle,
    ResetSelector,
    RolloutStrategy,
    SampleFn,
    Verifier,
)
from creditlab.step.generation import generate_thoughts
from creditlab.types import (
    Completion,
    GenerationRequest,
    Mean,
    Problem,
    ResetPoint,
    RolloutBatch,
    RolloutConfig,
    SamplingParams,
    Segments,
    Spans,
    Sum,
    Trajectory,
)


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


class RolloutSampler:
    """Samples and scores continuations with the run's settings: the run's
    :data:`~creditlab.interfaces.SampleFn` (call it), behind every rollout strategy and
    :meth:`~creditlab.interfaces.PolicyHandle.rollouts`.

    Args:
        cfg: Sampling, thought and truncation settings.
        backend: Generation backend.
        verifier: Scores completions.

    ``generated_tokens`` counts every token sampled through it since the last
    :meth:`take_generated_tokens` (trained on or not).
    """

    def __init__(self, cfg: RolloutConfig, backend: GenerationBackend, verifier: Verifier) -> None:
        self.cfg = cfg
        self.backend = backend
        self.verifier = verifier
        self.generated_tokens = 0
        self._completions = 0.0
        self._truncated = 0.0

    def __call__(
        self, problems: Sequence[Problem], requests: Sequence[GenerationRequest], seed: int
    ) -> list[Trajectory]:
        """Sample one completion per request (continuing its prefix) and score it.

        Group ids are left at -1 for the caller to assign; ``trainable_from`` is the prefix end.
        """
        completions = sample(self.backend, requests, self.cfg, self.cfg.sampling(seed))
        self.generated_tokens += sum(len(c.logprobs) for c in completions)
        return self.score(problems, completions)

    def score(self, problems: Sequence[Problem], completions: Sequence[Completion]) -> list[Trajectory]:
        """Verify completions and wrap them as trajectories (applying the truncation policy)."""
        rewards = self.verifier.score(problems, completions)
        out = []
        for i, (p, c) in enumerate(zip(problems, completions)):
            reward, info = float(rewards.values[i]), dict(rewards.info[i])
            truncated = c.finish_reason == "length"
            info["truncated"] = truncated
            if truncated and self.cfg.truncation == "penalize":
                reward = self.cfg.truncation_reward
            self._completions += 1
            self._truncated += truncated
            out.append(Trajectory(p, c, reward, -1, c.prefix_len, "base", info))
        return out

    def take_generated_tokens(self) -> int:
        """Tokens generated through the sampler since the last call (then reset)."""
        n, self.generated_tokens = self.generated_tokens, 0
        return n

    def metrics(self) -> dict[str, float]:
        """``completions`` scored and the ``truncated_rate`` among them, since the last call."""
        out = {"completions": Sum(self._completions),
               "truncated_rate": Mean(self._truncated / max(self._completions, 1.0))}
        self._completions = self._truncated = 0.0
        return out


class PlainRolloutStrategy(RolloutStrategy):
    """``plain``: ``group_size`` i.i.d. completions per problem, each problem its own advantage
    group (GRPO and every estimator that needs no tree)."""

    def collect(
        self, problems: Sequence[Problem], ctx: PolicyHandle, sample: SampleFn, seed: int
    ) -> list[Trajectory]:
        g = self.rollout.group_size
        prompts = [ctx.encode(p.prompt) for p in problems]
        owners = [p for p in problems for _ in range(g)]
        requests = [GenerationRequest(ids) for ids in prompts for _ in range(g)]
        trajs = sample(owners, requests, seed)
        return [replace(t, group_id=i // g) for i, t in enumerate(trajs)]


class NoResetSelector(ResetSelector):
    """``none``: never resets (the selector of every strategy that does not use one)."""

    def select(self, trajectory: Trajectory, spans: Spans, ctx: PolicyHandle) -> ResetPoint:
        return ResetPoint(None)


def collate(
    trajectories: Sequence[Trajectory],
    pad_id: int,
    truncation: str = "keep",
    device: torch.device | str = "cpu",
) -> RolloutBatch:
    """Pad trajectories into a :class:`RolloutBatch` (prompt left-padded, response right-padded).

    ``loss_mask`` is the response mask from each trajectory's ``trainable_from`` on; under the
    ``mask`` truncation policy truncated completions get no loss at all. The rows are filled on
    the host and the batch is moved to ``device`` (the policy's) once, at the end.
    """
    if not trajectories:
        raise ValueError("collate() got no trajectories")
    b = len(trajectories)
    p = max(len(t.completion.prompt_ids) for t in trajectories)
    t_max = max(max(len(t.completion.response_ids) for t in trajectories), 1)
    host = torch.device("cpu")
    input_ids = torch.full((b, p + t_max), pad_id, dtype=torch.long, device=host)
    attention = torch.zeros((b, p + t_max), dtype=torch.long, device=host)
    response_mask = torch.zeros((b, t_max), device=host)
    loss_mask = torch.zeros((b, t_max), device=host)
    gen_logprobs = torch.zeros((b, t_max), device=host)
    for i, traj in enumerate(trajectories):
        c = traj.completion
        prompt, resp = torch.tensor(c.prompt_ids, dtype=torch.long, device=host), c.response_ids
        input_ids[i, p - len(prompt) : p] = prompt
        attention[i, p - len(prompt) : p] = 1
        if resp:
            input_ids[i, p : p + len(resp)] = torch.tensor(resp, dtype=torch.long, device=host)
            attention[i, p : p + len(resp)] = 1
            response_mask[i, : len(resp)] = 1
        drop = truncation == "mask" and c.finish_reason == "length"
        if not drop:
            loss_mask[i, traj.trainable_from : len(resp)] = 1
        if c.logprobs:
            gen_logprobs[i, c.prefix_len : len(resp)] = torch.tensor(c.logprobs, device=host)
    batch = RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention,
        prompt_len=p,
        response_ids=input_ids[:, p:].clone(),
        response_mask=response_mask,
        loss_mask=loss_mask,
        group_ids=torch.tensor([t.group_id for t in trajectories], dtype=torch.long, device=host),
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32, device=host),
        gen_logprobs=gen_logprobs,
        trajectories=tuple(trajectories),
    )
    return batch.to(device)


def with_segments(batch: RolloutBatch, segments: Segments) -> RolloutBatch:
    """The batch with its segmenter output attached."""
    return replace(batch, segments=segments)

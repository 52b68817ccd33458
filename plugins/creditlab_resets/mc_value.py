"""Monte-Carlo step values, VinePPO-style — Kazemnejad et al., "VinePPO: Unlocking RL Potential
for LLM Reasoning Through Refined Credit Assignment", arXiv 2410.01679 (METHODS.md §3).

For each step boundary ``s_t`` of a trajectory (the state before its t-th trainable segment),
``V(s_t)`` is the mean verified reward of ``rollouts`` fresh continuations sampled from
``s_t`` with the run's rollout settings; the value after the last segment is the trajectory's own
reward. Segment t's tokens get ``A_t = V(s_{t+1}) - V(s_t)``.

Continuations go through :meth:`creditlab.PolicyHandle.rollouts` (the run's sampler: the
same sampling and scoring every rollout strategy uses), so their tokens count as generated
tokens. States shared by several rows — every row of a group shares ``s_0``, every suffix of a
reset group shares its prefix — are estimated once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from creditlab import (
    AdvantageEstimator,
    Advantages,
    ConfigError,
    GenerationRequest,
    Mean,
    PolicyHandle,
    RolloutBatch,
    Sum,
)


def boundaries(spans: tuple[tuple[int, int], ...], trainable_from: int, length: int) -> list[int]:
    """Response positions where a trainable segment starts (the states to value), ascending.

    ``trainable_from`` itself is always one (a reset prefix ends on a thought boundary); a span
    starting inside the prefix is skipped.
    """
    if length <= trainable_from:
        return []
    starts = {a for a, _ in spans if trainable_from < a < length}
    return sorted({trainable_from} | starts)


class MCValueAdvantage(AdvantageEstimator):
    """Per-segment advantages from Monte-Carlo value estimates of each step boundary."""

    @dataclass
    class Config:
        """Attributes:
        rollouts: Continuations per state (K; the paper uses 9).
        """

        rollouts: int = 4

        def __post_init__(self) -> None:
            if self.rollouts < 1:
                raise ConfigError(f"advantage.rollouts must be >= 1; got {self.rollouts}")

    def estimate(self, batch: RolloutBatch, ctx: PolicyHandle) -> Advantages:
        """Advantages of ``batch``.

        Args:
            batch: Uses ``trajectories``, ``segments`` (thought spans; without a segmenter the
                whole response is one segment), ``rewards`` (B,) and ``loss_mask`` (B, T).
            ctx: Its :meth:`~creditlab.interfaces.PolicyHandle.rollouts` samples continuations.

        Returns:
            ``values`` (B, T): ``V(s_{t+1}) - V(s_t)`` on the tokens of segment t, 0 where
            ``loss_mask`` is 0. Metrics: ``states`` valued, ``value_rollouts`` sampled,
            ``abs_mean`` over trained tokens.
        """
        batch = batch.to("cpu")  # per-row bookkeeping runs on the host: one copy (advantages go back once)
        k = self.config.rollouts
        rows = []  # (row, [boundaries]) per trajectory
        states: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        owners, segs = [], []
        for b, traj in enumerate(batch.trajectories):
            c = traj.completion
            spans = batch.segments.spans[b] if batch.segments is not None else ((0, len(c.response_ids)),)
            bounds = boundaries(tuple(spans), traj.trainable_from, len(c.response_ids))
            rows.append(bounds)
            for start in bounds:
                key = (tuple(c.prompt_ids), tuple(c.response_ids[:start]))
                if key not in states:
                    states[key] = len(states)
                    owners.append(traj.problem)  # its thoughts go with the prefix (capped ones too)
                    segs.append(tuple(c.segment_ids[:start]) if c.segment_ids else None)
        keys = list(states)
        requests = [GenerationRequest(p, prefix, seg) for (p, prefix), seg in zip(keys, segs)
                    for _ in range(k)]
        results = ctx.rollouts([o for o in owners for _ in range(k)], requests) if requests else []
        rewards = torch.tensor([t.reward for t in results], dtype=torch.float32, device="cpu")
        value = rewards.view(len(keys), k).mean(1) if keys else rewards

        out = torch.zeros_like(batch.loss_mask, dtype=torch.float32)
        for b, (traj, bounds) in enumerate(zip(batch.trajectories, rows)):
            c = traj.completion
            v = [float(value[states[(tuple(c.prompt_ids), tuple(c.response_ids[:s]))]]) for s in bounds]
            v.append(float(batch.rewards[b]))
            ends = bounds[1:] + [len(c.response_ids)]
            for t, (start, end) in enumerate(zip(bounds, ends)):
                out[b, start:end] = v[t + 1] - v[t]
        out = out * batch.loss_mask
        trained = max(float(batch.loss_mask.sum()), 1.0)
        metrics = {
            "states": Sum(len(keys)),
            "value_rollouts": Sum(len(results)),
            "abs_mean": Mean(float(out.abs().sum()) / trained),
        }
        return Advantages(values=out.to(batch.loss_mask.dtype), metrics=metrics)

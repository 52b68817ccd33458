"""The Monte-Carlo ground truth of ``creditlab credit-bench``: step values and step advantages.

At every thought boundary s_k of a chain (the state before its k-th thought, a token-id prefix of
its response) the value V(s_k) is the mean reward of K continuations sampled from that prefix with
the run's settings (as the Monte-Carlo value estimator does with its own K), and
the true step advantage of thought k is ``A_k = V(s_{k+1}) - V(s_k)``, the last one
``reward - V(s_last)``. Identical prefixes (every chain of a prompt shares s_0) are valued once.

This is the on-policy value of *one* checkpoint under its sampling settings, estimated with noise:
:func:`noise` measures that noise (standard errors, split-half reliabilities) so the bench can
refuse to score against a truth that is mostly noise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from creditlab.types import GenerationRequest, Problem, Spans, Trajectory

#: Continuation requests per sampler call (a fixed chunk keeps the seeds, and so the truth, the
#: same for a seed whatever the machine; it also paces the progress bar).
CHUNK = 512

SampleFn = Callable[[Sequence[Problem], Sequence[GenerationRequest], int], list[Trajectory]]


@dataclass(frozen=True)
class ChainTruth:
    """The truth for one chain of n thoughts.

    Attributes:
        prompt: Index of its prompt in the bench.
        reward: Its verified reward.
        spans: Its n thought spans over the response ids.
        values: (n,) V(s_k), the value of the state before thought k.
        value_se: (n,) standard errors of ``values`` (sample std / sqrt K).
        advantages: (n,) A_k.
        advantage_se: (n,) standard errors of ``advantages`` (the two values' errors combined).
        halves: Two (n,) estimates of ``advantages`` from disjoint halves of the K continuations.
    """

    prompt: int
    reward: float
    spans: Spans
    values: np.ndarray
    value_se: np.ndarray
    advantages: np.ndarray
    advantage_se: np.ndarray
    halves: tuple[np.ndarray, np.ndarray]


def chunk_seed(seed: int, chunk: int) -> int:
    """The sampling seed of chunk ``chunk`` of the continuations."""
    return (seed * 1_000_003 + 7919 * (chunk + 1)) % (2**62)


def compute_truth(
    trajectories: Sequence[Trajectory],
    prompt_index: Sequence[int],
    spans: Sequence[Spans],
    sample: SampleFn,
    k: int,
    seed: int,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[ChainTruth], dict[str, float]]:
    """Value every thought boundary of every chain by ``k`` continuations.

    Args:
        trajectories: The chains (their problems own the continuations).
        prompt_index: (C,) the prompt of each chain.
        spans: Each chain's thought spans (a chain with none gets no truth: n = 0).
        sample: The run's sampler (samples and scores, counting generated tokens).
        k: Continuations per state (>= 2: the split-half needs two halves).
        seed: Seed of the continuations.
        progress: Called with ``(continuations done, continuations in all)`` after each chunk.

    Returns:
        The truth per chain, and ``states`` / ``continuations`` counts and ``value_halves`` (the
        split-half reliability of the state values).
    """
    keys: dict[tuple, int] = {}
    states: list[tuple] = []
    for i, (traj, sp) in enumerate(zip(trajectories, spans)):
        c = traj.completion
        for a, _ in sp:
            key = (c.prompt_ids, c.response_ids[:a])
            if key not in keys:
                keys[key] = len(states)
                segs = tuple(c.segment_ids[:a]) if c.segment_ids else None
                states.append((GenerationRequest(c.prompt_ids, c.response_ids[:a], segs), traj.problem))
    requests = [req for req, _ in states for _ in range(k)]
    owners = [problem for _, problem in states for _ in range(k)]
    rewards = np.zeros(len(requests))
    for n, start in enumerate(range(0, len(requests), CHUNK)):
        done = sample(owners[start : start + CHUNK], requests[start : start + CHUNK], chunk_seed(seed, n))
        rewards[start : start + len(done)] = [t.reward for t in done]
        if progress is not None:
            progress(start + len(done), len(requests))
    r = rewards.reshape(len(states), k)
    value, se = r.mean(1), r.std(1, ddof=1) / np.sqrt(k)
    half_a, half_b = r[:, : k // 2].mean(1), r[:, k // 2 :].mean(1)

    out = []
    for traj, p, sp in zip(trajectories, prompt_index, spans):
        c = traj.completion
        idx = [keys[(c.prompt_ids, c.response_ids[:a])] for a, _ in sp]
        s = se[idx]
        out.append(ChainTruth(
            prompt=int(p), reward=float(traj.reward), spans=tuple(sp), values=value[idx], value_se=s,
            advantages=_steps(value[idx], traj.reward), advantage_se=np.sqrt(s**2 + np.append(s[1:], 0.0) ** 2),
            halves=(_steps(half_a[idx], traj.reward), _steps(half_b[idx], traj.reward)),
        ))
    return out, {"states": len(states), "continuations": len(requests), "value_halves": spearman_brown(half_a, half_b)}


def _steps(values: np.ndarray, reward: float) -> np.ndarray:
    """(n,) step advantages from (n,) state values: the next value (the reward after the last
    thought) minus this one."""
    return np.append(values[1:], reward) - values if len(values) else np.zeros(0)


def spearman_brown(a: np.ndarray, b: np.ndarray) -> float:
    """Reliability of the full-K estimate from the correlation of two half-K estimates:
    2r / (1 + r); NaN when either half is constant or there are fewer than 3 values."""
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    r = float(np.corrcoef(a, b)[0, 1])
    return 2 * r / (1 + r) if r > -1 else float("nan")


def noise(chains: Sequence[ChainTruth], value_split_half: float) -> dict[str, float]:
    """The Monte-Carlo noise of the truth over all (chain, thought) pairs.

    ``advantage_reliability`` is 1 - (mean squared standard error) / (variance of the estimated
    A_k): the share of the spread of the truth that is not noise. ``error_floor`` is the
    ``error`` score an estimator equal to the noise-free advantages would get against this noisy
    truth: mean squared standard error / mean squared A_k.
    """
    a = np.concatenate([c.advantages for c in chains]) if chains else np.zeros(0)
    se = np.concatenate([c.advantage_se for c in chains]) if chains else np.zeros(0)
    ha = np.concatenate([c.halves[0] for c in chains]) if chains else np.zeros(0)
    hb = np.concatenate([c.halves[1] for c in chains]) if chains else np.zeros(0)
    vse = np.concatenate([c.value_se for c in chains]) if chains else np.zeros(0)
    noise_var = float(np.mean(se**2)) if len(se) else float("nan")
    spread = float(np.var(a)) if len(a) else float("nan")
    return {
        "value_se": float(vse.mean()) if len(vse) else float("nan"),
        "advantage_se": float(se.mean()) if len(se) else float("nan"),
        "value_split_half": value_split_half,
        "advantage_split_half": spearman_brown(ha, hb),
        "advantage_reliability": 1 - noise_var / spread if spread > 0 else float("nan"),
        "error_floor": noise_var / float(np.mean(a**2)) if len(a) and np.mean(a**2) > 0 else float("nan"),
    }


def k_needed(k: int, reliability: float, target: float) -> int | None:
    """The K at which the advantage reliability would reach ``target`` (noise variance falls as
    1/K), from the reliability measured at ``k``; None when the truth shows no signal at all."""
    if not np.isfinite(reliability) or reliability <= 0:
        return None
    signal, noise_share = reliability, 1 - reliability
    return int(np.ceil(k * noise_share * target / (signal * (1 - target))))

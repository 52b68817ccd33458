"""Held-out evaluation: greedy pass@1 and the unbiased pass@k estimator.

pass@k follows Chen et al. 2021 (arXiv 2107.03374): with n samples of which c are correct,
pass@k = 1 - C(n-c, k) / C(n, k), averaged over problems. Besides the means, every scored problem's
outcome (:class:`ProblemOutcomes`) goes to the run's ``eval_problems.jsonl``, so that
``creditlab compare`` can pair runs problem by problem.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from math import comb
from typing import Any

import torch.distributed as dist

from creditlab.interfaces import GenerationBackend, PolicyHandle, Verifier
from creditlab.step.distributed import rank_and_world
from creditlab.step.rollout import sample
from creditlab.types import GenerationRequest, Mean, Problem, RolloutConfig, Sum


@dataclass
class EvalConfig:
    """Periodic evaluation.

    Attributes:
        every: Evaluate every this many RL steps (and at steps 0 and the last); 0 = never.
        problems: How many test problems (0 = all). When the test split holds fewer, all of them
            are scored and start-up says so in one line; ``eval/problems`` logs the count scored.
        holdout: Evaluate on this many rows of the *train* split, which are then not trained on
            (a fixed choice, the same for every seed), instead of the task's test split; for a
            task whose test split is its train split (one data file). 0 = the task's test split.
        allow_train_rows: Score test rows that are also training rows (the same prompt). Off
            (default): such rows are left out of evaluation, and a run whose every test row is a
            training row stops at start-up naming the fixes (:mod:`creditlab.run.datamodule`).
        samples: Samples per problem for pass@k (0 = greedy only).
        k: The k of pass@k (must be <= samples).
        temperature: Sampling temperature for pass@k.
        batch_size: Requests per generate call.
    """

    every: int = 10
    problems: int = 100
    holdout: int = 0
    allow_train_rows: bool = False
    samples: int = 0
    k: int = 4
    temperature: float = 1.0
    batch_size: int = 256

    def __post_init__(self) -> None:
        if self.samples and not 1 <= self.k <= self.samples:
            raise ValueError(f"eval.k must be in [1, eval.samples={self.samples}], got {self.k}")
        if self.samples and self.k == 1:  # eval/pass@1 is the greedy score; sampled pass@1 is below
            raise ValueError("eval.k=1 would log sampled pass@1 over the greedy eval/pass@1; sampled pass@1 "
                             "is eval/sample_accuracy already: use eval.k >= 2 or eval.samples=0")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``c`` correct out of ``n`` samples."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def _solve(
    backend: GenerationBackend,
    verifier: Verifier,
    ctx: PolicyHandle,
    problems: Sequence[Problem],
    repeats: int,
    rollout: RolloutConfig,
    temperature: float,
    seed: int,
    batch_size: int,
) -> list[list[float]]:
    owners = [p for p in problems for _ in range(repeats)]
    requests = [GenerationRequest(ctx.encode(p.prompt)) for p in owners]
    sampling = replace(rollout.sampling(seed), temperature=temperature, top_p=1.0, top_k=0)
    rewards: list[float] = []
    for s in range(0, len(requests), batch_size):
        completions = sample(backend, requests[s : s + batch_size], rollout, sampling)
        rewards.extend(verifier.score(owners[s : s + batch_size], completions).values)
    return [rewards[i * repeats : (i + 1) * repeats] for i in range(len(problems))]


@dataclass
class ProblemOutcomes:
    """Every scored problem's outcome in one evaluation, in the order of the test rows.

    Attributes:
        ids: The problems' ids.
        greedy: 1 where the greedy answer was right, else 0.
        correct: Correct samples per problem (empty without ``eval.samples``).
    """

    ids: list[str] = field(default_factory=list)
    greedy: list[int] = field(default_factory=list)
    correct: list[int] = field(default_factory=list)

    def record(self, step: int, samples: int) -> dict[str, Any]:
        """The ``eval_problems.jsonl`` line of this evaluation (:mod:`creditlab.analysis.problem_records`)."""
        return {"step": step, "samples": samples, "ids": self.ids, "greedy": self.greedy, "correct": self.correct}


def gather_outcomes(mine: ProblemOutcomes) -> ProblemOutcomes:
    """Every rank's outcomes, concatenated in rank order (a collective; identity in one process).
    The ranks score contiguous shares (:func:`creditlab.step.distributed.shard`), so rank order is
    the test rows' order."""
    world = rank_and_world()[1]
    if world == 1:
        return mine
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, mine)
    return ProblemOutcomes(*([x for part in parts for x in getattr(part, name)] for name in ("ids", "greedy", "correct")))


def evaluate_problems(
    backend: GenerationBackend,
    verifier: Verifier,
    ctx: PolicyHandle,
    problems: Sequence[Problem],
    cfg: EvalConfig,
    rollout: RolloutConfig,
    seed: int,
) -> tuple[dict[str, float], ProblemOutcomes]:
    """:func:`evaluate`'s metrics and every scored problem's outcome (for paired comparisons:
    every run of a sweep scores the same problems)."""
    problems = list(problems[: cfg.problems] if cfg.problems else problems)
    if not problems:
        return {}, ProblemOutcomes()
    verifier.reset_metrics()  # training counts were logged already; start clean
    greedy = _solve(backend, verifier, ctx, problems, 1, rollout, 0.0, seed, cfg.batch_size)
    outcomes = ProblemOutcomes([p.id for p in problems], [int(r[0] > 0.5) for r in greedy])
    out = {
        "eval/pass@1": Mean(sum(outcomes.greedy) / len(problems)),
        "eval/problems": Sum(len(problems)),
    }
    if cfg.samples:
        sampled = _solve(
            backend, verifier, ctx, problems, cfg.samples, rollout, cfg.temperature, seed, cfg.batch_size
        )
        correct = outcomes.correct = [sum(x > 0.5 for x in r) for r in sampled]
        out[f"eval/pass@{cfg.k}"] = Mean(sum(pass_at_k(cfg.samples, c, cfg.k) for c in correct) / len(problems))
        out["eval/sample_accuracy"] = Mean(sum(correct) / (cfg.samples * len(problems)))
    out.update({f"eval/verifier/{k}": v for k, v in verifier.metrics().items()})
    return out, outcomes


def evaluate(
    backend: GenerationBackend,
    verifier: Verifier,
    ctx: PolicyHandle,
    problems: Sequence[Problem],
    cfg: EvalConfig,
    rollout: RolloutConfig,
    seed: int,
) -> dict[str, float]:
    """``eval/pass@1`` (greedy), ``eval/problems`` (the problems scored, summed over ranks) and,
    with ``cfg.samples``, ``eval/pass@k`` and mean accuracy.

    A reward > 0.5 counts as solved. Verifier outcome metrics are drained and not mixed into the
    training counts.
    """
    return evaluate_problems(backend, verifier, ctx, problems, cfg, rollout, seed)[0]

"""Contract checks every part must pass; plug-in authors call them from their own tests.

Example::

    from creditlab.testing import check_part
    def test_my_estimator_contract():
        check_part("advantage", MyAdvantage())
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
from omegaconf import DictConfig

from creditlab.interfaces import (
    INTERFACES,
    AdvantageEstimator,
    GenerationBackend,
    Part,
    PolicyHandle,
    ResetSelector,
    RolloutStrategy,
    SampleFn,
    Segmenter,
    Task,
    Verifier,
)
from creditlab.run.compose import compose
from creditlab.run.config import validate
from creditlab.testing.fakes import FakePolicyHandle, FakeSampler, make_batch, pad_batch
from creditlab.types import (
    Advantages,
    Completion,
    GenerationRequest,
    Problem,
    ResetPoint,
    Rewards,
    SamplingParams,
    Trajectory,
)


def check_config(overrides: Sequence[str] = ()) -> tuple[DictConfig, dict[str, Any]]:
    """Compose ``conf/train.yaml`` with ``overrides`` (as ``creditlab train`` would, plug-in config
    folders on the search path) and validate every section: ``(config, validated sections)``.

    Raises what ``creditlab train`` reports: :class:`~creditlab.errors.ConfigError`,
    :class:`~creditlab.errors.RegistryError` or Hydra's composition errors.
    """
    cfg = compose(list(overrides))
    return cfg, validate(cfg)


def check_common(kind: str, part: Part) -> None:
    """Interface, default-constructible dataclass Config, and ``metrics()`` of floats."""
    base = INTERFACES[kind]
    assert isinstance(part, base), f"{type(part).__name__} is not a {base.__name__}"
    assert dataclasses.is_dataclass(part.Config), f"{type(part).__name__}.Config must be a dataclass"
    part.Config()  # every field has a default
    metrics = part.metrics()
    assert isinstance(metrics, dict), "metrics() must return a dict"
    for key, value in metrics.items():
        assert isinstance(key, str) and math.isfinite(float(value)), f"bad metric {key}={value!r}"


def check_advantage(estimator: AdvantageEstimator, ctx: Any = None, seeds: Sequence[int] = (0, 1, 2),
                    problems: Sequence[Problem] | None = None, tokenizer: Any = None) -> None:
    """(B, T) shape, finite, zero on masked positions, deterministic, padding-invariant.

    ``problems`` (one per group of the batch: 3) and ``tokenizer`` (of the default fake policy
    handle, seeded per check) are for estimators that read a step oracle or decode thoughts."""
    for seed in seeds:
        batch = make_batch(groups=3, group_size=4, seed=seed, trainable_from=[0, 2, 0, 1] * 3,
                           vocab=len(tokenizer) if tokenizer is not None else 32, problems=problems)
        handle = lambda: ctx or FakePolicyHandle(seed=seed, tokenizer=tokenizer)  # noqa: B023, E731
        out = estimator.estimate(batch, handle())
        assert isinstance(out, Advantages), "estimate() must return Advantages"
        values = out.values
        assert values.shape == batch.loss_mask.shape, f"shape {tuple(values.shape)} != {tuple(batch.loss_mask.shape)}"
        assert torch.isfinite(values).all(), "advantages must be finite"
        assert (values[batch.loss_mask == 0] == 0).all(), "advantages must be 0 where loss_mask is 0"
        again = estimator.estimate(batch, handle()).values
        assert torch.equal(values, again), "estimate() must be deterministic for the same batch and rng"
        padded = estimator.estimate(pad_batch(batch, 5), handle()).values
        assert torch.allclose(padded[:, : values.shape[1]], values, atol=1e-5), "extra padding changed advantages"
        assert (padded[:, values.shape[1]:] == 0).all()
        for key, value in out.metrics.items():
            assert math.isfinite(float(value)), f"metric {key} is not finite"


def check_verifier(verifier: Verifier, problems: Sequence[Problem], completions: Sequence[Completion]) -> None:
    """One finite reward and an info dict with ``parsed`` and ``outcome`` per completion."""
    rewards = verifier.score(problems, completions)
    assert isinstance(rewards, Rewards)
    assert len(rewards.values) == len(completions) == len(rewards.info)
    for value, info in zip(rewards.values, rewards.info):
        assert math.isfinite(float(value)), "rewards must be finite"
        assert "parsed" in info and "outcome" in info, "info needs 'parsed' and 'outcome'"


def check_segmenter(segmenter: Segmenter, batch: Any = None) -> None:
    """Spans partition each row's response mask exactly."""
    batch = batch if batch is not None else make_batch(seed=3)
    segments = segmenter.segment(batch)
    assert len(segments.spans) == batch.size
    for row, spans in enumerate(segments.spans):
        length = int(batch.response_mask[row].sum())
        assert spans, f"row {row}: no spans"
        assert spans[0][0] == 0 and spans[-1][1] == length, f"row {row}: spans {spans} do not cover [0,{length})"
        for (s0, e0), (s1, _) in zip(spans, spans[1:]):
            assert s0 < e0 == s1, f"row {row}: spans {spans} are not contiguous and non-empty"


def check_reset_selector(selector: ResetSelector, batch: Any = None, ctx: Any = None) -> None:
    """A ResetPoint whose segment is None or a valid index of the given spans."""
    batch = batch if batch is not None else make_batch(seed=4)
    for traj in batch.trajectories:
        n = len(traj.completion.response_ids)
        spans = tuple((i, i + 1) for i in range(n))
        point = selector.select(traj, spans, ctx or FakePolicyHandle())
        assert isinstance(point, ResetPoint)
        assert point.segment is None or 0 <= point.segment < len(spans), f"segment {point.segment} out of range"


def check_task(task: Task, splits: Sequence[str] = ("train", "test")) -> None:
    """Non-empty splits of Problems with string prompts and unique ids."""
    for split in splits:
        problems = list(task.load(split))
        assert problems, f"split {split} is empty"
        ids = [p.id for p in problems]
        assert len(set(ids)) == len(ids), f"split {split} has duplicate ids"
        for p in problems:
            assert isinstance(p, Problem) and isinstance(p.prompt, str) and p.prompt
            assert isinstance(p.answer, str)


def check_backend(backend: GenerationBackend, prompt_ids: Sequence[tuple[int, ...]]) -> None:
    """One Completion per request, prefixes kept as ids, one logprob per generated token, seeded."""
    requests = [GenerationRequest(tuple(p)) for p in prompt_ids]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=7)
    out = backend.generate(requests, sampling)
    assert len(out) == len(requests)
    again = backend.generate(requests, sampling)
    assert [c.response_ids for c in out] == [c.response_ids for c in again], "same seed must give same output"
    for req, c in zip(requests, out):
        assert c.prompt_ids == req.prompt_ids
        assert len(c.logprobs) == len(c.response_ids) - c.prefix_len
        assert c.finish_reason in ("eos", "stop", "length")
        assert all(lp <= 1e-6 and math.isfinite(lp) for lp in c.logprobs)
        if c.entropies is not None:  # optional: one entropy (nats, >= 0) per generated token
            assert len(c.entropies) == len(c.logprobs)
            assert all(e >= -1e-5 and math.isfinite(e) for e in c.entropies)
    prefixed = [GenerationRequest(c.prompt_ids, c.response_ids[:2]) for c in out]
    for req, c in zip(prefixed, backend.generate(prefixed, sampling)):
        assert c.response_ids[: len(req.prefix_ids)] == req.prefix_ids and c.prefix_len == len(req.prefix_ids)


def _signature(trajectories: Sequence[Trajectory]) -> list[tuple]:
    return [(t.problem.id, t.completion.response_ids, t.reward, t.group_id, t.trainable_from, t.role)
            for t in trajectories]


def check_rollout_strategy(
    strategy: RolloutStrategy,
    problems: Sequence[Problem] | None = None,
    sample: SampleFn | None = None,
    ctx: PolicyHandle | None = None,
    seeds: Sequence[int] = (0, 1),
) -> None:
    """``group_size`` trajectories per problem in groups of one problem, valid ``trainable_from``,
    prefixes kept as ids, deterministic for a seed.

    Args:
        strategy: Built with its ``rollout`` settings, tokenizer and reset selector.
        problems: Default: three problems.
        sample: Default: a :class:`~creditlab.testing.FakeSampler` whose thoughts end with the
            delimiter ids of ``strategy.tokenizer`` (when it has one).
        ctx: Default: a :class:`~creditlab.testing.FakePolicyHandle` with the strategy's tokenizer.
    """
    problems = list(problems) if problems is not None else [Problem(f"p{i}", f"q{i}", "1") for i in range(3)]
    if sample is None:
        tok = strategy.tokenizer
        delim = tuple(tok.encode(strategy.rollout.delimiter, add_special_tokens=False)) if tok is not None else (31,)
        sample = FakeSampler(delimiter_ids=delim)
    g = strategy.rollout.group_size
    for seed in seeds:
        handle = ctx or FakePolicyHandle(tokenizer=strategy.tokenizer, seed=seed)
        out = strategy.collect(problems, handle, sample, seed)
        assert isinstance(out, list) and all(isinstance(t, Trajectory) for t in out), "collect() must return a list of Trajectory"
        for p in problems:
            n = sum(t.problem is p for t in out)
            assert n == g, f"problem {p.id}: {n} trajectories, want rollout.group_size={g} (equal budgets)"
        owners: dict[int, str] = {}
        for t in out:
            assert isinstance(t.group_id, int) and t.group_id >= 0, f"group_id {t.group_id!r} must be an int >= 0"
            assert owners.setdefault(t.group_id, t.problem.id) == t.problem.id, f"group {t.group_id} mixes problems"
            c = t.completion
            assert 0 <= t.trainable_from <= len(c.response_ids), f"trainable_from {t.trainable_from} out of range"
            assert c.prefix_len <= len(c.response_ids) and len(c.logprobs) == len(c.response_ids) - c.prefix_len
        again = strategy.collect(problems, ctx or FakePolicyHandle(tokenizer=strategy.tokenizer, seed=seed), sample, seed)
        assert _signature(again) == _signature(out), "collect() must be deterministic for the same seed"
    for key, value in strategy.metrics().items():
        assert math.isfinite(float(value)), f"metric {key} is not finite"


CHECKS = {
    "advantage": check_advantage,
    "segmenter": check_segmenter,
    "reset_selector": check_reset_selector,
    "rollout": check_rollout_strategy,
    "task": check_task,
}


def check_part(kind: str, part: Part, **kwargs: Any) -> None:
    """The common contract plus the kind's own check (verifier/backend need inputs: call theirs)."""
    check_common(kind, part)
    if kind in CHECKS:
        CHECKS[kind](part, **kwargs)

"""What one RL step logs besides the update: statistics of the global batch, and every part's
metrics under ``train/<kind>/<key>``, each key from exactly one writer."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch

from creditlab.errors import RegistryError
from creditlab.step.distributed import all_sum, gather_floats
from creditlab.types import RolloutBatch, Trajectory

log = logging.getLogger(__name__)


class MetricClash(RegistryError):
    """Two channels of one step wrote the same metric key (a plug-in to fix: reported as one line
    by ``creditlab train``)."""


def merge_metrics(
    into: dict[str, float], prefix: str, metrics: dict[str, float], source: str, sources: dict[str, str]
) -> None:
    """Add ``metrics`` under ``prefix`` to ``into``; ``sources`` remembers who wrote each key.

    Raises:
        MetricClash: A key another channel already wrote (one would silently hide the other).
    """
    for key, value in metrics.items():
        full = f"{prefix}{key}"
        if full in sources:
            raise MetricClash(
                f"metric '{full}' is written by both {sources[full]} and {source}: "
                "rename one of them (each key has one writer)"
            )
        sources[full] = source
        into[full] = value


def one_writer_per_key(channels: Sequence[tuple[str, str, dict[str, float]]]) -> dict[str, float]:
    """``train/<kind>/<key>`` for every ``(kind, source, metrics)`` channel.

    Raises:
        MetricClash: Two channels wrote one key (e.g. an estimator's ``Advantages.metrics`` and its
            ``metrics()``).
    """
    out: dict[str, float] = {}
    sources: dict[str, str] = {}
    for kind, source, metrics in channels:
        merge_metrics(out, f"train/{kind}/", metrics, source, sources)
    return out


def batch_metrics(rollout: RolloutBatch, generated: int) -> tuple[dict[str, float], float, float]:
    """Reward and length statistics of the global batch (every rank's rows; a collective).

    Args:
        rollout: This rank's batch (B rows).
        generated: Every token this rank sampled this step, trained on or not.

    Returns:
        ``(metrics, trained tokens, generated tokens)``, the token counts summed over ranks.
    """
    rewards = torch.tensor(gather_floats(rollout.rewards.tolist()), device="cpu")  # host-side statistics
    lengths = torch.tensor(gather_floats(rollout.response_mask.sum(1).tolist()), device="cpu")
    trained, generated = all_sum([float(rollout.loss_mask.sum()), float(generated)])
    metrics = {
        "train/reward/mean": float(rewards.mean()),
        "train/reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "train/response_length/mean": float(lengths.mean()),
        "train/response_length/max": float(lengths.max()),
        "train/rows": float(len(rewards)),
        "train/tokens_generated": generated,
    }
    return metrics, trained, generated


def warn_if_no_answers(trajectories: Sequence[Trajectory], names: Mapping[str, str]) -> bool:
    """Warn loudly (and return True) when no completion of the run's first step, on any rank,
    has an answer the verifier could parse: every reward is then the same, nothing is learned.
    ``names`` holds the configured ``task`` and ``verifier`` (for the message)."""
    judged = [t.info for t in trajectories if "parsed" in t.info or "outcome" in t.info]
    parsed, cut, total = all_sum([
        float(sum(i.get("parsed") is not None or i.get("outcome") in ("correct", "wrong") for i in judged)),
        float(sum(bool(i.get("truncated")) for i in judged)), float(len(judged))])
    if total > 0 and parsed == 0:
        log.warning(
            "creditlab: WARNING: no completion of the first step has an answer the verifier can parse "
            "(verifier=%s, task=%s: 0 of %d), so every reward is the same and nothing is learned.\n  Check "
            "that the verifier fits the task (each task's config selects a matching one: drop a verifier= "
            "override), the budget (%d of %d cut off at the token limit) and the prompt's answer format.",
            names["verifier"], names["task"], int(total), int(cut), int(total))
    return total > 0 and parsed == 0

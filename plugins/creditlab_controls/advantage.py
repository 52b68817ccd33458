"""Credit controls: GRPO's advantages with a failed chain's blame moved by the task's step oracle.

Ours (issue 38), built to separate the three ways a method can beat GRPO (DESIGN.md section 9):
by its *credit* (which tokens get which advantage), by its *sampling* (where it spends
generation, e.g. the oracle reset's extra tries at a rarely reached state; SRPO, arXiv
2605.25507, section on conservative policy iteration) or by its *accounting* (which tokens count
toward a budget). Every estimator here trains on GRPO's own samples (no resampling), on exactly
the tokens GRPO trains (``loss_mask`` untouched, so every loss aggregation normalises as it does
for GRPO) and with GRPO's group advantage ``A_i`` (arXiv 2402.03300; std options as
:class:`creditlab_grpo.advantage.GRPOAdvantage`). Only where a blamed row's ``A_i`` lands differs:

* **blamed rows**: rows with ``A_i < 0`` (a chain below its group's mean: the failed chains of a
  mixed group). Rows with ``A_i >= 0`` keep GRPO's advantage on every token.
* the **right prefix** of a blamed row: its thoughts before the step oracle's first wrong thought
  ``k`` (``problem.oracle(thought texts)``, clamped to the last thought), i.e. response
  positions ``[0, start_k)``; ``m`` = its trained tokens. A blamed row whose oracle finds no wrong
  thought (e.g. right steps but a truncated answer) keeps GRPO's advantage, and is counted.

``oracle_credit`` zeroes the right prefix: blame from the first wrong step on, the credit an
oracle process reward would give. ``anti_credit`` zeroes everything *from* ``start_k`` on: blame
only on the right prefix (nothing, when the first thought is wrong). ``sham_credit`` zeroes ``m``
consecutive trained tokens at a uniformly random offset (``ctx.rng``): as much blame removed as
the oracle removes, in a place that ignores the oracle. Thought spans are the ``thought``
segmenter's (:func:`creditlab.completion_spans` with ``delimiter``), the same spans the
``train/credit/*`` metrics use, so those metrics show the move (oracle: no mass before the first
wrong step; anti: all of it there).

:class:`RewardFlipAdvantage` is the known-size control: each row's reward ``r`` in [0, 1] is
replaced by ``1 - r`` with probability ``rate`` before GRPO's group statistics. For Dr. GRPO's
centring the expected advantage shrinks to ``(1 - 2 rate)`` of GRPO's, i.e. a learning signal of
known direction (worse) and size; a comparison that cannot detect it cannot detect a credit
effect of that size either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from creditlab import (
    Advantages,
    ConfigError,
    InputError,
    Mean,
    PolicyHandle,
    RolloutBatch,
    Sum,
    completion_spans,
    span_texts,
)
from creditlab_grpo.advantage import GRPOAdvantage

#: Where a blamed row keeps its advantage (``placement`` of each control).
PLACEMENTS = ("oracle", "sham", "anti")


@dataclass
class CreditControlConfig(GRPOAdvantage.Config):
    """Attributes: GRPO's ``std``, ``eps`` and ``zero_std_tol``, and
    delimiter: The thought delimiter (the rollout's and the ``thought`` segmenter's)."""

    delimiter: str = "</thought>"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.delimiter:
            raise ConfigError("advantage.delimiter must be a non-empty string, e.g. '</thought>'.")


def first_wrong_start(problem: Any, response_ids: Any, spans: Any, tokenizer: Any) -> int | None:
    """Response position where ``problem``'s oracle puts the first wrong thought, or ``None``
    (no thoughts, or every thought right).

    Raises:
        InputError: ``problem`` has no step oracle.
    """
    if problem.oracle is None:
        raise InputError(
            f"the credit controls need a task with a step oracle, but problem '{problem.id}' has "
            "none (its task sets no Problem.oracle). Use a task with one (e.g. task=arith)."
        )
    if not spans:
        return None
    truth = problem.oracle(span_texts(tokenizer, response_ids, spans))
    if truth is None:
        return None
    return spans[min(max(int(truth), 0), len(spans) - 1)][0]


class OracleCreditAdvantage(GRPOAdvantage):
    """GRPO with a failed chain's blame only from the oracle's first wrong thought on."""

    Config = CreditControlConfig
    placement: ClassVar[str] = "oracle"

    def keep(self, trained: torch.Tensor, cut: int, ctx: PolicyHandle) -> torch.Tensor:
        """Which trained positions keep their blame.

        Args:
            trained: (n,) long, the row's trained response positions, ascending.
            cut: The first wrong thought's start (response position).
            ctx: Supplies ``rng`` (the sham's draw).

        Returns:
            (n,) bool.
        """
        before = trained < cut
        if self.placement == "oracle":
            return ~before
        if self.placement == "anti":
            return before
        m, n = int(before.sum()), len(trained)
        start = int(torch.randint(0, n - m + 1, (1,), generator=ctx.rng, device="cpu"))
        out = torch.ones(n, dtype=torch.bool, device=trained.device)
        out[start : start + m] = False
        return out

    def estimate(self, batch: RolloutBatch, ctx: PolicyHandle | None = None) -> Advantages:
        """Advantages of ``batch``.

        Args:
            batch: Uses ``rewards`` (B,), ``group_ids`` (B,), ``loss_mask`` (B, T) and each
                trajectory's problem (its step oracle) and response ids.
            ctx: Supplies the tokenizer (to read thoughts) and ``rng`` (``sham_credit``).

        Returns:
            ``Advantages`` (B, T): GRPO's on every row, with a blamed row's advantage zeroed
            where this control removes blame. Metrics: GRPO's, ``blamed_rows``,
            ``no_error_rows`` (blamed rows the oracle finds right), ``removed_share`` (mean
            share of a redistributed row's trained tokens whose blame was removed) and
            ``prefix_share`` (the same share for the oracle's right prefix, identical across
            the three controls on the same batch).
        """
        out = super().estimate(batch, ctx)
        if ctx is None or ctx.tokenizer is None:
            raise InputError(f"advantage={type(self).__name__} needs the policy's tokenizer to read thoughts")
        tokenizer = ctx.tokenizer
        delimiter_ids = tuple(tokenizer.encode(self.config.delimiter, add_special_tokens=False))
        values = out.values.clone()
        blamed = no_error = moved = 0
        removed = prefix = 0.0
        for b, traj in enumerate(batch.trajectories):
            trained = torch.nonzero(batch.loss_mask[b] > 0).flatten().cpu()
            if len(trained) == 0 or float(values[b, trained[0]]) >= 0:
                continue
            blamed += 1
            spans = completion_spans(traj.completion, delimiter_ids, tokenizer.eos_token_id)
            cut = first_wrong_start(traj.problem, traj.completion.response_ids, spans, tokenizer)
            if cut is None:
                no_error += 1
                continue
            keep = self.keep(trained, cut, ctx)
            values[b, trained[~keep].to(values.device)] = 0
            moved += 1
            removed += float((~keep).sum()) / len(trained)
            prefix += float((trained < cut).sum()) / len(trained)
        metrics = dict(out.metrics)
        metrics.update(blamed_rows=Sum(blamed), no_error_rows=Sum(no_error))
        if moved:
            metrics.update(removed_share=Mean(removed / moved), prefix_share=Mean(prefix / moved))
        return Advantages(values=values, metrics=metrics)


class ShamCreditAdvantage(OracleCreditAdvantage):
    """GRPO with as much of a failed chain's blame removed as ``oracle_credit`` removes, at a
    uniformly random place (a control: it must not beat GRPO)."""

    placement = "sham"


class AntiCreditAdvantage(OracleCreditAdvantage):
    """GRPO with a failed chain's blame only on its right prefix (a control: it must lose)."""

    placement = "anti"


@dataclass
class RewardFlipConfig(GRPOAdvantage.Config):
    """Attributes: GRPO's ``std``, ``eps`` and ``zero_std_tol``, and
    rate: Probability that a row's reward ``r`` is replaced by ``1 - r``, in [0, 0.5)."""

    rate: float = 0.25

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.rate < 0.5:
            raise ConfigError(
                f"advantage.rate must be in [0, 0.5) (at 0.5 the reward carries no signal); got {self.rate!r}."
            )


class RewardFlipAdvantage(GRPOAdvantage):
    """GRPO on rewards flipped at a set rate: a learning signal of known size, ``1 - 2 rate``."""

    Config = RewardFlipConfig

    def estimate(self, batch: RolloutBatch, ctx: PolicyHandle | None = None) -> Advantages:
        """Advantages of ``batch``.

        Args:
            batch: Uses ``rewards`` (B,) in [0, 1], ``group_ids`` (B,) and ``loss_mask`` (B, T).
            ctx: Supplies ``rng``: row ``i`` is flipped when a uniform draw is below ``rate``.

        Returns:
            ``Advantages`` (B, T): GRPO's advantage of the flipped rewards on every trained token.
            Metrics: GRPO's and ``flipped`` (rows flipped).

        Raises:
            InputError: A reward outside [0, 1], or no ``ctx`` to draw from.
        """
        if ctx is None:
            raise InputError("advantage=reward_flip needs the step's policy handle (its rng)")
        r = batch.rewards
        if r.numel() and (float(r.min()) < 0 or float(r.max()) > 1):
            raise InputError(
                f"advantage=reward_flip flips rewards r -> 1 - r and needs them in [0, 1]; got "
                f"[{float(r.min()):g}, {float(r.max()):g}]"
            )
        flip = (torch.rand(r.shape, generator=ctx.rng, device="cpu") < self.config.rate).to(r.device)
        out = self.from_rewards(batch, torch.where(flip, 1 - r, r))
        return Advantages(values=out.values, metrics={**out.metrics, "flipped": Sum(int(flip.sum()))})

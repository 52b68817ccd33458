"""Credit-quality metrics (METHODS.md §7, ours): how an estimator's advantages sit relative to the
true first wrong step of failed trajectories, on tasks whose problems carry a step oracle.

For every failed trajectory (reward below ``success_reward``) whose problem has an oracle, the
response is split into thoughts (delimiter token ids; a lone trailing EOS joins the last one), the
oracle names the first wrong thought k, and the trajectory's negative advantage mass
``sum(max(-A_t, 0))`` over trained tokens is split into the share on thoughts before k, on k and
after k. The first wrong thought is also ranked among the trajectory's thoughts by mean |A| over
its trained tokens (rank 1 = most credit). GRPO's uniform advantage spreads mass in proportion to
thought length: that is the baseline every finer estimator should beat (more mass at/after k,
rank nearer 1). Logged as ``train/credit/*`` by the module for every estimator alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from creditlab.step.generation import completion_spans, span_texts
from creditlab.types import Mean, RolloutBatch, Sum


class CreditMetrics:
    """Computes the metrics for one batch.

    Args:
        tokenizer: The policy's tokenizer (decodes thoughts for the oracle).
        delimiter: Thought delimiter text.
        success_reward: Trajectories with at least this reward are not scored.
    """

    def __init__(self, tokenizer: object, delimiter: str, success_reward: float = 1.0) -> None:
        self.tokenizer = tokenizer
        self.delimiter_ids: Sequence[int] = tokenizer.encode(delimiter, add_special_tokens=False)  # type: ignore[attr-defined]
        self.eos_id = getattr(tokenizer, "eos_token_id", None)
        self.success_reward = success_reward

    def __call__(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """Metrics for ``advantages`` (B, T) on ``batch``; ``{}`` when no row can be scored."""
        adv = (advantages * batch.loss_mask).float()
        sums = {"before": 0.0, "at": 0.0, "after": 0.0}
        ranks, rel_ranks, scored, massed = [], [], 0, 0
        for b, traj in enumerate(batch.trajectories):
            problem = traj.problem
            if problem.oracle is None or traj.reward >= self.success_reward:
                continue
            spans = completion_spans(traj.completion, self.delimiter_ids, self.eos_id)
            if not spans:
                continue
            truth = problem.oracle(span_texts(self.tokenizer, traj.completion.response_ids, spans))
            if truth is None:
                continue
            k = min(truth, len(spans) - 1)
            neg = (-adv[b]).clamp(min=0)
            mass = [float(neg[a:e].sum()) for a, e in spans]
            total = sum(mass)
            mask = batch.loss_mask[b]
            strength = [
                float(adv[b, a:e].abs().sum() / mask[a:e].sum()) if mask[a:e].sum() > 0 else -1.0
                for a, e in spans
            ]
            scored += 1
            if total > 0:
                massed += 1
                sums["before"] += sum(mass[:k]) / total
                sums["at"] += mass[k] / total
                sums["after"] += sum(mass[k + 1 :]) / total
            if strength[k] >= 0:
                trained = [s for s in strength if s >= 0]
                rank = 1 + sum(s > strength[k] for s in trained)
                ranks.append(rank)
                rel_ranks.append((rank - 1) / max(len(trained) - 1, 1))
        if not scored:
            return {}
        out: dict[str, float] = {"scored": Sum(scored), "with_negative_mass": Sum(massed)}
        if massed:
            out.update({f"neg_mass_{key}": Mean(value / massed) for key, value in sums.items()})
        if ranks:
            out["first_wrong_rank"] = Mean(sum(ranks) / len(ranks))
            out["first_wrong_rank_relative"] = Mean(sum(rel_ranks) / len(rel_ranks))
        return out

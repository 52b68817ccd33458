"""IBPO advantages — "Reducing Credit Assignment Variance via Counterfactual Reasoning Paths",
arXiv 2605.16302 (METHODS.md §4). No public code; see ``docs/methods/ibpo.md``.

[paper] Several trajectories per input; their differences approximate alternative decisions; an
implicit process-level advantage turns the terminal reward into a step-sensitive signal; credit
concentrates on the tokens where an incorrect trajectory differs from a correct one (a
compare-and-correct operator); it plugs into GRPO-style objectives. Everything below is [ours].

**Outcomes and base advantage.** A row is *correct* when its reward is at least
``success_reward`` (as the reset buffer decides). ``A_i`` is the GRPO group advantage
(:func:`creditlab.step.advantages.group_advantages`, knobs ``std``/``eps``/``zero_std_tol`` as the
``grpo`` estimator). A group whose rows all have the same outcome (all correct or all incorrect,
singletons included) falls back to plain GRPO: ``A_i`` on every trained token
(``fallback_groups``).

**Which tokens diverge** (``mode``), in a group with both outcomes:

* ``contrast`` (default; no generation): every row is aligned (:mod:`creditlab_ibpo.align`, over
  its whole response, token ids) with every row of the *opposite* outcome in its group, once per
  (incorrect, correct) pair. ``granularity=segment`` aligns segments first (``batch.segments``,
  e.g. thoughts) and tokens inside differing segments; without segments, or with
  ``granularity=token``, tokens only. A token is *shared* when it is matched with at least a
  fraction ``shared_fraction`` of the opposite-outcome rows (a small value such as 1e-6 means
  "with any", 1.0 "with all"); the other tokens are *divergent*.
* ``repair``: each incorrect row with trained tokens and ``A_i != 0`` gets one repair request:
  the problem, the incorrect attempt and the correct row of its group nearest to it (highest
  alignment similarity; lowest row on ties) in :func:`repair_prompt`, sampled and scored through
  ``ctx.rollouts`` (the run's rollout settings and verifier), all in one call. The incorrect row
  is aligned with its repair at token level; its deleted or replaced tokens are divergent, the
  tokens the repair keeps are shared. Correct rows keep the uniform GRPO advantage. A row falls
  back to its ``contrast`` tokens when the call raises or returns the wrong number of results
  (every row of the call), the repair has no tokens besides EOS/pad, or, with
  ``require_correct``, the verifier rejects it (``repair_failures``); and when the repair equals
  the attempt (``repair_unchanged``). The repair is never trained on (not implemented).

**Weights and mass.** On the trained tokens (``loss_mask > 0``) of a row of a mixed group,
``w_t = 1`` on divergent tokens and ``w_min`` on shared ones, rescaled so that the row's
advantages sum to ``A_i * L_i`` (``L_i`` trained tokens):
``A_{i,t} = A_i * w_t * L_i / sum_s w_s`` — the row's total credit is GRPO's, moved onto its
divergent tokens. A row whose trained tokens are all shared or all divergent (or whose weights
sum to 0, ``w_min = 0``) gets the uniform ``A_i``. Values are exactly 0 where ``loss_mask`` is 0.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from creditlab import (
    STD_OPTIONS,
    AdvantageEstimator,
    Advantages,
    ConfigError,
    GenerationRequest,
    Mean,
    PolicyHandle,
    RolloutBatch,
    Sum,
    Trajectory,
    group_advantages,
)

from creditlab_ibpo.align import align, similarity, token_matches

log = logging.getLogger(__name__)

MODES = ("contrast", "repair")
GRANULARITIES = ("segment", "token")

#: Counters summed over ``estimate`` calls; ratios are formed in :func:`_summarize`.
_COUNTS = (
    "groups", "zero_std_groups", "singleton_groups", "fallback_groups", "mixed_groups",
    "aligned_pairs", "weighted_rows", "weighted_tokens", "divergent_tokens",
    "abs_mass", "divergent_mass", "repair_requests", "repair_failures", "repair_unchanged",
    "repair_correct", "repair_tokens",
)
_REPAIR_KEYS = ("repair_requests", "repair_failures", "repair_unchanged", "repair_tokens")


def repair_prompt(problem: str, attempt: str, reference: str) -> str:
    """The request to minimally edit an incorrect attempt into a correct solution [ours].

    Args:
        problem: The problem text (``Problem.prompt``).
        attempt: The incorrect response, decoded.
        reference: A correct response to the same problem, decoded.

    Returns:
        Plain text (the handle's ``encode`` applies the chat template, if any).
    """
    return (
        "A problem, a correct solution to it and an attempt that reaches a wrong answer follow.\n"
        "Rewrite the attempt so that it is correct while changing as little of it as possible: "
        "keep every part of it that is right exactly as written, in the same format, and change "
        "only what is wrong. Reply with the rewritten attempt alone.\n\n"
        f"Problem: {problem.strip()}\n\n"
        f"Correct solution:\n{reference.strip()}\n\n"
        f"Attempt:\n{attempt.strip()}\n\n"
        "Rewritten attempt:\n"
    )


def _text(traj: Trajectory, tokenizer: Any) -> str:
    """A trajectory's response text: ``completion.text``, else its ids decoded (special tokens
    skipped) when a tokenizer is available."""
    c = traj.completion
    if c.text or tokenizer is None:
        return c.text
    return str(tokenizer.decode(list(c.response_ids), skip_special_tokens=True))


def _summarize(c: dict[str, float], mode: str, abs_mean: float) -> dict[str, float]:
    """Metrics from summed counters (ratios of sums, 0 when a denominator is 0); ``abs_mean`` is
    GRPO's, computed as GRPO computes it (float32), so a run at ``w_min = 1`` logs GRPO's value."""

    def ratio(a: float, b: float) -> float:
        return a / b if b else 0.0

    out: dict[str, float] = {
        k: Sum(c[k]) for k in ("groups", "zero_std_groups", "singleton_groups", "fallback_groups",
                               "mixed_groups", "aligned_pairs", "weighted_rows", "weighted_tokens")
    }
    out.update(
        abs_mean=Mean(abs_mean),
        divergent_frac=Mean(ratio(c["divergent_tokens"], c["weighted_tokens"])),
        divergent_mass_frac=Mean(ratio(c["divergent_mass"], c["abs_mass"])),
    )
    if mode == "repair":
        out.update({k: Sum(c[k]) for k in _REPAIR_KEYS})
        out["repair_correct_rate"] = Mean(ratio(c["repair_correct"], c["repair_requests"]))
    return out


class IBPOAdvantage(AdvantageEstimator):
    """GRPO advantages moved onto the tokens where a row departs from the opposite outcome."""

    @dataclass
    class Config:
        """Attributes:
        mode: ``contrast`` (align with opposite-outcome rows of the group, no generation) or
            ``repair`` (align incorrect rows with a policy-generated minimal repair).
        w_min: Weight of shared tokens before mass preservation, in [0, 1] (divergent: 1).
        shared_fraction: A token is shared when matched with at least this fraction of the
            opposite-outcome rows, in (0, 1] (tiny = "any", 1 = "all"). ``contrast`` only.
        granularity: ``segment`` (segments first, tokens inside differing ones; token level when
            the batch has no segments) or ``token``. ``contrast`` only.
        min_match: Token-level matching blocks shorter than this count as unmatched (>= 1).
        success_reward: A row is correct when its reward is at least this (the run's
            ``rollout.success_reward`` in the shipped YAML).
        require_correct: ``repair``: use a repair only when the verifier accepts it.
        std: GRPO group std: ``sample``, ``population`` or ``none``.
        eps: Added to the group std.
        zero_std_tol: Groups whose std is below this get advantage 0.
        """

        mode: str = "contrast"
        w_min: float = 0.1
        shared_fraction: float = 0.5
        granularity: str = "segment"
        min_match: int = 1
        success_reward: float = 1.0
        require_correct: bool = False
        std: str = "sample"
        eps: float = 1e-6
        zero_std_tol: float = 1e-8

        def __post_init__(self) -> None:
            def need(ok: bool, key: str, what: str) -> None:
                if not ok:
                    raise ConfigError(
                        f"advantage.{key} must be {what}; got {getattr(self, key)!r}."
                    )

            need(self.mode in MODES, "mode", f"one of {', '.join(MODES)}")
            need(self.granularity in GRANULARITIES, "granularity",
                 f"one of {', '.join(GRANULARITIES)}")
            need(self.std in STD_OPTIONS, "std", f"one of {', '.join(STD_OPTIONS)}")
            need(0.0 <= self.w_min <= 1.0, "w_min", "in [0, 1]")
            need(0.0 < self.shared_fraction <= 1.0, "shared_fraction", "in (0, 1]")
            need(isinstance(self.min_match, int) and self.min_match >= 1, "min_match",
                 "an int >= 1")
            need(math.isfinite(self.success_reward), "success_reward", "finite")
            need(self.eps >= 0, "eps", ">= 0")
            need(self.zero_std_tol >= 0, "zero_std_tol", ">= 0")

    def __init__(self, config: Config | None = None) -> None:
        super().__init__(config)
        self._call = dict.fromkeys(_COUNTS, 0.0)

    def _add(self, key: str, value: float) -> None:
        """Count into this call's metrics."""
        self._call[key] += float(value)

    # -------------------------------------------------------------------------- estimator
    def estimate(self, batch: RolloutBatch, ctx: PolicyHandle) -> Advantages:
        """IBPO advantages of ``batch``.

        Args:
            batch: Uses ``rewards``/``group_ids`` (B,), ``response_ids``/``response_mask``/
                ``loss_mask`` (B, T), ``segments`` (optional) and, in ``repair`` mode,
                ``trajectories``.
            ctx: The current policy; only ``repair`` uses it (``encode``, ``rollouts``,
                ``tokenizer``).

        Returns:
            ``Advantages`` with values (B, T) (dtype of ``loss_mask``): ``A_i * w_t * L_i /
            sum_s w_s`` on trained tokens of rows in mixed groups, ``A_i`` on those of other
            rows, exactly 0 where ``loss_mask`` is 0. Metrics of this batch: GRPO's ``groups``,
            ``zero_std_groups``, ``singleton_groups``, ``abs_mean`` (mean |A_i|);
            ``fallback_groups`` (single-outcome groups, plain GRPO), ``mixed_groups``,
            ``aligned_pairs``; over the trained tokens of rows with a divergence mask,
            ``weighted_rows``, ``weighted_tokens``, ``divergent_frac`` (fraction marked divergent)
            and ``divergent_mass_frac`` (fraction of |advantage| on them); in ``repair`` mode also
            ``repair_requests``, ``repair_failures``, ``repair_unchanged``, ``repair_tokens``
            (generated) and ``repair_correct_rate``.
        """
        batch = batch.to("cpu")  # per-row bookkeeping runs on the host: one copy (advantages go back once)
        cfg = self.config
        self._call = dict.fromkeys(_COUNTS, 0.0)
        adv, gm = group_advantages(
            batch.rewards, batch.group_ids, cfg.std, cfg.eps, cfg.zero_std_tol
        )
        as_grpo = adv.to(batch.loss_mask.dtype if batch.loss_mask.is_floating_point() else adv.dtype)
        abs_mean = float(as_grpo.abs().mean()) if adv.numel() else 0.0  # GRPO's metric, as GRPO computes it
        adv = adv.to(torch.float64)
        for key in ("groups", "zero_std_groups", "singleton_groups"):
            self._add(key, gm[key])

        divergent, contrast, jobs = self.divergence(batch, adv)
        if jobs:
            self.repair(batch, ctx, jobs, divergent, contrast)
        values = self._weigh(batch, adv, divergent)
        return Advantages(values=values, metrics=_summarize(self._call, cfg.mode, abs_mean))

    def divergence(
        self, batch: RolloutBatch, adv: torch.Tensor
    ) -> tuple[list[list[bool] | None], list[list[bool] | None], list[tuple[int, int]]]:
        """Contrast alignment of every mixed group.

        Args:
            batch: The rollout batch.
            adv: (B,) GRPO advantages.

        Returns:
            ``(divergent, contrast, jobs)``: per row its divergent-token mask over the response
            (``None`` = uniform weights) as the mode sets it; the ``contrast`` masks of every row
            of a mixed group; and, in ``repair`` mode, the ``(incorrect row, reference row)``
            pairs to repair (their ``divergent`` entry holds the contrast mask until repaired).
        """
        cfg = self.config
        b_size = batch.size
        lengths = [int(round(float(x))) for x in batch.response_mask.sum(1)]
        tokens = [batch.response_ids[b, :n].tolist() for b, n in enumerate(lengths)]
        use_segments = cfg.granularity == "segment" and batch.segments is not None
        spans = [batch.segments.spans[b] if use_segments else None for b in range(b_size)]
        correct = [float(r) >= cfg.success_reward for r in batch.rewards.tolist()]
        trained = (batch.loss_mask > 0).any(1).tolist()
        contrast: list[list[bool] | None] = [None] * b_size
        divergent: list[list[bool] | None] = [None] * b_size
        jobs: list[tuple[int, int]] = []
        rows_of: dict[int, list[int]] = {}
        for b, g in enumerate(batch.group_ids.tolist()):
            rows_of.setdefault(int(g), []).append(b)
        for rows in rows_of.values():
            bad = [b for b in rows if not correct[b]]
            good = [b for b in rows if correct[b]]
            bad_set = set(bad)
            if not bad or not good:
                self._add("fallback_groups", 1)
                continue
            self._add("mixed_groups", 1)
            hits = {b: [0] * lengths[b] for b in rows}
            sim: dict[tuple[int, int], float] = {}
            for i in bad:
                for j in good:
                    mi, mj = align(tokens[i], tokens[j], spans[i], spans[j], cfg.min_match)
                    hits[i] = [h + m for h, m in zip(hits[i], mi)]
                    hits[j] = [h + m for h, m in zip(hits[j], mj)]
                    sim[(i, j)] = similarity(mi, mj)
                    self._add("aligned_pairs", 1)
            for b in rows:
                opposite = len(good) if b in bad_set else len(bad)
                contrast[b] = [h / opposite < cfg.shared_fraction for h in hits[b]]
            for b in rows:
                if cfg.mode == "contrast" or b in bad_set:
                    divergent[b] = contrast[b]
                if cfg.mode == "repair" and b in bad_set and trained[b] and float(adv[b]) != 0.0:
                    ref = max(good, key=lambda j: (sim[(b, j)], -j))
                    jobs.append((b, ref))
        return divergent, contrast, jobs

    def repair(
        self,
        batch: RolloutBatch,
        ctx: PolicyHandle,
        jobs: Sequence[tuple[int, int]],
        divergent: list[list[bool] | None],
        contrast: Sequence[list[bool] | None],
    ) -> None:
        """Ask the policy for minimal repairs and set ``divergent`` of each repaired row in place
        (rows whose repair fails keep their ``contrast`` mask).

        Args:
            batch: The rollout batch.
            ctx: The current policy (``encode``, ``rollouts``, ``tokenizer``).
            jobs: ``(incorrect row, correct reference row)`` pairs.
            divergent: Per row, its divergent-token mask (updated).
            contrast: Per row, its contrast mask (the fallback).
        """
        cfg = self.config
        tok = ctx.tokenizer
        problems, requests = [], []
        for row, ref in jobs:
            traj = batch.trajectories[row]
            text = repair_prompt(
                traj.problem.prompt, _text(traj, tok), _text(batch.trajectories[ref], tok)
            )
            problems.append(traj.problem)
            requests.append(GenerationRequest(tuple(int(i) for i in ctx.encode(text))))
        self._add("repair_requests", len(jobs))
        try:
            results = list(ctx.rollouts(problems, requests))
            if len(results) != len(requests):
                raise RuntimeError(f"{len(results)} repairs for {len(requests)} requests")
        except Exception as exc:  # noqa: BLE001 - any failure falls back to contrast (spec)
            log.warning("IBPO repair failed for %d rows (%s: %s); they fall back to contrast",
                        len(jobs), type(exc).__name__, exc)
            self._add("repair_failures", len(jobs))
            return
        skip = {getattr(tok, "eos_token_id", None), getattr(tok, "pad_token_id", None)} - {None}
        for (row, _), res in zip(jobs, results):
            ids = [int(i) for i in res.completion.response_ids]
            ok = float(res.reward) >= cfg.success_reward
            self._add("repair_correct", ok)
            self._add("repair_tokens", len(res.completion.logprobs))
            attempt = batch.response_ids[row, : int(round(float(batch.response_mask[row].sum())))]
            attempt = attempt.tolist()
            if not [i for i in ids if i not in skip] or (cfg.require_correct and not ok):
                self._add("repair_failures", 1)
                divergent[row] = contrast[row]
            elif ids == attempt:
                self._add("repair_unchanged", 1)
                divergent[row] = contrast[row]
            else:
                kept, _ = token_matches(attempt, ids, cfg.min_match)
                divergent[row] = [not k for k in kept]

    def _weigh(
        self, batch: RolloutBatch, adv: torch.Tensor, divergent: Sequence[list[bool] | None]
    ) -> torch.Tensor:
        """(B, T) advantages from (B,) ``adv`` and the per-row divergent masks (see the module
        docstring), in the dtype of ``loss_mask``; counts the divergence metrics."""
        cfg = self.config
        shape = batch.loss_mask.shape
        div = torch.zeros(shape, dtype=torch.bool, device="cpu")
        weighted = torch.zeros(shape[0], dtype=torch.bool, device="cpu")
        for b, mask in enumerate(divergent):
            if mask is not None:
                weighted[b] = True
                div[b, : len(mask)] = torch.tensor(mask, dtype=torch.bool, device="cpu")
        trained = batch.loss_mask.detach().cpu() > 0  # (B, T)
        w = torch.ones(shape, dtype=torch.float64, device="cpu")
        w[weighted[:, None] & ~div] = cfg.w_min
        length = trained.sum(1).to(torch.float64)  # (B,)
        total = torch.where(trained, w, 0.0).sum(1)
        ok = total > 0
        scale = torch.where(ok, length / torch.where(ok, total, 1.0), 1.0)
        w = torch.where(ok[:, None], w * scale[:, None], torch.ones_like(w))
        values = torch.where(trained, adv.cpu()[:, None] * w, 0.0)  # (B, T) float64

        rows = weighted[:, None] & trained
        self._add("weighted_rows", float((weighted & trained.any(1)).sum()))
        self._add("weighted_tokens", float(rows.sum()))
        self._add("divergent_tokens", float((rows & div).sum()))
        self._add("abs_mass", float(values.abs()[rows].sum()))
        self._add("divergent_mass", float(values.abs()[rows & div].sum()))
        dtype = batch.loss_mask.dtype if batch.loss_mask.is_floating_point() else torch.float32
        return values.to(dtype=dtype, device=batch.loss_mask.device)

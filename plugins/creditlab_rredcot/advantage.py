"""RREDCoT advantages — "Segment-Level Reward Redistribution for Reasoning Models",
arXiv 2606.06475 (METHODS.md §5). No public code; see ``docs/methods/rredcot.md``.

[paper] RUDDER-style redistribution: a segment's credit is the change in expected outcome across
it; the policy itself estimates the values without extra generation; the estimator is biased low
for non-negative utilities. What follows is [ours] where the paper is silent.

**Values.** A trajectory's *states* are the prompt (``s_0``) and the prompt plus its response up
to each segment start. ``V(s) = sum_y pi(y | s) U(y)`` over the distinct final answers ``y`` of
its pool (``answer_pool``: the advantage group by default, or every row of the same problem):
the answers the verifier parsed (``traj.info["parsed"]``; unparsed rows contribute no answer),
identified by their token ids, with ``U(y)`` the mean reward of the rows that gave ``y``.
``pi(y | s)`` is the product of the teacher-forced probabilities of the tokens of
``answer_suffix``-terminated ``y`` after ``s + cue`` (``s + "\\boxed{" + y + "}"``); the cue's own
tokens are not scored. The closing suffix makes distinct answers disjoint events (no answer's
token sequence is a prefix of another's unless an answer contains the suffix text), so
``sum_y pi(y|s) <= 1`` and, for rewards in [0, 1], ``V`` is in [0, 1]; probability mass on
answers nobody in the pool gave counts as utility 0 (the paper's low bias;
``renormalize=true`` divides by ``sum_y pi(y|s)`` instead). Probabilities come from
the policy at the rollout temperature. All (state, answer) pairs of the batch, deduplicated
(rows of a group share ``s_0`` and often their first thoughts; suffixes of a reset group share
their prefix states), go through ONE ``ctx.branch_logprobs`` call: each response that holds a new
state runs once (its *trunk*), and every ``cue + answer`` continues from the trunk's KV cache at
its state (``max_rows`` > 0 splits the branches into length-sorted chunks). That is about two
forward passes' worth of tokens per step, not one per (state, answer) pair.

**Redistribution.** With states ``s_0 < s_1 < ... < s_{K-1}`` and reward ``R``:
``R~_k = V(s_{k+1}) - V(s_k)`` for ``k < K-1`` and ``R~_{K-1} = R - V(s_{K-1})``, so the sum is
``R - V(s_0)``. (METHODS.md indexes the segments from 1; this is the same sum.) A reset suffix
(``trainable_from = f > 0``) is valued at ``s_0``, at ``f`` and at the segment starts after
``f``; the prefix is one untrained pseudo-segment, so only segments from ``trainable_from`` on
get credit and the sum stays ``R - V(s_0)``.

**Normalization** per advantage group (``norm``): ``reward_std`` (default) divides every
``R~`` by the group's reward std + ``eps`` — a trajectory's summed credit is then
``(R - V(s_0)) / std``, GRPO's advantage with the policy's own ``V(s_0)`` as the baseline;
``segment_std`` standardizes the ``R~`` of the group's trained segments; ``none`` keeps them raw.
A single-outcome group (all rewards within ``zero_std_tol``, or one row) gets 0, as in GRPO
(``single_outcome=zero``); ``single_outcome=raw`` keeps its credit (scale 1 under
``reward_std``). **Mixing**: ``mix = lambda`` adds ``lambda`` times the plain GRPO advantage.
Every segment's value is broadcast to its tokens and zeroed where ``loss_mask`` is 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from creditlab import (
    AdvantageEstimator,
    Advantages,
    ConfigError,
    Mean,
    PolicyHandle,
    RolloutBatch,
    Spans,
    Sum,
    broadcast,
    group_advantages,
)

NORMS = ("reward_std", "segment_std", "none")
POOLS = ("group", "problem")
SINGLE_OUTCOME = ("zero", "raw")
STDS = ("sample", "population")


def states(spans: Spans, trainable_from: int, length: int) -> list[int]:
    """Response positions of the states to value: 0 (the prompt), ``trainable_from`` and every
    segment start after it, ascending. Empty when nothing is trainable."""
    if length <= trainable_from:
        return []
    return sorted({0, trainable_from} | {a for a, _ in spans if trainable_from < a < length})


def redistribute(values: Sequence[float], reward: float) -> list[float]:
    """``R~_k = V(s_{k+1}) - V(s_k)``, the last one ``R - V(s_{K-1})``; sums to ``R - V(s_0)``.

    Args:
        values: (K,) values of the states ``s_0 .. s_{K-1}``.
        reward: The trajectory's reward.
    """
    v = [*values, reward]
    return [v[k + 1] - v[k] for k in range(len(values))]


@dataclass
class RowCredit:
    """One trajectory's redistribution (response coordinates).

    Attributes:
        starts: (K,) state positions; segment k is ``[starts[k], starts[k+1] or length)``.
        values: (K,) ``V(s_k)``.
        credit: (K,) ``R~_k`` before normalization.
        trained: (K,) whether segment k starts at or after ``trainable_from``.
    """

    starts: list[int]
    values: list[float]
    credit: list[float]
    trained: list[bool]


class RREDCoTAdvantage(AdvantageEstimator):
    """Segment credit from the policy's own answer probabilities (reward redistribution)."""

    @dataclass
    class Config:
        """Attributes:
        cue: Text teacher-forced after each state, before the answer.
        answer_suffix: Text closing the answer (scored with it; makes answers disjoint).
        answer_pool: ``group`` (the advantage group) or ``problem`` (every row of the problem).
        renormalize: Divide ``V`` by the pool answers' total probability (removes the low bias).
        norm: ``reward_std`` | ``segment_std`` | ``none`` (see the module docstring).
        std: ``sample`` (ddof 1) or ``population`` (ddof 0), for ``norm`` and the GRPO ``mix``.
        eps: Added to a std before dividing.
        zero_std_tol: Groups (and segment sets) whose std is below this are single-outcome.
        single_outcome: ``zero`` (GRPO's convention) or ``raw`` (keep the redistributed credit).
        mix: Weight of the plain GRPO advantage added to every trained token.
        max_rows: Branches (state, answer pairs) per ``ctx.branch_logprobs`` call (0 = all in one).
        """

        cue: str = "\\boxed{"
        answer_suffix: str = "}"
        answer_pool: str = "group"
        renormalize: bool = False
        norm: str = "reward_std"
        std: str = "sample"
        eps: float = 1e-6
        zero_std_tol: float = 1e-8
        single_outcome: str = "zero"
        mix: float = 0.0
        max_rows: int = 0

        def __post_init__(self) -> None:
            for key, options in (("answer_pool", POOLS), ("norm", NORMS), ("std", STDS),
                                 ("single_outcome", SINGLE_OUTCOME)):
                if getattr(self, key) not in options:
                    raise ConfigError(
                        f"advantage.{key} must be one of {', '.join(options)}; "
                        f"got {getattr(self, key)!r}"
                    )
            for key in ("eps", "zero_std_tol"):
                if not getattr(self, key) >= 0:
                    raise ConfigError(f"advantage.{key} must be >= 0; got {getattr(self, key)!r}")
            if not math.isfinite(self.mix):
                raise ConfigError(f"advantage.mix must be finite; got {self.mix!r}")
            if self.max_rows < 0:
                raise ConfigError(f"advantage.max_rows must be >= 0; got {self.max_rows}")

    # ------------------------------------------------------------------------------ values
    def _encode(self, ctx: PolicyHandle, text: str) -> tuple[int, ...]:
        tok = ctx.tokenizer
        if tok is None:  # handles without a tokenizer (test fakes): their prompt encoding
            return tuple(ctx.encode(text)) if text else ()
        return tuple(tok.encode(text, add_special_tokens=False)) if text else ()

    def _pad_id(self, ctx: PolicyHandle) -> int:
        pad = getattr(ctx.tokenizer, "pad_token_id", None)
        return int(pad) if pad is not None else 0

    def answer_pools(
        self, batch: RolloutBatch, ctx: PolicyHandle
    ) -> tuple[list[Any], dict[Any, dict[tuple[int, ...], float]]]:
        """Per row its pool key, and per pool ``{answer token ids: U}``, answers sorted by ids."""
        keys = [
            int(batch.group_ids[b]) if self.config.answer_pool == "group" else t.problem.id
            for b, t in enumerate(batch.trajectories)
        ]
        rewards: dict[Any, dict[tuple[int, ...], list[float]]] = {k: {} for k in keys}
        for key, traj in zip(keys, batch.trajectories):
            parsed = traj.info.get("parsed") if traj.info else None
            if parsed is None or str(parsed) == "":
                continue
            ids = self._encode(ctx, str(parsed) + self.config.answer_suffix)
            if not ids:
                continue
            rewards[key].setdefault(ids, []).append(float(traj.reward))
        pools = {
            k: {ids: sum(r) / len(r) for ids, r in sorted(ans.items())}
            for k, ans in rewards.items()
        }
        return keys, pools

    def answer_probs(
        self,
        trunks: list[tuple[int, ...]],
        branches: list[tuple[int, int, tuple[int, ...], int]],
        ctx: PolicyHandle,
    ) -> tuple[list[float], int]:
        """``pi(answer | state)`` for each branch ``(trunk, at, ids, n_answer)``: the product of the
        probabilities of the last ``n_answer`` of ``ids`` teacher-forced after the first ``at``
        tokens of ``trunks[trunk]``, from :meth:`PolicyHandle.branch_logprobs` (each trunk runs
        once; the branches continue from it). Returns the probabilities and the number of calls
        (1, or more with ``max_rows``: length-sorted chunks of that many branches)."""
        if not branches:
            return [], 0
        pad = self._pad_id(ctx)
        ids = torch.full((len(trunks), max(len(t) for t in trunks)), pad, dtype=torch.long, device="cpu")
        mask = torch.zeros_like(ids)
        for i, seq in enumerate(trunks):
            ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long, device="cpu")
            mask[i, : len(seq)] = 1
        order = sorted(range(len(branches)), key=lambda j: (branches[j][1] + len(branches[j][2]), j))
        step = self.config.max_rows or len(branches)
        chunks = [order[s : s + step] for s in range(0, len(order), step)] if self.config.max_rows else [
            list(range(len(branches)))
        ]
        out = [0.0] * len(branches)
        for chunk in chunks:
            width = max(len(branches[j][2]) for j in chunk)
            bids = torch.full((len(chunk), width), pad, dtype=torch.long, device="cpu")
            bmask = torch.zeros_like(bids)
            for k, j in enumerate(chunk):
                seq = branches[j][2]
                bids[k, : len(seq)] = torch.tensor(seq, dtype=torch.long, device="cpu")
                bmask[k, : len(seq)] = 1
            rows = torch.tensor([branches[j][0] for j in chunk], dtype=torch.long, device="cpu")
            at = torch.tensor([branches[j][1] for j in chunk], dtype=torch.long, device="cpu")
            logp = ctx.branch_logprobs(ids, mask, rows, at, bids, bmask).to(torch.float64)
            for k, j in enumerate(chunk):
                n, n_ans = len(branches[j][2]), branches[j][3]
                out[j] = math.exp(float(logp[k, n - n_ans : n].sum()))
        return out, len(chunks)

    def redistribute(
        self, batch: RolloutBatch, ctx: PolicyHandle
    ) -> tuple[list[RowCredit], dict[str, float]]:
        """Values and raw redistributed rewards of every row (before normalization).

        Args:
            batch: Uses ``trajectories`` (ids, ``trainable_from``, reward, ``info["parsed"]``),
                ``group_ids`` (B,) and ``segments`` (the whole response is one segment when
                ``None``).
            ctx: Its ``tokenizer`` encodes cue and answers; one ``branch_logprobs`` call values all.

        Returns:
            ``(credits, metrics)`` with one :class:`RowCredit` per row (empty lists for rows with
            nothing trained: ``trainable_from`` at the end or an all-zero ``loss_mask`` row).
        """
        cfg = self.config
        keys, pools = self.answer_pools(batch, ctx)
        cue = self._encode(ctx, cfg.cue) if any(pools.values()) else ()
        index: dict[tuple[Any, tuple[int, ...], tuple[int, ...]], int] = {}
        where: list[tuple[int, int]] = []  # per state: (its trunk, its length in trunk tokens)
        trunks: list[tuple[int, ...]] = []
        row_states: list[list[int]] = []
        for b, traj in enumerate(batch.trajectories):
            c = traj.completion
            n = len(c.response_ids)
            spans = batch.segments.spans[b] if batch.segments is not None else ((0, n),)
            starts = states(tuple(spans), traj.trainable_from, n)
            if not bool((batch.loss_mask[b] > 0).any()):
                starts = []  # nothing trained (e.g. a masked truncation): nothing to value
            row_states.append(starts)
            new = [s for s in starts if pools[keys[b]] and (keys[b], c.prompt_ids, c.response_ids[:s]) not in index]
            if new:  # this row is the trunk of the states first seen in it
                trunks.append((*c.prompt_ids, *c.response_ids))
            for s in new:
                index[(keys[b], c.prompt_ids, c.response_ids[:s])] = len(index)
                where.append((len(trunks) - 1, len(c.prompt_ids) + s))
        branches, owners = [], []
        for (key, _, _), state in index.items():
            trunk, at = where[state]
            for ans, utility in pools[key].items():
                branches.append((trunk, at, (*cue, *ans), len(ans)))
                owners.append((state, utility))
        probs, calls = self.answer_probs(trunks, branches, ctx)
        value = [0.0] * len(index)
        mass = [0.0] * len(index)
        for (state, utility), p in zip(owners, probs):
            value[state] += p * utility
            mass[state] += p
        if cfg.renormalize:
            value = [v / m if m > 0 else 0.0 for v, m in zip(value, mass)]

        credits = []
        for b, (traj, starts) in enumerate(zip(batch.trajectories, row_states)):
            c = traj.completion
            if pools[keys[b]]:
                v = [value[index[(keys[b], c.prompt_ids, c.response_ids[:s])]] for s in starts]
            else:  # no parsed answer in the pool: V = 0 everywhere
                v = [0.0] * len(starts)
            credit = redistribute(v, float(traj.reward)) if starts else []
            trained = [s >= traj.trainable_from for s in starts]
            credits.append(RowCredit(starts, v, credit, trained))

        n_pools = len(pools)
        s0 = [cr.values[0] for cr in credits if cr.values]
        trained_credit = [abs(x) for cr in credits for x, t in zip(cr.credit, cr.trained) if t]
        metrics: dict[str, float] = {
            "value_s0": Mean(sum(s0) / len(s0) if s0 else 0.0),
            "abs_credit": Mean(sum(trained_credit) / len(trained_credit) if trained_credit else 0.0),
            "answers_per_group": Mean(sum(len(a) for a in pools.values()) / max(n_pools, 1)),
            "no_answer_groups": Sum(sum(1 for a in pools.values() if not a)),
            "answer_mass": Mean(sum(mass) / len(mass) if mass else 0.0),
            "states": Sum(len(index)),
            "value_rows": Sum(len(branches)),
            "value_tokens": Sum(sum(len(t) for t in trunks) + sum(len(b[2]) + 1 for b in branches)),
            "value_calls": Sum(calls),
            "segments_per_row": Mean(
                sum(sum(cr.trained) for cr in credits) / len(credits) if credits else 0.0
            ),
        }
        return credits, metrics

    # -------------------------------------------------------------------------- advantages
    def estimate(self, batch: RolloutBatch, ctx: PolicyHandle) -> Advantages:
        """Advantages of ``batch``.

        Args:
            batch: As :meth:`redistribute`, plus ``rewards`` (B,) and ``loss_mask`` (B, T).
            ctx: The current policy (one ``branch_logprobs`` call; no generation).

        Returns:
            ``values`` (B, T): segment k's normalized ``R~_k`` (+ ``mix`` x the GRPO advantage) on
            its tokens, exactly 0 where ``loss_mask`` is 0. Metrics: ``value_s0`` (mean
            ``V(s_0)`` over rows), ``abs_credit`` (mean raw ``|R~|`` over trained segments),
            ``answers_per_group``, ``no_answer_groups``, ``answer_mass`` (mean
            ``sum_y pi(y|s)`` over states), ``states``, ``value_rows``, ``value_tokens``,
            ``value_calls``, ``segments_per_row``, ``single_outcome_groups``, ``abs_mean``.
        """
        batch = batch.to("cpu")  # per-row bookkeeping runs on the host: one copy (advantages go back once)
        cfg = self.config
        credits, metrics = self.redistribute(batch, ctx)
        scale, shift, single = self._group_norm(batch, credits)
        out = torch.zeros(batch.loss_mask.shape, dtype=torch.float64, device="cpu")
        for b, (traj, cr) in enumerate(zip(batch.trajectories, credits)):
            n = len(traj.completion.response_ids)
            ends = [*cr.starts[1:], n]
            g = int(batch.group_ids[b])
            for start, end, x, trained in zip(cr.starts, ends, cr.credit, cr.trained):
                if trained:
                    out[b, start:end] = (x - shift[g]) * scale[g]
        if cfg.mix:
            grpo, _ = group_advantages(
                batch.rewards.to(torch.float64), batch.group_ids, cfg.std, cfg.eps, cfg.zero_std_tol
            )
            out = out + cfg.mix * broadcast(grpo, batch.loss_mask)
        dtype = batch.loss_mask.dtype if batch.loss_mask.is_floating_point() else torch.float32
        values = torch.where(batch.loss_mask > 0, out, torch.zeros_like(out)).to(dtype)
        trained_tokens = float((batch.loss_mask > 0).sum())
        metrics["single_outcome_groups"] = Sum(single)
        metrics["abs_mean"] = Mean(float(values.abs().sum()) / max(trained_tokens, 1.0))
        return Advantages(values=values, metrics=metrics)

    def _group_norm(
        self, batch: RolloutBatch, credits: list[RowCredit]
    ) -> tuple[dict[int, float], dict[int, float], int]:
        """Per advantage group: ``(scale, shift, number of single-outcome groups)`` so a
        segment's advantage is ``(R~ - shift) * scale``."""
        cfg = self.config
        ddof = 1 if cfg.std == "sample" else 0
        rows_of: dict[int, list[int]] = {}
        for b, g in enumerate(batch.group_ids.tolist()):
            rows_of.setdefault(int(g), []).append(b)
        scale, shift, single = {}, {}, 0
        for g, rows in rows_of.items():
            r = batch.rewards[rows].to(torch.float64)
            one = (
                len(rows) < 2
                or float(r.max() - r.min()) == 0.0
                or float(r.std(correction=ddof)) < cfg.zero_std_tol
            )
            single += int(one)
            scale[g], shift[g] = 1.0, 0.0
            if one and cfg.single_outcome == "zero":
                scale[g] = 0.0
            elif cfg.norm == "reward_std" and not one:
                scale[g] = 1.0 / (float(r.std(correction=ddof)) + cfg.eps)
            elif cfg.norm == "segment_std":
                xs = torch.tensor(
                    [x for b in rows for x, t in zip(credits[b].credit, credits[b].trained) if t],
                    dtype=torch.float64, device="cpu",
                )
                if xs.numel() < 2 or float(xs.std(correction=ddof)) < cfg.zero_std_tol:
                    scale[g] = 0.0
                else:
                    shift[g] = float(xs.mean())
                    scale[g] = 1.0 / (float(xs.std(correction=ddof)) + cfg.eps)
        return scale, shift, single

"""The reset buffer of RRPO/SRPO (arXiv 2605.25507, METHODS.md §2): base chains, seeds, suffixes.

For each prompt and a budget of N trainable completions, split as ``R x K`` (``R`` reset groups of
``K`` suffixes, a base group of ``N - R*K`` fresh chains):

1. Fresh chains are drawn, at most ``max_seed_draws`` per prompt. Each incorrect chain becomes a
   *seed* while fewer than ``R`` are found (seeds pick reset points and are never trained on);
   every other chain joins the base group while it has room, otherwise it is discarded (counted).
   The base group is thus the first draws *minus the first failures*: it is biased slightly
   toward successes (with success rate p and 1x4, its expected failures are 4(1-p) - (p - p^5)
   instead of 4(1-p)), as in the official code. A chain with no thought joins the base group with
   reward 0 and is never a seed.
2. Fewer than ``R`` seeds within the draws: the fallback, one plain GRPO group of N — the base
   chains, then the seeds found (as ordinary failed chains), then fresh chains up to N. This is
   the official 1x4 fallback. Our choice for the splits without a base group (2x4, 1x8): the
   official loops refill from the chains they already drew, mostly correct ones (for 1x8 the
   group is the first 8 draws, all correct or empty since no failure was found in 12, so its
   advantages are zero unless a chain is empty); we discard those chains and draw fresh ones, so
   that the fallback group is an i.i.d. GRPO group, not draws selected for succeeding.
   Otherwise the base group is topped up with fresh chains to ``N - R*K``.
3. The reset selector picks a thought of each seed; ``K`` suffixes continue from the seed's
   response token ids up to the start of that thought (never re-tokenized text). A suffix trains
   from the prefix end (``trainable_from``) unless ``mask_prefix`` is off (the ``no_mask``
   ablation).

Draws are batched: the first round generates, for every prompt, exactly as many chains as it can
place (open base slots + missing seeds). With ``draw_ahead``, a prompt that still lacks seeds
after that draws all of its remaining draws in the second round (otherwise: again as many as it
can place, round after round, one chain at a time in the worst case). Chains are placed in draw
order and those drawn beyond the point where one-at-a-time drawing would have stopped are not
used (counted as ``speculative``; their tokens count as generated), so the buffer has the
distribution of one-at-a-time drawing with at most two draw rounds. The base group's top-up and
the suffixes are generated in one call.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from creditlab import (
    ConfigError,
    GenerationRequest,
    PolicyHandle,
    Problem,
    ResetSelector,
    SampleFn,
    Spans,
    Trajectory,
    completion_spans,
    span_texts,
)


def parse_split(split: str, budget: int | None = None) -> tuple[int, int, int]:
    """``"RxK"`` and the per-prompt budget N -> ``(base_size, reset_groups, suffixes_per_reset)``.

    ``1x4`` with N=8 is the paper's default (base 4 + one reset group of 4); ``2x4`` and ``1x8``
    leave no base group. ``budget=None`` checks the format only (``base_size`` is then 0).

    Raises:
        ConfigError: Not ``RxK`` with R, K >= 1, or R*K above the budget.
    """
    try:
        r, k = (int(x) for x in str(split).lower().split("x"))
    except ValueError:
        raise ConfigError(
            f"rollout.split must look like 'RxK' (R reset groups of K suffixes, e.g. '1x4'), "
            f"got '{split}'"
        ) from None
    if r < 1 or k < 1 or (budget is not None and r * k > budget):
        raise ConfigError(
            f"rollout.split='{split}' needs R, K >= 1 and R*K <= rollout.group_size"
            + (f" ({budget})" if budget is not None else "") + "; e.g. '1x4' or '2x4' for a group "
            "size of 8"
        )
    return (budget - r * k if budget is not None else 0), r, k


def derive_seed(seed: int, *tags: object) -> int:
    """A 63-bit seed from a parent seed and tags (stable across processes)."""
    text = "/".join(str(x) for x in (seed, *tags))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


@dataclass
class _PromptState:
    problem: Problem
    prompt_ids: tuple[int, ...]
    base: list[Trajectory] = field(default_factory=list)
    seeds: list[Trajectory] = field(default_factory=list)
    drawn: list[Trajectory] = field(default_factory=list)  # every fresh chain, in draw order
    discarded: int = 0
    speculative: int = 0  # drawn ahead and not needed
    fallback: bool = False


def _segment_ids(traj: Trajectory, n: int) -> tuple[int, ...] | None:
    """The thought index of the first ``n`` response tokens, when generation recorded them."""
    seg = traj.completion.segment_ids
    return tuple(seg[:n]) if seg else None


@dataclass
class BufferResult:
    """The trajectories to train on plus what was generated and not trained on."""

    trajectories: list[Trajectory]
    seeds: list[Trajectory]
    discarded: list[Trajectory]
    stats: dict[str, float]


class ResetBuffer:
    """Builds the reset buffer for a list of prompts (see the module docstring).

    Args:
        budget: N, trainable completions per prompt (``rollout.group_size``).
        split: ``"RxK"``.
        max_seed_draws: Fresh chains drawn per prompt while looking for seeds.
        success_reward: A chain is correct when its reward is at least this.
        mask_prefix: Suffixes train only after the reset prefix (off = ``no_mask`` ablation).
        delimiter_ids: Token ids of the thought delimiter (thought spans of seeds).
        eos_id: The EOS token id (a lone trailing EOS is not a thought of its own).
        draw_ahead: After the first round, draw every remaining draw of a prompt that still
            lacks seeds at once (at most two draw rounds; see the module docstring).
    """

    def __init__(
        self,
        budget: int,
        split: str,
        max_seed_draws: int,
        success_reward: float,
        mask_prefix: bool,
        delimiter_ids: Sequence[int],
        eos_id: int | None = None,
        draw_ahead: bool = True,
    ) -> None:
        self.eos_id = eos_id
        self.draw_ahead = draw_ahead
        self.budget = budget
        self.base_size, self.reset_groups, self.suffixes = parse_split(split, budget)
        self.max_seed_draws = max_seed_draws
        self.success_reward = success_reward
        self.mask_prefix = mask_prefix
        self.delimiter_ids = tuple(delimiter_ids)

    def spans(self, traj: Trajectory) -> Spans:
        return completion_spans(traj.completion, self.delimiter_ids, self.eos_id)

    # -- step 1: draws ---------------------------------------------------------------------------
    def _place(self, st: _PromptState, traj: Trajectory) -> None:
        st.drawn.append(traj)
        no_thought = not traj.completion.response_ids
        correct = traj.reward >= self.success_reward
        if not no_thought and not correct and len(st.seeds) < self.reset_groups:
            st.seeds.append(traj)
        elif len(st.base) < self.base_size:
            st.base.append(traj)
        else:
            st.discarded += 1

    def _wanted(self, st: _PromptState) -> int:
        need = (self.base_size - len(st.base)) + (self.reset_groups - len(st.seeds))
        return min(need, self.max_seed_draws - len(st.drawn))

    def build(
        self,
        problems: Sequence[Problem],
        prompt_ids: Sequence[tuple[int, ...]],
        sample_fn: SampleFn,
        selector: ResetSelector,
        ctx: PolicyHandle,
        seed: int,
    ) -> BufferResult:
        states = [_PromptState(p, ids) for p, ids in zip(problems, prompt_ids)]
        round_index = 0
        while todo := [(st, self._wanted(st)) for st in states if self._wanted(st) > 0]:
            if self.draw_ahead and round_index > 0:
                todo = [(st, self.max_seed_draws - len(st.drawn)) for st, _ in todo]
            owners = [st for st, n in todo for _ in range(n)]
            trajs = sample_fn(
                [st.problem for st in owners],
                [GenerationRequest(st.prompt_ids) for st in owners],
                derive_seed(seed, "draw", round_index),
            )
            for st, traj in zip(owners, trajs):
                if self._wanted(st) > 0:
                    self._place(st, _no_thought_zero(traj))
                else:  # one-at-a-time drawing would have stopped before this chain
                    st.speculative += 1
            round_index += 1

        # -- step 2: fallback or top-up (generated below, with the suffixes) -------------------------
        top_up: list[tuple[_PromptState, int]] = []
        for st in states:
            if len(st.seeds) < self.reset_groups:  # fallback: one plain group of N
                st.fallback = True
                st.base, st.seeds = (st.base + st.seeds)[: self.budget], []
                top_up.append((st, self.budget - len(st.base)))
            else:
                top_up.append((st, self.base_size - len(st.base)))
        top_owners = [st for st, n in top_up for _ in range(n)]

        # -- step 3: reset points and suffixes -----------------------------------------------------
        seeds = [s for st in states for s in st.seeds]
        seed_spans = [self.spans(s) for s in seeds]
        points = selector.select_many(seeds, seed_spans, ctx) if seeds else []
        prefixes, reset_info = [], []
        for s, spans, point in zip(seeds, seed_spans, points):
            n = len(spans)
            k = 0 if point.segment is None or n == 0 else min(max(point.segment, 0), n - 1)
            prefix = s.completion.response_ids[: spans[k][0]] if n else ()
            texts = span_texts(ctx.tokenizer, s.completion.response_ids, spans) if n else []
            info = {"reset_thought": k + 1, "seed_thoughts": n, **dict(point.info)}
            info.update(_oracle_info(s.problem, texts, k))
            prefixes.append(tuple(prefix))
            reset_info.append(info)
        suffix_reqs = [  # the seed's thoughts travel with the prefix (a capped one stays one)
            GenerationRequest(s.completion.prompt_ids, prefix, _segment_ids(s, len(prefix)))
            for s, prefix in zip(seeds, prefixes)
            for _ in range(self.suffixes)
        ]
        owners = [st.problem for st in top_owners]
        owners += [s.problem for s in seeds for _ in range(self.suffixes)]
        requests = [GenerationRequest(st.prompt_ids) for st in top_owners] + suffix_reqs
        trajs = sample_fn(owners, requests, derive_seed(seed, "suffix")) if requests else []
        for st, traj in zip(top_owners, trajs):
            st.base.append(_no_thought_zero(traj))
        suffixes = trajs[len(top_owners) :]

        # -- assemble groups -------------------------------------------------------------------------
        out: list[Trajectory] = []
        group = 0
        it = iter(zip(suffixes, [i for i in range(len(seeds)) for _ in range(self.suffixes)]))
        for st in states:
            if st.base:
                role = "fallback" if st.fallback else "base"
                out.extend(_with(t, group_id=group, role=role) for t in st.base)
                group += 1
            for _ in st.seeds:
                for _ in range(self.suffixes):
                    traj, i = next(it)
                    start = len(prefixes[i]) if self.mask_prefix else 0
                    info = {**dict(traj.info), **reset_info[i]}
                    out.append(_with(traj, group_id=group, role="reset", trainable_from=start, info=info))
                group += 1

        stats = self._stats(states, seeds, reset_info, suffixes)
        kept = {id(t) for st in states for t in st.base + st.seeds}
        discarded = [t for st in states for t in st.drawn if id(t) not in kept]
        return BufferResult(out, seeds, discarded, stats)

    def _stats(
        self,
        states: Sequence[_PromptState],
        seeds: Sequence[Trajectory],
        reset_info: Sequence[dict],
        suffixes: Sequence[Trajectory],
    ) -> dict[str, float]:
        out = {
            "prompts": float(len(states)),
            "fallback": float(sum(st.fallback for st in states)),
            "seeds": float(len(seeds)),
            "draws": float(sum(len(st.drawn) for st in states)),
            "discarded": float(sum(st.discarded for st in states)),
            "speculative": float(sum(st.speculative for st in states)),
            "suffixes": float(len(suffixes)),
            "suffix_correct": float(sum(t.reward >= self.success_reward for t in suffixes)),
            "reset_thought": float(sum(i["reset_thought"] for i in reset_info)),
            "reset_relative": float(
                sum(i["reset_thought"] / max(i["seed_thoughts"], 1) for i in reset_info)
            ),
        }
        for key in ("oracle_known", "oracle_exact", "oracle_early", "oracle_late", "clean_prefix"):
            out[key] = float(sum(i.get(key, 0) for i in reset_info))
        return out


def _no_thought_zero(traj: Trajectory) -> Trajectory:
    """A chain with no response tokens gets reward 0 (METHODS.md §2)."""
    if traj.completion.response_ids or traj.reward == 0.0:
        return traj
    return _with(traj, reward=0.0)


def _with(traj: Trajectory, **changes: Any) -> Trajectory:
    return replace(traj, **changes)


def _oracle_info(problem: Problem, thoughts: Sequence[str], chosen: int) -> dict[str, int]:
    """Compare a chosen reset thought (0-based) with the task's step oracle, if it has one."""
    if problem.oracle is None or not thoughts:
        return {}
    truth = problem.oracle(list(thoughts))
    if truth is None:
        return {"oracle_known": 0}
    truth = min(truth, len(thoughts) - 1)
    return {
        "oracle_known": 1,
        "oracle_first_wrong": truth + 1,
        "oracle_exact": int(chosen == truth),
        "oracle_early": int(chosen < truth),
        "oracle_late": int(chosen > truth),
        "clean_prefix": int(chosen <= truth),
    }


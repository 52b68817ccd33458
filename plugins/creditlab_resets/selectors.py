"""Reset selectors of RRPO and SRPO, and the oracle selector (arXiv 2605.25507; METHODS.md §2).

Each picks, for a failed chain (the *seed*) split into n thought spans, the 1-indexed thought N
to regenerate from, and returns ``ResetPoint(N - 1)``: the reset prefix is the seed's response
token ids before thought N (the buffer cuts them; ids are never re-tokenized).

* ``random`` (RRPO) [paper/code]: N uniform in {1..n}.
* ``self_localize`` (SRPO) [code]: the current policy is asked which thought went wrong
  (:mod:`creditlab_resets.localize`), sampled at temperature 0.3 by default; its tokens are not
  trained on.
* ``oracle`` [ours, the paper's CARO made concrete]: the task's step oracle names the first wrong
  thought. Only for tasks whose problems carry ``Problem.oracle`` (e.g. ``arith``).

Thought texts (for the localization prompt and the oracle) are each span of
``trajectory.completion.response_ids`` decoded on its own with the policy's tokenizer (special
tokens skipped, the delimiter kept), through :func:`thought_texts`. The buffer compares every
reset point with the oracle when the task has one (exact / early / late, clean prefix); the
selectors log what only they know (parse outcomes, reset positions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from creditlab import (
    ConfigError,
    GenerationRequest,
    InputError,
    Mean,
    PolicyHandle,
    Problem,
    ResetPoint,
    ResetSelector,
    SamplingParams,
    Spans,
    Sum,
    Trajectory,
    encode_prompt,
    span_texts,
)

from creditlab_resets.localize import TEMPLATES, parse_localization


def thought_texts(trajectory: Trajectory, spans: Spans, tokenizer: Any) -> list[str]:
    """The text of each thought of ``trajectory``.

    Args:
        trajectory: Its ``completion.response_ids`` (R,) are decoded.
        spans: n spans ``(start, end)`` over the response ids.
        tokenizer: The policy's tokenizer (``ctx.tokenizer``).

    Returns:
        n strings: each span decoded on its own, special tokens skipped, delimiter kept.
    """
    if tokenizer is None:
        raise ValueError(
            "this reset selector needs the policy's tokenizer to read the seed's thoughts, "
            "but the policy handle has none (ctx.tokenizer is None)"
        )
    return span_texts(tokenizer, trajectory.completion.response_ids, spans)


class _Tally:
    """Counters since the last ``metrics()`` call, shared by the selectors."""

    def __init__(self) -> None:
        self.counts: dict[str, float] = {}

    def add(self, key: str, value: float = 1.0) -> None:
        self.counts[key] = self.counts.get(key, 0.0) + float(value)

    def point(self, n: int, reset_point: int) -> None:
        """One selection: N (1-indexed) among n thoughts."""
        self.add("selections")
        if n < 1:
            self.add("no_thoughts")
            return
        self.add("placed")
        self.add("point", reset_point)
        self.add("relative", reset_point / n)

    def pop(self) -> dict[str, float]:
        """The raw counts (then reset)."""
        out, self.counts = self.counts, {}
        return out


def _summary(c: dict[str, float]) -> dict[str, float]:
    """Selections, seeds without thoughts, mean reset point N and mean N/n."""
    out: dict[str, float] = {"selections": Sum(c.get("selections", 0.0)),
                             "no_thoughts": Sum(c.get("no_thoughts", 0.0))}
    placed = c.get("placed", 0.0)
    if placed:
        out["reset_point_mean"] = Mean(c["point"] / placed)
        out["reset_point_rel_mean"] = Mean(c["relative"] / placed)
    return out


def _rate(c: dict[str, float], key: str, over: str) -> Mean:
    return Mean(c.get(key, 0.0) / c[over] if c.get(over) else 0.0)


class RandomResetSelector(ResetSelector):
    """RRPO (arXiv 2605.25507): reset at a thought drawn uniformly from the seed's thoughts.

    N is uniform in {1..n} (n = ``len(spans)``), drawn from ``ctx.rng`` (deterministic in the
    run's seed and step). A seed with no thoughts (never one in the buffer) resets to segment 0.
    The official code draws N with Python's ``random``; here the step's generator is used.
    """

    def __init__(self, config: Any | None = None) -> None:
        super().__init__(config)
        self._tally = _Tally()

    def select(self, trajectory: Trajectory, spans: Spans, ctx: PolicyHandle) -> ResetPoint:
        """Args: trajectory: the seed; spans: its n thought spans; ctx: supplies ``rng``.

        Returns: ``ResetPoint(N - 1)`` with info ``n_thoughts`` (n), ``reset_point`` (N) and
        ``status`` (``"random"`` or ``"no_thoughts"``).
        """
        n = len(spans)
        if n < 1:
            self._tally.point(0, 1)
            return ResetPoint(0, info={"n_thoughts": 0, "reset_point": 1, "status": "no_thoughts"})
        point = int(torch.randint(1, n + 1, (1,), generator=ctx.rng))
        self._tally.point(n, point)
        info = {"n_thoughts": n, "reset_point": point, "status": "random"}
        return ResetPoint(point - 1, info=info)

    def metrics(self) -> dict[str, float]:
        """``selections``, ``no_thoughts``, ``reset_point_mean`` (N) and ``reset_point_rel_mean``
        (N/n) since the last call (then reset)."""
        c = self._tally.pop()
        return _summary(c) if c else {}


class SelfLocalizeResetSelector(ResetSelector):
    """SRPO (arXiv 2605.25507): the current policy localizes the first wrong thought of the seed.

    One ``ctx.generate`` call serves every seed of :meth:`select_many`: request i is
    ``template(problem_i, thoughts_i)`` (``paper`` or ``compact``; no reset prefix) encoded with
    ``chat_template`` (the official code wraps it in the chat template whatever the rollouts do),
    sampled with this config (one seed drawn from ``ctx.rng``, no stop strings, as the official
    code). Each
    answer is parsed with :func:`~creditlab_resets.localize.parse_localization` into N, and the
    reset point is ``N - 1``. Localization tokens are returned to nobody, so never trained on.
    Seeds without thoughts get segment 0 without a model call. A failing ``generate`` raises
    (the official code falls back to N=1 on any exception; we prefer a loud backend error).
    """

    @dataclass
    class Config:
        """Attributes:
        temperature: Localization sampling temperature (paper 0.3; 0.0 = greedy, used for 1x8).
        top_p: Nucleus truncation of localization sampling (the shipped YAML takes the rollout's,
            as the official code reuses the rollout sampling settings with its own temperature).
        top_k: Top-k truncation (0 = none; the shipped YAML takes the rollout's).
        max_new_tokens: Budget of one localization answer. The official code allows 4096 (the
            policy reasons before boxing); 64 fits the tiny default model, raise it for real ones
            (a cut answer without ``\\boxed{}`` falls back to its last "Step k" phrase, else N=1).
        delimiter: Thought delimiter text, removed from the thoughts shown in the prompt.
        problem_field: ``""`` shows ``Problem.prompt`` as the problem; otherwise the key of
            ``Problem.metadata`` holding the bare problem text (the official prompt shows the
            question without the solving template).
        template: ``paper`` (the official prompt's instructions, in our words) or ``compact``
            (no instructions; for small models warm-started on it, like the tiny arith model).
            The shipped YAML takes it from ``model.localization_template``.
        chat_template: How the localization prompt is encoded: ``"auto"`` (the tokenizer's chat
            template when it has one, as the official code), ``True`` or ``False``; independent
            of ``rollout.chat_template``.
        """

        temperature: float = 0.3
        top_p: float = 1.0
        top_k: int = 0
        max_new_tokens: int = 64
        delimiter: str = "</thought>"
        problem_field: str = ""
        template: str = "paper"
        chat_template: bool | str = "auto"

        def __post_init__(self) -> None:
            if not (self.chat_template == "auto" or isinstance(self.chat_template, bool)):
                raise ConfigError(
                    f"reset_selector.chat_template must be auto, true or false; got "
                    f"{self.chat_template!r}."
                )
            if self.template not in TEMPLATES:
                raise ConfigError(
                    f"reset_selector.template must be one of {', '.join(TEMPLATES)}; "
                    f"got {self.template!r}."
                )
            if not self.temperature >= 0:
                raise ConfigError(
                    f"reset_selector.temperature must be >= 0; got {self.temperature!r}."
                )
            if not 0 < self.top_p <= 1:
                raise ConfigError(f"reset_selector.top_p must be in (0, 1]; got {self.top_p!r}.")
            if self.top_k < 0:
                raise ConfigError(f"reset_selector.top_k must be >= 0; got {self.top_k!r}.")
            if self.max_new_tokens < 1:
                raise ConfigError(
                    f"reset_selector.max_new_tokens must be >= 1; got {self.max_new_tokens!r}."
                )

    def __init__(self, config: Config | None = None) -> None:
        super().__init__(config)
        self._tally = _Tally()

    def _problem_text(self, problem: Problem) -> str:
        key = self.config.problem_field
        if not key:
            return problem.prompt
        if key not in problem.metadata:
            raise InputError(
                f"reset_selector.problem_field='{key}' but problem '{problem.id}' has no such "
                f"metadata key (it has: {', '.join(sorted(problem.metadata)) or 'none'}); set "
                "reset_selector.problem_field to one of them, or to '' to show the prompt"
            )
        return str(problem.metadata[key])

    def sampling(self, seed: int | None) -> SamplingParams:
        """The localization sampling settings with the given seed."""
        cfg = self.config
        return SamplingParams(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            max_new_tokens=cfg.max_new_tokens,
            seed=seed,
        )

    def select(self, trajectory: Trajectory, spans: Spans, ctx: PolicyHandle) -> ResetPoint:
        """:meth:`select_many` with one seed."""
        return self.select_many([trajectory], [spans], ctx)[0]

    def select_many(
        self, trajectories: Sequence[Trajectory], spans: Sequence[Spans], ctx: PolicyHandle
    ) -> list[ResetPoint]:
        """Localize the first wrong thought of B seeds with one batched generation.

        Args:
            trajectories: B failed chains.
            spans: B span tuples; seed i has n_i = ``len(spans[i])`` thoughts.
            ctx: The current policy (``tokenizer``, ``generate``, ``rng``).

        Returns:
            B reset points, ``ResetPoint(N_i - 1)``, info: ``n_thoughts`` (n_i),
            ``reset_point`` (N_i), ``status`` (see ``parse_localization``) and ``localization``
            (the raw answer text; ``""`` when no call was made).
        """
        if len(trajectories) != len(spans):
            raise ValueError(
                f"select_many got {len(trajectories)} trajectories but {len(spans)} span tuples"
            )
        delim = self.config.delimiter
        points: list[ResetPoint | None] = [None] * len(trajectories)
        requests, asked = [], []
        for i, (traj, sp) in enumerate(zip(trajectories, spans)):
            n = len(sp)
            if n < 1:
                self._tally.point(0, 1)
                info = {"n_thoughts": 0, "reset_point": 1, "status": "no_thoughts"}
                points[i] = ResetPoint(0, info={**info, "localization": ""})
                continue
            texts = thought_texts(traj, sp, ctx.tokenizer)
            template = TEMPLATES[self.config.template]
            prompt = template(self._problem_text(traj.problem), texts, delimiter=delim)
            ids = encode_prompt(
                ctx.tokenizer, prompt, self.config.chat_template, "reset_selector.chat_template"
            )
            requests.append(GenerationRequest(tuple(ids)))
            asked.append((i, n))
        if requests:
            seed = int(torch.randint(0, 2**62, (1,), generator=ctx.rng))
            answers = ctx.generate(requests, self.sampling(seed))
            if len(answers) != len(requests):
                raise RuntimeError(
                    f"the policy returned {len(answers)} localization answers for "
                    f"{len(requests)} requests"
                )
            for (i, n), answer in zip(asked, answers):
                point, status = parse_localization(answer.text, n)
                self._tally.point(n, point)
                self._tally.add("localizations")
                self._tally.add(status)
                self._tally.add("localization_tokens", len(answer.logprobs))
                info = {"n_thoughts": n, "reset_point": point, "status": status}
                points[i] = ResetPoint(point - 1, info={**info, "localization": answer.text})
        assert all(p is not None for p in points)
        return points  # type: ignore[return-value]

    def metrics(self) -> dict[str, float]:
        """Since the last call (then reset): ``localizations`` (model answers), their
        ``parse_failure_rate`` (status ``fallback``), ``no_error_rate`` (``\\boxed{0}``),
        ``boxed_rate``, ``step_phrase_rate``, ``localization_tokens`` (generated),
        ``selections``, ``no_thoughts``, ``reset_point_mean`` (N) and ``reset_point_rel_mean``
        (N/n)."""
        c = self._tally.pop()
        if not c:
            return {}
        out = _summary(c)
        out["localizations"] = Sum(c.get("localizations", 0.0))
        out["localization_tokens"] = Sum(c.get("localization_tokens", 0.0))
        out["parse_failure_rate"] = _rate(c, "fallback", "localizations")
        for status in ("no_error", "boxed", "step_phrase"):
            out[f"{status}_rate"] = _rate(c, status, "localizations")
        return out


class OracleResetSelector(ResetSelector):
    """Oracle resets: the task's step oracle names the seed's first wrong thought (ours; the
    credit-assignment oracle of arXiv 2605.25507 made concrete, an upper reference for SRPO).

    ``trajectory.problem.oracle(thought_texts)`` returns the 0-based first wrong thought k
    (clamped to ``[0, n-1]``: e.g. the arith oracle blames position n when the answer is
    missing) or ``None`` (every thought right: segment 0, noted in info). The oracle gets the
    same texts the buffer's oracle metrics use (each span decoded, delimiter kept).

    Raises:
        InputError: The seed's problem has no oracle.
    """

    def __init__(self, config: Any | None = None) -> None:
        super().__init__(config)
        self._tally = _Tally()

    def select(self, trajectory: Trajectory, spans: Spans, ctx: PolicyHandle) -> ResetPoint:
        """Args: trajectory: the seed (its problem must have an oracle); spans: its n thought
        spans; ctx: supplies the tokenizer.

        Returns: ``ResetPoint(k)`` with info ``n_thoughts``, ``reset_point`` (k + 1),
        ``oracle_raw`` (the oracle's answer before clamping, 0-based, or None), ``status``
        (``"oracle"``, ``"no_error"`` or ``"no_thoughts"``) and ``clamped``.
        """
        problem = trajectory.problem
        if problem.oracle is None:
            raise InputError(
                f"reset_selector=oracle needs a step oracle, but problem '{problem.id}' has none "
                "(its task sets no Problem.oracle). Use reset_selector=random or "
                "reset_selector=self_localize, or a task with a step oracle (e.g. task=arith)."
            )
        n = len(spans)
        if n < 1:
            self._tally.point(0, 1)
            info = {"n_thoughts": 0, "reset_point": 1, "oracle_raw": None,
                    "status": "no_thoughts", "clamped": False}
            return ResetPoint(0, info=info)
        truth = problem.oracle(thought_texts(trajectory, spans, ctx.tokenizer))
        if truth is None:
            k, status, clamped = 0, "no_error", False
            self._tally.add("no_error")
        else:
            k = min(max(int(truth), 0), n - 1)
            status, clamped = "oracle", k != int(truth)
            self._tally.add("clamped", clamped)
        self._tally.point(n, k + 1)
        info = {"n_thoughts": n, "reset_point": k + 1, "oracle_raw": truth,
                "status": status, "clamped": clamped}
        return ResetPoint(k, info=info)

    def metrics(self) -> dict[str, float]:
        """Since the last call (then reset): ``selections``, ``no_error_rate`` (oracle found no
        wrong thought), ``clamped_rate`` (oracle index beyond the last thought), ``no_thoughts``,
        ``reset_point_mean`` (N) and ``reset_point_rel_mean`` (N/n)."""
        c = self._tally.pop()
        if not c:
            return {}
        out = _summary(c)
        out["no_error_rate"] = _rate(c, "no_error", "selections")
        out["clamped_rate"] = _rate(c, "clamped", "selections")
        return out

"""What ``creditlab credit-bench`` measured: plain dataclasses the scorer fills and the report reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Per-thought reductions of an estimator's per-token advantages.
REDUCTIONS = ("mean", "sum")
#: Estimator scores, each computed for both reductions (key ``"<score>/<reduction>"``).
#: ``error`` is lower-is-better; the others higher-is-better.
SCORES = ("spearman", "spearman_within", "sign", "blame_hit", "error")
#: Selector scores (shares of failed chains): reset at / before / after the true most-negative
#: step, and at the task oracle's first wrong step (tasks with an oracle only).
SELECTOR_SCORES = ("exact", "early", "late", "oracle_exact")
#: Also per selector: the share of its resets at thought 0 (where a selector lands when it falls back).
FIRST_THOUGHT = "first_thought"


@dataclass(frozen=True)
class Interval:
    """A statistic and its 95% bootstrap interval over prompts."""

    value: float
    low: float
    high: float

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


@dataclass
class EstimatorScores:
    """One advantage estimator on the bench's groups.

    Attributes:
        name: Its registry name.
        scores: ``"<score>/<reduction>"`` -> interval (keys from :data:`SCORES` x :data:`REDUCTIONS`).
        cost: ``seconds``, ``generated_tokens`` (sampled by the estimator itself),
            ``forward_tokens`` (tokens through extra forward passes), ``peak_rss_gib`` (the
            process's peak resident memory while it ran, where the system tells: Linux).
        points: ``(true A_k, credit)`` per (chain, thought), mean reduction, for the scatter plot.
        error: Why it could not be scored (then ``scores`` is empty), else None.
    """

    name: str
    scores: dict[str, Interval] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    points: tuple[tuple[float, float], ...] = ()
    error: str | None = None


@dataclass
class SelectorScores:
    """One reset selector on the bench's failed chains (keys of ``scores``: :data:`SELECTOR_SCORES`;
    ``oracle_exact`` only on tasks with a step oracle; and :data:`FIRST_THOUGHT`). ``cost`` as for
    estimators; ``statuses``: the share of the failed chains per ``status`` its reset points report
    (e.g. a self-localizing selector's ``fallback``: no step could be read from its answer)."""

    name: str
    scores: dict[str, Interval] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    chains: int = 0
    error: str | None = None
    statuses: dict[str, float] = field(default_factory=dict)


@dataclass
class Separation:
    """How much better ``better`` is than ``worse``, its neighbour in the ranking, in the ranking
    score (positive = better: the higher score, or for ``error`` the lower one; paired bootstrap
    over prompts); ``separated`` when the interval excludes zero."""

    better: str
    worse: str
    difference: Interval

    @property
    def separated(self) -> bool:
        return self.difference.excludes_zero()


@dataclass
class BenchResult:
    """Everything one bench run measured.

    Attributes:
        settings: What was run (``model``, ``task``, ``split``, ``prompts``, ``group_size``, ``k``,
            ``seed``, ``sign_threshold``, ``bootstrap``, ``command``, ...).
        counts: ``chains``, ``failed_chains``, ``thoughts`` ((chain, thought) pairs), ``states``
            (distinct prefixes valued), ``continuations`` (Monte-Carlo samples).
        noise: Monte-Carlo noise of the truth: ``value_se`` and ``advantage_se`` (mean standard
            errors), ``value_split_half`` and ``advantage_split_half`` (split-half reliabilities,
            Spearman-Brown corrected), ``advantage_reliability`` (1 - noise variance / variance),
            ``error_floor`` (the ``error`` score a perfect estimator would get from the noise alone).
        instrument: Agreement of the MC truth with the task's step oracle on failed chains
            (``most_negative_is_first_wrong``), None on tasks without an oracle.
        rank_by: The score estimators are ranked by (``"<score>/<reduction>"``).
        estimators: Ranked best first; ones that failed last.
        separations: Adjacent pairs of the ranking.
        selectors: Ranked by ``exact`` (the share reset at the true most-negative step), best first;
            ones that failed last.
        truth_cost: ``seconds``, ``generated_tokens`` and ``peak_rss_gib`` of the Monte-Carlo
            truth and the groups.
        first_thought: The selectors' reference, scored on the same failed chains: always reset at
            thought 0 (what a selector does when it cannot choose). None when no selector ran.
    """

    settings: dict[str, Any]
    counts: dict[str, int]
    noise: dict[str, float]
    instrument: dict[str, Interval] | None
    rank_by: str
    estimators: list[EstimatorScores]
    separations: list[Separation]
    selectors: list[SelectorScores]
    truth_cost: dict[str, float]
    first_thought: dict[str, Interval] | None = None

"""A run's headline gain (creditlab.analysis.headline) by hand."""

from __future__ import annotations

import math

import pytest
from creditlab.analysis.headline import headline


def rec(step: int, correct: list[int], greedy: list[int]) -> dict:
    return {"step": step, "samples": 4, "ids": ["a", "b", "c"], "greedy": greedy, "correct": correct}


RECORDS = {0: rec(0, [0, 2, 4], [0, 1, 1]), 10: rec(10, [1, 2, 4], [1, 1, 1]),
           20: rec(20, [2, 2, 3], [1, 0, 1]), 30: rec(30, [4, 4, 4], [1, 1, 0])}


def test_mean_of_the_last_evaluations_minus_step_0_with_a_t_interval_over_problems() -> None:
    h = headline(RECORDS, last=2)
    # per problem: mean of steps 20 and 30 minus step 0
    d = [(0.5 + 1) / 2 - 0, (0.5 + 1) / 2 - 0.5, (0.75 + 1) / 2 - 1]
    mean = sum(d) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    half = 4.302652729749464 * sd / math.sqrt(3)  # t_{0.975, 2}
    assert h.metric == "eval/sample_accuracy" and h.steps == (20, 30) and h.problems == 3
    assert h.start == pytest.approx(0.5) and h.end == pytest.approx(0.5 + mean)
    assert h.gain == pytest.approx(mean) and (h.low, h.high) == pytest.approx((mean - half, mean + half))
    assert "steps 20-30 (2 evaluations)" in h.describe() and f"{mean:+.3f}" in h.describe()


def test_greedy_when_asked_or_when_no_samples_were_recorded_and_none_without_step_0() -> None:
    h = headline(RECORDS, metric="eval/pass@1", last=5)
    assert h.steps == (10, 20, 30)
    assert h.gain == pytest.approx(((1 + 1 + 1) / 3 - 0 + (1 + 0 + 1) / 3 - 1 + (1 + 1 + 0) / 3 - 1) / 3)
    no_samples = {s: {**r, "correct": []} for s, r in RECORDS.items()}
    assert headline(no_samples).metric == "eval/pass@1"
    assert headline({s: r for s, r in RECORDS.items() if s}) is None
    assert headline({0: RECORDS[0]}) is None

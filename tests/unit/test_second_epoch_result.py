"""The declared second epoch of the word-problem warm start (docs/real-problems.md, "A second
epoch, declared before it ran"), recomputed from its committed per-problem records: greedy
accuracy of the shipped adapter and of its warm restart on the first 300 GSM8K test problems, the
paired difference's Wald interval and the exact McNemar test that decided it does not ship."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import paired_outcomes

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_the_reported_numbers_follow_from_the_records():
    shipped, second = [json.loads(line) for line in (RESULTS / "word_problems_second_epoch.jsonl").read_text().splitlines()]
    assert (shipped["adapter"], second["adapter"]) == ("shipped", "second_epoch") and shipped["ids"] == second["ids"]
    n = len(shipped["ids"])
    gained, lost, mean, low, high, p = paired_outcomes(shipped["greedy"], second["greedy"])
    assert n == 300 and sum(shipped["greedy"]) == 24 and sum(second["greedy"]) == 33  # 0.080 -> 0.110
    assert (gained, lost) == (19, 10)
    assert (round(mean, 3), round(low, 3), round(high, 3)) == (0.030, -0.005, 0.065)
    assert p == pytest.approx(0.136, abs=5e-4) and p >= 0.05  # the declared rule: it does not ship


def test_the_shipped_adapter_scored_what_the_grpo_runs_step_0_scored():
    """The same command, the same problems: the shipped adapter's answers here are right exactly
    where the declared GRPO run's step 0 was (a check that the pairing compares like with like)."""
    shipped = json.loads((RESULTS / "word_problems_second_epoch.jsonl").read_text().splitlines()[0])
    step0 = json.loads((RESULTS / "word_problems_grpo_seed0_eval_problems.jsonl").read_text().splitlines()[0])
    assert step0["step"] == 0 and step0["ids"] == shipped["ids"] and step0["greedy"] == shipped["greedy"]

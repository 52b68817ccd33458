"""The declared real-problem GRPO run's result (docs/real-problems.md, "GRPO from the shipped
start"), recomputed from its committed per-problem records: greedy accuracy on the first 300 GSM8K
test problems at steps 0 and 60, the paired difference's Wald interval and the exact McNemar test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import paired_outcomes

RECORDS = Path(__file__).resolve().parents[2] / "docs" / "results" / "word_problems_grpo_seed0_eval_problems.jsonl"


def test_the_reported_numbers_follow_from_the_records():
    start, end = [json.loads(line) for line in RECORDS.read_text().splitlines()]
    assert (start["step"], end["step"], start["samples"]) == (0, 60, 0) and start["ids"] == end["ids"]
    n = len(start["ids"])
    gained, lost, _, low, high, p = paired_outcomes(start["greedy"], end["greedy"])
    assert n == 300 and sum(start["greedy"]) == 24 and sum(end["greedy"]) == 23  # 0.080 -> 0.077
    assert (gained, lost) == (15, 16)
    assert (round(low, 3), round(high, 3)) == (-0.040, 0.033)
    assert p == pytest.approx(1.0)


def test_the_seed_claims_cards_noise_follows_from_the_records():
    """docs/methods/seed-claims.md: two independent runs that each flip this run's share of the
    problems differ, on the same problems, by about 0.026 (one seed's paired difference)."""
    start, end = [json.loads(line) for line in RECORDS.read_text().splitlines()]
    n = len(start["ids"])
    flipped = sum(a != b for a, b in zip(start["greedy"], end["greedy"], strict=True))
    assert flipped == 31
    assert round((2 * flipped / n / n) ** 0.5, 3) == 0.026

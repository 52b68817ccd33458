"""creditlab.analysis.budgets: two runs read at exactly equal budgets, by hand (the interpolation
``creditlab compare``'s pre-registered section, its ``--at-equal`` and ``sweeps/equal_tokens.py``
share)."""

import pytest
from creditlab.analysis.budgets import (
    at_budget,
    bracket,
    metric_at_budget,
    metric_values,
    outcomes_at_budget,
    pair_budget,
    read_pair,
    totals,
)
from creditlab.analysis.rundirs import CompareError, load_run

from tests.unit.test_compare import make_run


def test_totals_keep_the_last_value_of_each_step_and_zero_at_step_zero():
    rows = [{"step": 1, "tokens/trained": 90}, {"step": 1, "tokens/trained": 100}, {"step": 1, "eval/pass@1": 0.5},
            {"step": 2, "tokens/trained": 250.0}, {"step": 3, "tokens/trained": True}, {"step": 3, "tokens/trained": "x"}]
    assert totals(rows, "tokens/trained") == {0: 0.0, 1: 100.0, 2: 250.0}
    assert totals(rows, "time/train_s") == {0: 0.0}


def test_bracket_and_linear_reading_by_hand():
    """Evaluations at 0, 150 and 300 tokens. At 200: a third of the way from 150 to 300."""
    spent = {0: 0.0, 10: 150.0, 20: 300.0}
    low, high, w = bracket(spent, 200.0)
    assert (low, high) == (10, 20) and w == pytest.approx(1 / 3)
    assert bracket(spent, 150.0) == (10, 20, 0.0)  # exactly at an evaluation: weight 0 on the next
    assert bracket(spent, 300.0) == (20, None, 0.0)  # at or past the last: that evaluation, no extrapolation
    assert bracket(spent, 900.0) == (20, None, 0.0)
    with pytest.raises(CompareError, match="no evaluation within the budget -1"):
        bracket(spent, -1.0)
    # accuracy 0.5, 0.6, 0.9 there: 0.6 + (0.9 - 0.6) / 3 = 0.7
    assert at_budget({0: 0.5, 10: 0.6, 20: 0.9}, spent, 200.0) == pytest.approx(0.7)
    # steps without a total are not read
    assert at_budget({0: 0.5, 15: 0.0, 20: 0.9}, spent, 200.0) == pytest.approx(0.5 + 0.4 * 200 / 300)


def _record(step, correct, samples=4):
    ids = [f"p{i + 1}" for i in range(len(correct))]
    return {"step": step, "samples": samples, "ids": ids, "greedy": [int(c >= 2) for c in correct], "correct": correct}


def test_per_problem_outcomes_at_a_budget_by_hand():
    """Baseline: 150 tokens at step 10 (p1 2/4, p2 0/4), 300 at step 20 (4/4, 3/4). At 200 tokens, a
    third of the way: p1 0.5 + 0.5/3 = 0.6667, p2 0.75/3 = 0.25; their mean is the metric read
    the same way (sampled accuracy 0.25 -> 0.875: 0.25 + 0.625/3 = 0.4583)."""
    records = {0: _record(0, [0, 0]), 10: _record(10, [2, 0]), 20: _record(20, [4, 3])}
    spent = {0: 0.0, 10: 150.0, 20: 300.0}
    got = outcomes_at_budget(records, spent, 200.0, "eval/sample_accuracy")
    assert got == pytest.approx({"p1": 0.5 + 0.5 / 3, "p2": 0.25})
    metric = at_budget({0: 0.0, 10: 0.25, 20: 0.875}, spent, 200.0)
    assert sum(got.values()) / 2 == pytest.approx(metric) == pytest.approx(0.25 + 0.625 / 3)
    greedy = outcomes_at_budget(records, spent, 200.0, "eval/pass@1")  # 0/1 read as a probability
    assert greedy == pytest.approx({"p1": 1.0, "p2": 1 / 3})
    assert outcomes_at_budget({0: _record(0, [1])}, {0: 0.0}, 50.0, "eval/sample_accuracy") == {"p1": 0.25}
    with pytest.raises(CompareError, match="no evaluation within the budget 5"):
        outcomes_at_budget({5: _record(5, [1])}, {5: 10.0}, 5.0, "eval/sample_accuracy")
    no_samples = {0: {"step": 0, "samples": 0, "ids": ["p1"], "greedy": [1], "correct": []}}
    with pytest.raises(CompareError, match="step 0 has no per-problem outcome for eval/sample_accuracy"):
        outcomes_at_budget(no_samples, {0: 0.0}, 0.0, "eval/sample_accuracy")


def test_a_pair_of_runs_is_read_at_the_smaller_total(tmp_path):
    """Run a trains 100 tokens per step, run b 150; both evaluate at steps 0, 2, 4 (0.5, 0.6, 0.8).
    Budget: min(400, 600) = 400. Run a is read at step 4 (0.8); run b between step 2 (300 tokens)
    and step 4 (600): 0.6 + 0.2 / 3."""
    a = load_run(make_run(tmp_path, "a", tokens=100.0))
    b = load_run(make_run(tmp_path, "b", tokens=150.0))
    assert metric_values(a, "eval/pass@1") == {0: 0.5, 2: 0.6, 4: 0.8}
    assert pair_budget(a, b, "eval/pass@1", "tokens/trained") == pair_budget(b, a, "eval/pass@1", "tokens/trained") == 400.0
    assert metric_at_budget(a, "eval/pass@1", "tokens/trained", 400.0) == pytest.approx(0.8)
    assert metric_at_budget(b, "eval/pass@1", "tokens/trained", 400.0) == pytest.approx(0.6 + 0.2 / 3)
    pair = read_pair(a, b, "eval/pass@1", "tokens/trained")  # b a third of the way from step 2 to 4
    assert (pair.budget, pair.value, pair.steps, pair.step, pair.base_steps) == (400.0, 0.8, (4,), 4, (2, 4))
    assert (pair.base_value, pair.base_step) == pytest.approx((0.6 + 0.2 / 3, 2 + 2 / 3))
    last = read_pair(a, b, "eval/pass@1", None)  # without a key: the last evaluations
    assert (last.value, last.base_value, last.steps, last.base_steps) == (0.8, 0.8, (4,), (4,))
    # generated tokens: 150 per step for both, so both are read at their last evaluation
    assert pair_budget(a, b, "eval/pass@1", "tokens/generated") == 600.0
    a.rows = [r for r in a.rows if "tokens/trained" not in r or r["step"] < 4]  # no total at the last evaluation
    with pytest.raises(CompareError, match="run a has no tokens/trained total at its last evaluation of eval/pass@1"):
        pair_budget(a, b, "eval/pass@1", "tokens/trained")

"""sweeps/equal_tokens.py: per-problem outcomes interpolated to an exactly equal budget, by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import load_script


@pytest.fixture(scope="module")
def equal_tokens():
    return load_script("sweeps/equal_tokens.py")


def _run(path: Path, tokens: dict[int, float], evals: dict[int, list[int]]) -> Path:
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "tokens/trained": t}) + "\n" for s, t in tokens.items()))
    (path / "eval_problems.jsonl").write_text("".join(
        json.dumps({"step": s, "samples": 4, "ids": ["p1", "p2"], "greedy": [c >= 2 for c in correct], "correct": correct}) + "\n"
        for s, correct in evals.items()))
    return path


def test_the_richer_run_is_read_between_its_evaluations(equal_tokens, tmp_path):
    """Method: 200 tokens at its last evaluation (step 20, p1 3/4, p2 1/4). Baseline: 150 tokens at
    step 10 (2/4, 0/4) and 300 at step 20 (4/4, 3/4), so at 200 it is a third of the way:
    p1 0.5 + 0.5/3 = 0.6667, p2 0.75/3 = 0.25; differences +0.0833 and 0."""
    method = _run(tmp_path / "m", {10: 100, 20: 200}, {0: [0, 0], 20: [3, 1]})
    base = _run(tmp_path / "b", {10: 150, 20: 300}, {0: [0, 0], 10: [2, 0], 20: [4, 3]})
    diff, budget = equal_tokens.pair(method, base, "tokens/trained", "eval/sample_accuracy")
    assert budget == 200
    assert diff == pytest.approx([0.75 - (0.5 + 0.5 / 3), 0.25 - 0.25])
    # Swapped roles: the same budget, the opposite sign.
    back, _ = equal_tokens.pair(base, method, "tokens/trained", "eval/sample_accuracy")
    assert back == pytest.approx(-diff)


def test_every_method_in_the_sweep_is_reported_against_the_baseline(equal_tokens, tmp_path):
    """Without --method every ``<method>-seed<s>`` run but the baseline's is tested; a method
    with fewer than two seeds paired with the baseline is an error naming what was found."""
    for s in (0, 1):
        _run(tmp_path / f"grpo-seed{s}", {10: 100, 20: 200}, {0: [0, 0], 20: [2, 2]})
        _run(tmp_path / f"oracle-seed{s}", {10: 100, 20: 200}, {0: [0, 0], 20: [3, 2 + s]})
    _run(tmp_path / "rrpo-seed0", {10: 100, 20: 200}, {0: [0, 0], 20: [2, 2]})
    (tmp_path / "multirun.yaml").write_text("")
    assert equal_tokens.methods_in(tmp_path, "grpo") == ["oracle", "rrpo"]
    text = equal_tokens.report(tmp_path, "oracle", "grpo", "tokens/trained", "eval/sample_accuracy")
    # Per problem: seed 0 (+0.25, 0), seed 1 (+0.25, +0.25): mean +0.1875 over 2 seeds x 2 problems.
    assert "2 seeds x 2 problems" in text and "per problem: +0.1875" in text
    with pytest.raises(SystemExit, match=r"need >= 2 seeds with both rrpo and grpo.*found \[0\]"):
        equal_tokens.report(tmp_path, "rrpo", "grpo", "tokens/trained", "eval/sample_accuracy")

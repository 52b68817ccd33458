"""benchmarks/experiment_cost.py: a run's wall-clock split from its metrics.jsonl (generation,
update and evaluation summed, the rest what is left), and its variants read from the command line."""

from __future__ import annotations

import json

import pytest

from tests.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/experiment_cost.py")


def test_split_sums_the_parts_and_leaves_the_rest_to_other(bench, tmp_path):
    rows = [
        {"step": 0, "eval/pass@1": 0.5, "time/eval_s": 4.0, "wall": 1.0},
        {"step": 1, "time/step_s": 3.0, "time/generate_s": 1.0, "time/update_s": 2.0},
        {"step": 2, "time/step_s": 3.5, "time/generate_s": 1.5, "time/update_s": 2.0},
        {"step": 2, "eval/pass@1": 0.6, "time/eval_s": 5.0},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = bench.split(path, wall=20.0)
    assert out == {"generation": 2.5, "update": 4.0, "evaluation": 9.0, "other": 4.5, "total": 20.0,
                   "steps": 2, "evaluations": 2}


def test_variants(bench):
    assert bench.parse_variant("before=loss.skip_zero_advantage=false,seed=1") == (
        "before", ["loss.skip_zero_advantage=false", "seed=1"])
    assert bench.parse_variant("after=") == ("after", [])
    with pytest.raises(SystemExit, match="expected NAME=OVERRIDE"):
        bench.parse_variant("=seed=1")


def test_projection_scales_steps_and_answers_and_keeps_the_rest(bench, tmp_path):
    """4 steps of 3 s (1 s generation, 2 s update), 2 evaluations of 10 answers in 8 s: 60 steps
    and 7 evaluations of 1,500 answers are 60 + 120 s of steps and 7 x 1,500 x 0.4 s of answers."""
    row = {"generation": 4.0, "update": 8.0, "evaluation": 8.0, "other": 5.0, "total": 25.0, "steps": 4,
           "evaluations": 2, "answers": 10}
    out = bench.project(row, 60, 7, 1500)
    assert out == pytest.approx({"generation": 60.0, "update": 120.0, "evaluation": 4200.0, "other": 5.0,
                                 "total": 4385.0})
    assert bench.parse_schedule("60,7,1500") == (60, 7, 1500)
    with pytest.raises(SystemExit, match="three integers"):
        bench.parse_schedule("60,7")


def test_answers_per_evaluation_are_problems_times_one_plus_samples(bench, tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/problems": 32, "time/eval_s": 1.0}) + "\n")
    (tmp_path / "config.yaml").write_text("eval:\n  samples: 4\n  problems: 32\n")
    assert bench.answers(tmp_path) == 160
    (tmp_path / "config.yaml").write_text("eval:\n  samples: 0\n")
    assert bench.answers(tmp_path) == 32

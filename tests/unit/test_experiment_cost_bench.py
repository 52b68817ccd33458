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

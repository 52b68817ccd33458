"""``eval_problems.jsonl`` from real CPU runs: one line per evaluation that agrees with
``metrics.jsonl``, and a resumed run holds no duplicated or stale step (the lines logged after the
checkpoint are dropped, as for ``metrics.jsonl``)."""

import json

import pytest
from creditlab.run.compose import compose
from creditlab.run.launch import run
from creditlab.run.loggers import read_metrics

from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow


def _train(out_dir, *overrides):
    return run(compose([*SMALL, f"run_dir={out_dir}", *overrides]), out_dir)


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "eval_problems.jsonl").read_text().splitlines()]


def test_records_match_metrics_and_a_resume_leaves_no_stale_or_duplicated_step(tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    _train(full, "trainer.max_steps=4")
    records = _records(full)
    assert [r["step"] for r in records] == [0, 2, 4]  # eval.every=2: steps 0, 2 and the last
    evals = {r["step"]: r for r in read_metrics(full / "metrics.jsonl") if "eval/pass@1" in r}
    for rec in records:
        n = len(rec["ids"])
        assert n == 8 and rec["ids"] == records[0]["ids"] and len(set(rec["ids"])) == 8  # the same 8 problems
        assert sum(rec["greedy"]) / n == pytest.approx(evals[rec["step"]]["eval/pass@1"])
        assert evals[rec["step"]]["time/eval_s"] > 0  # each evaluation's wall-clock (benchmarks/experiment_cost.py)
        if rec["samples"]:
            assert sum(rec["correct"]) / (n * rec["samples"]) == pytest.approx(evals[rec["step"]]["eval/sample_accuracy"])

    _train(resumed, "trainer.max_steps=2")  # stops after checkpointing step 2 ...
    stale = {"step": 3, "samples": 0, "ids": ["x"], "greedy": [1], "correct": []}
    with (resumed / "eval_problems.jsonl").open("a") as f:  # lines a killed run wrote after its checkpoint
        f.write(json.dumps(stale) + "\n" + json.dumps({**stale, "step": 4}) + "\n" + '{"step": 4, "ids": ["cut')
    _train(resumed, "trainer.max_steps=4")  # ... and the same command resumes it
    assert _records(resumed) == records, "a resumed run's records must match the uninterrupted run's"

"""A short real run on the code task: the tiny arithmetic model writes no Python (rewards ~0),
but prompts encode and fit, every answer goes through the sandbox, and the verifier's outcome
counts are logged for training and evaluation."""

import json

import pytest
from creditlab.run.compose import compose
from creditlab.run.launch import run
from creditlab.run.loggers import read_metrics
from creditlab_code.sandbox import live_sandbox_processes
from creditlab_code.verifier import OUTCOMES

from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow


def test_two_steps_on_the_code_task(tmp_path):
    base = [o for o in SMALL if not o.startswith("task.")]  # SMALL's task keys are arith's
    cfg = compose([*base, f"run_dir={tmp_path}", "threads=1", "task=code", "verifier=code_tests",
                   "trainer.max_steps=2", "eval.every=2", "eval.problems=6", "verifier.timeout_s=5"])
    run(cfg, tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    train = [r for r in rows if "train/verifier/scored" in r]
    assert [r["step"] for r in train] == [1, 2]
    per_step = 4 * 4  # prompts_per_step x group_size in SMALL
    for row in train:
        assert row["train/verifier/scored"] == per_step
        counts = [row[f"train/verifier/{o}_count"] for o in OUTCOMES]
        assert sum(counts) == per_step, "every completion has exactly one counted outcome"
        assert 0 <= row["train/reward/mean"] <= 1
        assert row["train/verifier/sandbox_s_mean"] > 0
        assert row["train/verifier/namespaces"] in (0.0, 1.0)
    evals = [r for r in rows if "eval/verifier/scored" in r]
    per_eval = 6 * (1 + cfg.eval.samples)  # one greedy and eval.samples sampled completions per problem
    assert evals and all(r["eval/verifier/scored"] == per_eval for r in evals)
    prov = json.loads((tmp_path / "plugins.json").read_text())
    assert prov["task"]["name"] == "code" and prov["verifier"]["name"] == "code_tests"
    assert not live_sandbox_processes(), "the run left sandboxed processes behind"

"""Short real CPU runs: train end to end, determinism under a seed, kill-and-resume equality."""

import json
from pathlib import Path

import pytest
from creditlab.run.compose import compose
from creditlab.run.launch import run
from creditlab.run.loggers import read_metrics

from tests.helpers import stable
from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow



def _train(out_dir, *overrides):
    cfg = compose([*SMALL, f"run_dir={out_dir}", *overrides])
    return run(cfg, out_dir)



def test_run_writes_everything(tmp_path):
    summary = _train(tmp_path, "trainer.max_steps=2")
    for name in ("metrics.jsonl", "config.yaml", "plugins.json", "summary.json", "curves.png"):
        assert (tmp_path / name).exists(), name
    rows = read_metrics(tmp_path / "metrics.jsonl")
    train = [r for r in rows if "train/reward/mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert {"train/loss", "train/entropy", "train/grad_norm", "tokens/trained", "eval/pass@1"} <= {
        k for r in rows for k in r
    }
    assert all(isinstance(v, (int, float)) for r in rows for v in r.values()), "no NaN/inf strings"
    prov = json.loads((tmp_path / "plugins.json").read_text())
    assert prov["advantage"] == {**prov["advantage"], "name": "grpo", "dist": "creditlab"}
    env = json.loads((tmp_path / "environment.json").read_text())
    assert {"python", "torch", "transformers", "creditlab", "model_path"} <= set(env)
    assert Path(env["model_path"]).is_dir()
    assert env["accelerator"] == "auto" and env["backend"]["accelerator"]["path"] == "fused"
    assert summary["steps"] == 2


def test_same_seed_same_metrics_and_resume_matches(tmp_path):
    full_a = tmp_path / "a"
    full_b = tmp_path / "b"
    resumed = tmp_path / "r"
    _train(full_a, "trainer.max_steps=4")
    _train(full_b, "trainer.max_steps=4")
    a, b = (stable(read_metrics(d / "metrics.jsonl")) for d in (full_a, full_b))
    assert a == b, "the same seed must give identical metrics"

    _train(resumed, "trainer.max_steps=2")  # stops after checkpointing step 2 ...
    (resumed / "metrics.jsonl").open("a").write('{"step": 3, "train/reward/mean": 9.0}\n')  # lost step
    _train(resumed, "trainer.max_steps=4")  # ... and the same command resumes it
    r = stable(read_metrics(resumed / "metrics.jsonl"))
    assert r == a, "a resumed run must match the uninterrupted run"


def test_the_evaluation_cadence_changes_neither_training_nor_a_shared_evaluation(tmp_path):
    """A run's randomness is a function of (seed, step, stream): evaluating every step or only at
    the end leaves every training row and the last evaluation as they are (the decomposition
    sweeps evaluate every 50 steps against a baseline that evaluated every 20)."""
    _train(tmp_path / "often", "trainer.max_steps=4", "eval.every=1")
    _train(tmp_path / "rarely", "trainer.max_steps=4", "eval.every=4")
    often, rarely = (stable(read_metrics(tmp_path / d / "metrics.jsonl")) for d in ("often", "rarely"))
    train = [[r for r in rows if "train/reward/mean" in r] for rows in (often, rarely)]
    assert train[0] == train[1] and len(train[0]) == 4
    evals = [{r["step"]: r for r in rows if "eval/pass@1" in r} for rows in (often, rarely)]
    assert sorted(evals[0]) == [0, 1, 2, 3, 4] and sorted(evals[1]) == [0, 4]
    assert evals[0][4] == evals[1][4] and evals[0][0] == evals[1][0]


def test_dr_grpo_preset_runs(tmp_path):
    _train(tmp_path, "method=dr_grpo", "trainer.max_steps=1", "eval.every=0")
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[-1]["step"] == 1 and "train/loss" in rows[-1]


EXTRA = {"vineppo": ["advantage.rollouts=2"], "srpo": ["reset_selector.max_new_tokens=8"]}


@pytest.mark.parametrize(
    "method", ["rrpo", "srpo", "srpo_oracle", "vineppo", "rredcot", "oar_p", "oar_g", "ibpo"]
)
def test_method_presets_run(tmp_path, method):
    extra = EXTRA.get(method, [])
    _train(tmp_path, f"method={method}", "trainer.max_steps=1", "eval.every=0", *extra)
    row = read_metrics(tmp_path / "metrics.jsonl")[-1]
    assert row["step"] == 1 and "train/loss" in row
    assert row["train/tokens_generated"] >= row["train/rows"]  # seeds / value rollouts included
    assert "train/credit/scored" in row or row["train/reward/mean"] == 1.0  # arith has an oracle
    if method in ("rrpo", "srpo", "srpo_oracle"):
        assert row["train/rows"] == 4 * 4  # equal trained completions per prompt
        assert 0.0 <= row["train/rollout/reset/fallback_rate"] <= 1.0
    if method == "srpo_oracle":
        assert row.get("train/rollout/reset/oracle_exact", 1.0) == 1.0


def test_compiled_model_trains_and_is_recorded(tmp_path):
    """``model.accelerator=compile`` (torch.compile of the forward; ~1.5 min of compiling here):
    decoding, the shared-prompt training forward and its backward run compiled; the run records it.
    Its own process, as a user runs it: in a test session another test may have imported the
    standard library's distutils, which setuptools (imported by inductor's C++ builder) refuses."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "creditlab.cli", "train", *SMALL, f"run_dir={tmp_path}",
           "trainer.max_steps=2", "eval.every=0", "model.accelerator=compile"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    train = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(isinstance(v, (int, float)) for r in train for v in r.values()), "no NaN/inf strings"
    env = json.loads((tmp_path / "environment.json").read_text())
    assert env["accelerator"] == "compile" and env["backend"]["accelerator"]["path"] == "compile"

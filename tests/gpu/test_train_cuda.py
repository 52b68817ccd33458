"""3-step training runs on CUDA: every method preset in conf/method/, with the integration tests'
small settings (tests/integration/conftest.py: SMALL), on ``trainer=gpu`` (one CUDA device,
``bf16-mixed``; grpo also in ``32-true``), and once through the ``creditlab train`` command.

Each run must finish (``status.json``), log training rows for steps 1, 2, 3 with finite numbers,
and have held its tensors on CUDA. Nothing a run writes records the device it trained on
(environment.json names the decoding path, not the device), so the in-process runs read it from
torch: the peak CUDA memory allocated during the run must grow by at least the size of the model's
weights file (policy weights, gradients and optimizer state all live there on a CUDA run).
The VinePPO-style Monte-Carlo values estimator (``advantage=mc_value``) runs through its
preset, ``method=vineppo``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import check_finished_run
from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow

METHODS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "method").glob("*.yaml"))
#: Per-preset settings that keep a 3-step run short (as tests/integration/test_train.py).
EXTRA = {"vineppo": ["advantage.rollouts=2"], "srpo": ["reset_selector.max_new_tokens=8"]}
STEPS = 3


def _overrides(run_dir, method, precision=None):
    out = [*SMALL, "trainer=gpu", f"trainer.max_steps={STEPS}", f"method={method}", f"run_dir={run_dir}",
           *EXTRA.get(method, [])]
    return out + ([f"trainer.precision={precision}"] if precision else [])


def _check_run(run_dir: Path) -> dict:
    """The run finished and logged training steps 1..STEPS with finite numbers; returns
    environment.json."""
    check_finished_run(run_dir, STEPS)
    return json.loads((run_dir / "environment.json").read_text())


def _weights_bytes(model_path: str) -> int:
    files = list(Path(model_path).glob("*.safetensors")) or list(Path(model_path).glob("*.bin"))
    assert files, f"no weights file in {model_path}"
    return sum(f.stat().st_size for f in files)


@pytest.mark.parametrize(
    "method,precision", [(m, None) for m in METHODS] + [("grpo", "32-true")],
    ids=[*METHODS, "grpo-32-true"],
)
def test_method_preset_runs_3_steps_on_cuda(tmp_path, method, precision):
    from creditlab.run.compose import compose
    from creditlab.run.launch import run

    cfg = compose(_overrides(tmp_path, method, precision))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()  # what earlier tests still hold
    summary = run(cfg, tmp_path)
    grown = torch.cuda.max_memory_allocated() - baseline
    assert summary["steps"] == STEPS
    env = _check_run(tmp_path)
    weights = _weights_bytes(env["model_path"])
    assert grown >= weights, f"the run's peak CUDA memory grew by {grown} B, less than its {weights} B of weights"
    prov = json.loads((tmp_path / "plugins.json").read_text())
    assert (cfg.method, prov["advantage"]["name"]) == (method, cfg.advantage.name)


def test_creditlab_train_command_on_cuda(tmp_path):
    """The command a user types: ``creditlab train ... trainer=gpu`` exits 0 after 3 steps."""
    cmd = [sys.executable, "-m", "creditlab.cli", "train", *_overrides(tmp_path, "grpo")]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    _check_run(tmp_path)

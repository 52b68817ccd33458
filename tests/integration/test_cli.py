"""The command line for real: a Hydra multirun over two presets, in a subprocess."""

import json
import os
import subprocess
import sys

import pytest

from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow


def test_multirun_over_presets(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable, "-m", "creditlab.cli", "train", "-m", "method=grpo,dr_grpo",
        "trainer.max_steps=1", *[o for o in SMALL if not o.startswith("eval.every")], "eval.every=0",
        f"hydra.sweep.dir={sweep}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for job, method in ((0, "grpo"), (1, "dr_grpo")):
        rows = [json.loads(x) for x in (sweep / str(job) / "metrics.jsonl").read_text().splitlines()]
        assert rows[-1]["step"] == 1
        prov = json.loads((sweep / str(job) / "plugins.json").read_text())
        assert prov["advantage"]["name"] == method


def test_bad_override_exits_with_message(tmp_path):
    cmd = [sys.executable, "-m", "creditlab.cli", "train", "advantage=nope"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "unknown advantage 'nope'" in out.stderr and "Traceback" not in out.stderr


def test_a_run_prints_each_line_once_and_counts_rl_steps(tmp_path):
    """What a newcomer reads (issue 14): a bar over RL steps, no adverts, no library deprecation
    warnings, W&B's own banner left to the run's summary, and no line printed twice."""
    cmd = [sys.executable, "-m", "creditlab.cli", "train", *[o for o in SMALL if o != "logger=none"],
           "logger=wandb", "trainer.max_steps=2", f"run_dir={tmp_path / 'run'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}
    env.pop("WANDB_SILENT", None)  # the tests' conftest silences W&B; a user's shell does not
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert "RL step" in text and "2/2" in text, text[-2000:]
    for unwanted in ("Epoch 0/", "litlogger", "LeafSpec", "anonymous setting", "v_num", "wandb:",
                     "Warning", "deprecated"):  # e.g. transformers 5.24's `past_key_values` FutureWarning
        assert unwanted not in text, (unwanted, text[-3000:])
    assert "W&B offline run:" in text
    lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    events = [ln for ln in lines if not ln.startswith(("RL step", "Loading weights", "arith_tiny"))]
    assert len(events) == len(set(events)), [ln for ln in events if events.count(ln) > 1]

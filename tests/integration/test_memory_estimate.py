"""creditlab.run.memory's estimate against a real run's resident memory (benchmarks/memory_vs_estimate.py):
a tiny random Llama of the tiny recipe's shape, 16 prompts x 8 completions, two RL steps. The
update's peak RSS growth lies within a factor of 2 of the estimate (measured 1.0-1.25x with
glibc's default allocator; docs/gpu.md, "Memory before the model loads")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import tiny_model_and_tokenizer

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "memory_vs_estimate.py"


def test_update_peak_within_a_factor_of_2_of_the_estimate(tmp_path):
    tiny_model_and_tokenizer(tmp_path / "model", num_layers=4, hidden=128, heads=4, kv_heads=4, intermediate=512)
    out = tmp_path / "memory.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(SCRIPT), "--json", str(out), f"model.name_or_path={tmp_path / 'model'}",
                    "prompts_per_step=16", "rollout.group_size=8", "rollout.max_new_tokens=64"],
                   check=True, env=env, timeout=600, capture_output=True)
    result = json.loads(out.read_text())
    estimate, measured = result["phases"]["update"], result["measured"]["phases"]["step2:update"]
    assert estimate > 2**28  # ~0.4 GiB of activations: well above the run's fixed overheads
    assert 0.5 <= measured / estimate <= 2, (measured / 2**30, estimate / 2**30)
    generation = result["measured"]["phases"]["step2:generation"]
    assert generation < measured  # the update, not generation, is this run's peak, as estimated

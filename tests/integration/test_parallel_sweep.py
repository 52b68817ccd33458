"""``creditlab train -m ... --jobs 2`` for real (issue 54): each job in its own process gives the
metrics Hydra's basic launcher gives it at the same thread count, in the folder it would use, and
the command run again resumes (here: reloads) every run."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import stable
from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow


def _sweep(tmp_path, name, *extra):
    cmd = [sys.executable, "-m", "creditlab.cli", "train", "-m", *SMALL, "trainer.max_steps=3", "seed=0,1",
           "threads=1", f"hydra.sweep.dir={tmp_path / name}", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _metrics(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_parallel_jobs_give_the_basic_launchers_runs(tmp_path):
    _sweep(tmp_path, "basic")
    out = _sweep(tmp_path, "parallel", "--jobs", "2")
    assert "2 runs, at most 2 at a time, 1 thread(s) each" in out.stdout
    for seed in ("0", "1"):
        basic, parallel = tmp_path / "basic" / seed, tmp_path / "parallel" / seed
        assert stable(_metrics(parallel)) == stable(_metrics(basic))
        assert _metrics(parallel)[-1]["step"] == 3
        assert "shared by 2 parallel sweep jobs" in (parallel / "environment.json").read_text()
        assert (parallel / "job.log").is_file()
    before = (tmp_path / "parallel" / "0" / "metrics.jsonl").read_text()
    again = _sweep(tmp_path, "parallel", "--jobs", "2")  # every run finished: each reloads, nothing trains
    assert again.stdout.count("done") == 2
    assert (tmp_path / "parallel" / "0" / "metrics.jsonl").read_text() == before

"""``status.json``: running while the run fits, finished after, failed (with the exception) on
error (:func:`creditlab.run.launch.recorded`, around the fit of every run)."""

import json
import os

import pytest
from creditlab.analysis.rundirs import load_run
from creditlab.run.launch import recorded


def _status(path):
    return json.loads((path / "status.json").read_text())


def test_running_then_finished(tmp_path):
    with recorded(tmp_path):
        seen = _status(tmp_path)
    assert seen["status"] == "running" and seen["pid"] == os.getpid() and "started" in seen
    done = _status(tmp_path)
    assert done["status"] == "finished" and done["started"] == seen["started"] and "ended" in done
    assert not (tmp_path / "status.json.tmp").exists()


def test_failed_keeps_the_exception(tmp_path):
    with pytest.raises(ValueError), recorded(tmp_path):
        (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/reward/mean": 0.5}\n')
        raise ValueError("task file has no 'answer' field")
    state = _status(tmp_path)
    assert state["status"] == "failed"
    assert state["error"] == {"type": "ValueError", "message": "task file has no 'answer' field"}
    run = load_run(tmp_path)
    assert run.status == "failed" and "ValueError: task file has no 'answer' field" in run.detail

"""``status.json``: running while the run fits, finished after, failed (with the exception) on error.
The fit itself is replaced by a stub, so no model is built."""

import json
import os

import pytest

from creditlab import runner
from creditlab.rundirs import load_run


def _status(path):
    return json.loads((path / "status.json").read_text())


def test_running_then_finished(tmp_path, monkeypatch):
    seen = {}

    def fake_fit(cfg, checked, out_dir):
        seen.update(_status(out_dir))
        return {"steps": 1}

    monkeypatch.setattr(runner, "_fit", fake_fit)
    assert runner.fit(None, {}, tmp_path) == {"steps": 1}
    assert seen["status"] == "running" and seen["pid"] == os.getpid() and "started" in seen
    done = _status(tmp_path)
    assert done["status"] == "finished" and done["started"] == seen["started"] and "ended" in done
    assert not (tmp_path / "status.json.tmp").exists()


def test_failed_keeps_the_exception(tmp_path, monkeypatch):
    def fake_fit(cfg, checked, out_dir):
        (out_dir / "metrics.jsonl").write_text('{"step": 1, "train/reward/mean": 0.5}\n')
        raise ValueError("task file has no 'answer' field")

    monkeypatch.setattr(runner, "_fit", fake_fit)
    with pytest.raises(ValueError):
        runner.fit(None, {}, tmp_path)
    state = _status(tmp_path)
    assert state["status"] == "failed"
    assert state["error"] == {"type": "ValueError", "message": "task file has no 'answer' field"}
    run = load_run(tmp_path)
    assert run.status == "failed" and "ValueError: task file has no 'answer' field" in run.detail

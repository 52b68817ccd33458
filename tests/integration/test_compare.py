"""``creditlab compare`` through the command line on real short runs (two methods x two seeds) and
a real crashed run; every run leaves a ``status.json``."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from creditlab.run.compose import compose
from creditlab.run.launch import run

from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "math"


def _train(out_dir, *overrides, base=SMALL):
    return run(compose([*base, f"run_dir={out_dir}", "threads=1", *overrides]), out_dir)


def test_compare_cli_on_real_runs(tmp_path):
    sweep = tmp_path / "multirun" / "2026-01-01_00-00-00"
    finished = []
    for method in ("grpo", "dr_grpo"):
        for seed in (0, 1):
            finished.append(sweep / f"{method}-{seed}")
            _train(finished[-1], f"method={method}", f"seed={seed}", "trainer.max_steps=2")
    crashed = sweep / "crashed"
    no_task_keys = [o for o in SMALL if not o.startswith("task.")]
    with pytest.raises(Exception, match="missing field"):  # a task file with the wrong field names
        _train(crashed, "task=gsm8k", f"task.path={FIXTURES / 'gsm8k_wrong_field.jsonl'}",
               "trainer.max_steps=2", base=no_task_keys)
    for d in finished:
        assert json.loads((d / "status.json").read_text())["status"] == "finished"
    failed = json.loads((crashed / "status.json").read_text())
    assert failed["status"] == "failed" and failed["error"]["type"]

    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "creditlab.cli", "compare", str(tmp_path / "multirun"), "--by", "method",
           "--baseline", "grpo", "--out", str(out), "--bootstrap", "1000"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "grpo (baseline)" in res.stdout and "dr_grpo" in res.stdout and "crashed" in res.stdout
    for name in ("report.md", "report.html", "compare.json", "curves_step.png", "curves_tokens_trained.png",
                 "curves_tokens_generated.png", "curves_time.png", "final.png"):
        assert (out / name).stat().st_size > 0, name
    md = (out / "report.md").read_text()
    assert "grpo (baseline)" in md and "| dr_grpo |" in md and failed["error"]["type"] in md
    numbers = json.loads((out / "compare.json").read_text())
    assert [g["label"] for g in numbers["groups"]] == ["grpo", "dr_grpo"]
    assert all(g["final"]["n"] == 2 for g in numbers["groups"])
    assert numbers["tests"][0]["paired"] and numbers["tests"][0]["note"].startswith("paired on seeds 0, 1")
    # two seeds: an exact sign-flip test over 4 patterns, whose p cannot go below 2/4 (1 when a
    # seed's difference is zero: two steps of the tiny model often leave both groups at 0)
    test = numbers["tests"][0]
    assert (test["test"], test["n"], test["sides"]) == ("exact sign-flip", "2 pairs", "two-sided")
    assert test["p_min"] in (0.5, 1.0) and test["p_min"] <= test["p_value"] <= 1
    assert test["t_ci95"][0] <= test["diff"] <= test["t_ci95"][1]
    assert f"exact sign-flip, 2 pairs (4 arrangements; smallest possible p {test['p_min']:.3g})" in md
    assert all(g["iqm"]["final"]["runs"] == 2 and g["iqm"]["final"]["ci95"] is None for g in numbers["groups"])
    statuses = {r["name"]: r["status"] for r in numbers["runs"]}
    assert statuses["crashed"] == "failed" and statuses["grpo-0"] == "finished"

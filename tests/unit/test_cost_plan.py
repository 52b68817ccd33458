"""``creditlab train --plan`` (issue 54): the evaluation schedule and the prediction by hand, the
jobs of a sweep as Hydra's basic sweeper builds them, which jobs share a calibration, finished
runs skipped, and the command line's errors."""

from __future__ import annotations

import json

import pytest

from creditlab.cli import main
from creditlab.run.cost_plan import Calibration, describe, evaluations, job_overrides


@pytest.mark.parametrize("steps, every, expected", [
    (100, 50, 3),    # 0, 50, 100
    (100, 20, 6),    # 0, 20, ..., 100
    (10, 3, 5),      # 0, 3, 6, 9, then 10 after the last step
    (4, 4, 2),       # a calibration: 0 and 4
    (5, 0, 0),       # no evaluation at all
])
def test_evaluations_follow_the_eval_hooks(steps, every, expected):
    assert evaluations(steps, every) == expected


def test_prediction_by_hand():
    cal = Calibration(steps=4, first_s=3.0, step_s=2.0, eval_s=10.0, setup_s=5.0, wall_s=0.0)
    assert cal.predict(100, 50) == 5.0 + 3.0 + 99 * 2.0 + 3 * 10.0
    assert cal.predict(1, 0) == 5.0 + 3.0


def test_a_sweep_files_grid_with_the_command_line_winning_on_a_shared_key():
    jobs = job_overrides(["+sweeps=sham_multi"], multirun=True)
    assert len(jobs) == 32
    cells = {(dict(o.split("=", 1) for o in j)["method"], dict(o.split("=", 1) for o in j)["seed"]) for j in jobs}
    assert cells == {(m, str(s)) for m in ("oracle_credit", "sham_credit") for s in range(20, 36)}
    narrowed = job_overrides(["+sweeps=sham_multi", "seed=20,21", "threads=2"], multirun=True)
    assert len(narrowed) == 4 and all("threads=2" in j for j in narrowed)
    assert job_overrides(["seed=3"], multirun=False) == [["seed=3"]]
    assert len(job_overrides(["method=grpo,dr_grpo", "seed=0,1,2"], multirun=True)) == 6


def test_seeds_share_a_calibration_and_methods_do_not(tmp_path):
    sweep = [f"hydra.sweep.dir={tmp_path}"]
    a = describe(["+sweeps=sham_multi", "experiment=credit_multi", "method=oracle_credit", "seed=20", *sweep], True)
    b = describe(["+sweeps=sham_multi", "experiment=credit_multi", "method=oracle_credit", "seed=21", *sweep], True)
    c = describe(["+sweeps=sham_multi", "experiment=credit_multi", "method=sham_credit", "seed=20", *sweep], True)
    longer = describe(["+sweeps=sham_multi", "experiment=credit_multi", "method=oracle_credit", "seed=20",
                       "trainer.max_steps=300", *sweep], True)
    assert a.cost_key == b.cost_key == longer.cost_key != c.cost_key
    assert (a.max_steps, a.eval_every, longer.max_steps) == (100, 50, 300)
    assert a.folder == tmp_path / "oracle_credit-seed20" and not a.finished


def test_a_finished_run_is_skipped_and_a_stopped_one_is_not(tmp_path):
    for name, status in (("oracle_credit-seed20", "finished"), ("oracle_credit-seed21", "stopped")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "status.json").write_text(json.dumps({"status": status}))
    common = ["+sweeps=sham_multi", "experiment=credit_multi", "method=oracle_credit", f"hydra.sweep.dir={tmp_path}"]
    assert describe([*common, "seed=20"], True).finished
    assert not describe([*common, "seed=21"], True).finished
    assert describe([f"run_dir={tmp_path / 'oracle_credit-seed20'}"], False).finished


@pytest.mark.parametrize("args, message", [
    (["--calibrate-steps", "4"], "goes with --plan"),
    (["--plan", "--calibrate-steps", "1"], "an integer >= 2"),
    (["--plan", "--dry-run"], "Give one."),
])
def test_command_line_errors(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err

"""``creditlab train --plan`` (issue 54): the evaluation schedule and the prediction by hand, the
jobs of a sweep as Hydra's basic sweeper builds them, which jobs share a calibration, finished
runs skipped, and the command line's errors."""

from __future__ import annotations

import json

import pytest

from creditlab.cli import main
from creditlab.cli import train_command
from creditlab.errors import ConfigError
from creditlab.run.cost_plan import Calibration, describe, evaluation_steps, evaluations, job_overrides, plan


@pytest.mark.parametrize("steps, every, expected", [
    (100, 50, 3),    # 0, 50, 100
    (100, 20, 6),    # 0, 20, ..., 100
    (10, 3, 5),      # 0, 3, 6, 9, then 10 after the last step
    (4, 4, 2),       # a calibration: 0 and 4
    (5, 0, 0),       # no evaluation at all
])
def test_evaluations_follow_the_eval_hooks(steps, every, expected):
    assert evaluations(steps, every) == expected
    # the hooks' rule: step 0 when every > 0 (on_train_start), each step s with s % every == 0
    # (the step), and the last step when it is not one of those (on_train_end)
    hooks = ([0] + [s for s in range(1, steps + 1) if s % every == 0]
             + ([steps] if steps % every else [])) if every > 0 else []
    assert evaluation_steps(steps, every) == hooks


def test_evaluations_left_after_a_resume():
    assert evaluations(100, 50, done=0) == 3
    assert evaluations(100, 50, done=50) == 1      # only step 100's
    assert evaluations(100, 50, done=100) == 0
    assert evaluations(10, 3, done=7) == 2         # 9, then 10


def test_prediction_by_hand():
    cal = Calibration(steps=4, first_s=3.0, step_s=2.0, eval_s=10.0, setup_s=5.0, wall_s=0.0)
    assert cal.predict(100, 50) == 5.0 + 3.0 + 99 * 2.0 + 3 * 10.0
    assert cal.predict(1, 0) == 5.0 + 3.0
    assert cal.predict(100, 50, done=60) == 5.0 + 40 * 2.0 + 1 * 10.0   # a resume: no warm-up step again
    assert cal.predict(100, 50, done=100) == 5.0                        # a finished run only reloads


def test_a_sweep_files_grid_with_the_command_line_winning_on_a_shared_key():
    jobs = job_overrides(["+sweeps=sham_multi"], multirun=True)
    assert len(jobs) == 32
    cells = {(dict(o.split("=", 1) for o in j)["method"], dict(o.split("=", 1) for o in j)["seed"]) for j in jobs}
    assert cells == {(m, str(s)) for m in ("oracle_credit", "sham_credit") for s in range(20, 36)}
    narrowed = job_overrides(["+sweeps=sham_multi", "seed=20,21", "threads=2"], multirun=True)
    assert len(narrowed) == 4 and all("threads=2" in j for j in narrowed)
    assert job_overrides(["seed=3"], multirun=False) == [["seed=3"]]
    assert job_overrides(["method=grpo,dr_grpo", "seed=0,1,2"], multirun=True) == [
        [f"method={m}", f"seed={s}"] for m in ("grpo", "dr_grpo") for s in range(3)]  # Hydra's order
    assert job_overrides(["+foo=1,2"], multirun=True) == [["+foo=1"], ["+foo=2"]]   # prefixes kept once
    assert job_overrides(["++seed=4,5"], multirun=True) == [["++seed=4"], ["++seed=5"]]


def test_seeds_share_a_calibration_and_methods_do_not(tmp_path):
    sweep = [f"hydra.sweep.dir={tmp_path}"]
    a = describe(["+sweeps=sham_multi", "experiment=credit_multi", "method=oracle_credit", "seed=20", *sweep], True)
    b = describe(["+sweeps=sham_multi", "experiment=credit_multi", "method=oracle_credit", "seed=21", *sweep], True)
    c = describe(["+sweeps=sham_multi", "experiment=credit_multi", "method=sham_credit", "seed=20", *sweep], True)
    longer = describe(["+sweeps=sham_multi", "experiment=credit_multi", "method=oracle_credit", "seed=20",
                       "trainer.max_steps=300", *sweep], True)
    assert a.cost_key == b.cost_key == longer.cost_key != c.cost_key
    assert (a.max_steps, a.eval_every, longer.max_steps) == (100, 50, 300)
    assert a.folder == tmp_path / "oracle_credit-seed20" and not a.finished and a.done_steps == 0


def _logged(folder, steps):
    folder.mkdir(parents=True)
    rows = [{"step": s, "time/step_s": 1.0} for s in range(1, steps + 1)] + [{"step": steps, "time/eval_s": 2.0}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9')  # a cut line


def test_runs_already_in_the_sweep_folder_count_only_what_is_left(tmp_path):
    _logged(tmp_path / "oracle_credit-seed20", 100)
    _logged(tmp_path / "oracle_credit-seed21", 40)
    common = ["+sweeps=sham_multi", "experiment=credit_multi", "method=oracle_credit", f"hydra.sweep.dir={tmp_path}"]
    done = describe([*common, "seed=20"], True)
    assert done.finished and done.done_steps == 100
    stopped = describe([*common, "seed=21"], True)
    assert not stopped.finished and stopped.done_steps == 40
    longer = describe([*common, "seed=20", "trainer.max_steps=150"], True)  # a finished run extended
    assert not longer.finished and longer.done_steps == 100
    assert describe([f"run_dir={tmp_path / 'oracle_credit-seed20'}"], False).done_steps == 100


def test_the_default_sweep_subdir_is_the_jobs_number(tmp_path):
    _logged(tmp_path / "1", 3)
    jobs = [describe(o, True, i) for i, o in enumerate(job_overrides(
        ["seed=0,1", "trainer.max_steps=3", f"hydra.sweep.dir={tmp_path}"], multirun=True))]
    assert [j.folder for j in jobs] == [tmp_path / "0", tmp_path / "1"]
    assert [j.finished for j in jobs] == [False, True]


def test_another_launcher_is_refused():
    with pytest.raises(ConfigError, match="one at a time on this machine"):
        plan(["hydra/launcher=slurm"], multirun=True)


def test_the_command_line_reaches_the_planner(monkeypatch):
    seen = []
    monkeypatch.setattr(train_command, "plan", lambda o, m, s: seen.append((o, m, s)) or "plan")
    monkeypatch.setattr(train_command, "print_plan", lambda p: seen.append(p))
    main(["train", "-m", "seed=0,1", "--plan", "--calibrate-steps", "3"])
    main(["train", "seed=0", "--plan", "--calibrate-steps=5"])
    main(["train", "--plan"])
    assert seen == [(["seed=0,1"], True, 3), "plan", (["seed=0"], False, 5), "plan", ([], False, 4), "plan"]


@pytest.mark.parametrize("args, message", [
    (["--calibrate-steps", "4"], "goes with --plan"),
    (["--plan", "--calibrate-steps", "1"], "goes with --plan"),
    (["--plan", "--calibrate-steps=x"], "goes with --plan"),
    (["--plan", "--dry-run"], "Give one."),
    (["--plan", "--cfg", "job"], "--cfg is not supported with it"),
    (["--plan", "seed=0,1"], "--plan: "),   # a sweep without -m: Hydra's message, as one line
])
def test_command_line_errors(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err

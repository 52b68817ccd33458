"""Held-out evaluation is held out (issue 14): test rows that are training rows are never scored
unless ``eval.allow_train_rows=true``; a one-file task stops before the model loads naming the
fixes; ``eval.holdout`` evaluates on rows held out of the train split; start-up says when fewer
problems than ``eval.problems`` exist and ``eval/problems`` logs how many were scored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from creditlab.errors import InputError
from creditlab.run.datamodule import TaskDataModule, split_holdout
from creditlab.step.evaluation import EvalConfig, evaluate
from creditlab.types import Completion, Problem, Rewards, RolloutConfig, Sum
from creditlab_math.tasks import GSM8KTask


class _Task:
    """A stand-in task: ``rows[split]`` prompts."""

    def __init__(self, rows: dict[str, list[str]]) -> None:
        self.rows = rows

    def load(self, split: str) -> list[Problem]:
        return [Problem(f"{split}-{i}", p, "1") for i, p in enumerate(self.rows[split])]


TRAIN = [f"{i}+{i}=" for i in range(24)]


def _data(rows: dict[str, list[str]], **eval_options) -> TaskDataModule:
    return TaskDataModule(_Task(rows), 4, 3, 0, EvalConfig(**eval_options))


def test_a_test_split_that_is_the_train_split_stops_naming_the_fixes():
    data = _data({"train": TRAIN, "test": TRAIN}, problems=500)
    with pytest.raises(InputError) as exc:
        data.setup()
    msg = str(exc.value)
    assert "all 24 test rows are training rows" in msg and msg.count("\n") == 1
    for fix in ("eval.holdout=<rows>", "eval.allow_train_rows=true", "eval.every=0"):
        assert fix in msg


def test_allow_train_rows_scores_them_and_says_how_many(capsys):
    data = _data({"train": TRAIN, "test": TRAIN}, problems=500, allow_train_rows=True)
    assert [p.prompt for p in data.test_problems] == TRAIN
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [("[creditlab] warning: eval.problems=500 but task _Task has 24 held-out test rows: "
                    "evaluation scores 24 problems (eval/problems).")]


def test_without_evaluation_a_shared_file_is_not_refused(capsys):
    data = _data({"train": TRAIN, "test": TRAIN}, every=0, problems=500)
    assert data.test_problems == [] and len(data.train_problems) == 24
    assert capsys.readouterr().err == ""  # no evaluation: nothing to warn about


def test_overlapping_rows_are_left_out_with_one_line(capsys):
    data = _data({"train": TRAIN, "test": TRAIN[:3] + ["x", "y"]}, problems=5)
    assert [p.prompt for p in data.test_problems] == ["x", "y"]
    left_out, fewer = capsys.readouterr().err.strip().splitlines()
    assert "3 of the 5 test rows of task _Task are also training rows" in left_out
    assert "eval.problems=5 but task _Task has 2 held-out test rows" in fewer


def test_disjoint_splits_are_unchanged_and_silent(capsys):
    test = ["a", "b", "c"]
    data = _data({"train": TRAIN, "test": test}, problems=3)
    assert [p.prompt for p in data.test_problems] == test and len(data.train_problems) == 24
    assert capsys.readouterr().err == ""


def test_holdout_is_fixed_disjoint_and_seed_independent():
    rows = {"train": TRAIN, "test": ["never read"]}
    a = TaskDataModule(_Task(rows), 4, 3, seed=0, eval_cfg=EvalConfig(holdout=6, problems=6))
    b = TaskDataModule(_Task(rows), 4, 3, seed=7, eval_cfg=EvalConfig(holdout=6, problems=6))
    assert [p.id for p in a.test_problems] == [p.id for p in b.test_problems]
    held = {p.prompt for p in a.test_problems}
    assert len(held) == 6 and not held & {p.prompt for p in a.train_problems}
    assert len(a.train_problems) == 18
    ids = [p.id for p in a.test_problems]
    assert ids == sorted(ids, key=lambda i: int(i.split("-")[1]))  # file order kept
    assert ids != [f"train-{i}" for i in range(6)]  # a shuffle, not the first rows
    # every step draws from the 18 training rows only
    drawn = {p.prompt for s in range(12) for p in a.problems_for_step(s)}
    assert drawn <= {p.prompt for p in a.train_problems}


def test_holdout_that_leaves_nothing_to_train_on_is_refused():
    with pytest.raises(InputError, match=r"eval.holdout=24 would hold out every row .* eval.holdout < 24"):
        split_holdout([Problem(str(i), t, "1") for i, t in enumerate(TRAIN)], 24, "train")


def test_one_gsm8k_file_for_both_splits_is_refused(tmp_path):
    """The issue's case: a single 24-row file and eval.problems=500."""
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"question": f"What is {i}+{i}?", "answer": f"#### {2 * i}"}) + "\n"
                            for i in range(24)))
    task = GSM8KTask(GSM8KTask.Config(path=str(path)))
    with pytest.raises(InputError, match="all 24 test rows are training rows"):
        TaskDataModule(task, 4, 3, 0, EvalConfig(problems=500)).setup()
    held = TaskDataModule(task, 4, 3, 0, EvalConfig(problems=500, holdout=4))
    assert len(held.test_problems) == 4 and len(held.train_problems) == 20


class _Backend:
    def generate(self, requests, sampling):
        return [Completion((5,), (1,), (0.0,), "eos", "2") for _ in requests]


class _Verifier:
    def reset_metrics(self):
        pass

    def metrics(self):
        return {}

    def score(self, problems, completions):
        return Rewards(tuple(float(p.id != "b") for p in problems), tuple({} for _ in problems))


class _Ctx:
    def encode(self, text):
        return [1, 2]


def test_evaluate_logs_how_many_problems_were_scored():
    problems = [Problem(i, "q", "2") for i in "abc"]
    out = evaluate(_Backend(), _Verifier(), _Ctx(), problems, EvalConfig(problems=500), RolloutConfig(), 0)
    assert out["eval/problems"] == 3 and isinstance(out["eval/problems"], Sum)  # summed over ranks
    assert out["eval/pass@1"] == pytest.approx(2 / 3)
    out = evaluate(_Backend(), _Verifier(), _Ctx(), problems, EvalConfig(problems=2), RolloutConfig(), 0)
    assert out["eval/problems"] == 2


def test_the_runner_refuses_before_the_model_loads(tmp_path, monkeypatch):
    from creditlab.run import runner
    from creditlab.run.compose import compose
    from creditlab.run.config import validate

    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}?", "answer": "#### 1"}) + "\n" for i in range(5)))
    cfg = compose(["task=gsm8k", f"task.path={path}", "logger=none", f"run_dir={tmp_path / 'run'}"])

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the data check")

    monkeypatch.setattr(runner, "load_policy", no_model)
    with pytest.raises(InputError, match="all 5 test rows are training rows"):
        runner.fit(cfg, validate(cfg), Path(tmp_path / "run"))

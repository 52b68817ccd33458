"""GSM8K / MATH-style tasks: loading from local files, split resolution, clear data errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from creditlab.errors import ConfigError
from creditlab.registry import build_part
from creditlab.types import Completion
from creditlab_math.tasks import GSM8KTask, MathTask, TaskDataError
from creditlab_math.verifiers import GSM8KVerifier

FIXTURES = Path(__file__).parents[1] / "fixtures" / "math"
GSM8K = FIXTURES / "gsm8k_small.jsonl"
MATH = FIXTURES / "math_small.jsonl"
SHARED_GSM8K = Path(__file__).parents[2].parent / "shared/data/gsm8k/test.jsonl"


def gsm8k(**options) -> GSM8KTask:
    return GSM8KTask(GSM8KTask.Config(**options))


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def row(question="Ann has 2 apples and buys 3. How many?", answer="2 + 3 = 5\n#### 5"):
    return {"question": question, "answer": answer}


# -- GSM8K ---------------------------------------------------------------------------------------
def test_gsm8k_fixture_loads():
    problems = gsm8k(path=str(GSM8K)).load("test")
    assert len(problems) == 10
    assert [p.answer for p in problems][:5] == ["18", "126", "1050", "7.5", "772"]
    assert problems[-1].answer == "-6"
    first = problems[0]
    assert first.id == "gsm8k-test-0"
    assert len({p.id for p in problems}) == 10
    assert first.oracle is None
    assert "Mira has 14 stickers" in first.prompt and "####" in first.prompt
    assert "{question}" not in first.prompt
    assert first.metadata["solution"].endswith("#### 18")
    assert first.metadata["index"] == 0 and first.metadata["source"] == str(GSM8K)


def test_gsm8k_fixture_solutions_score_correct_with_gsm8k_verifier():
    problems = gsm8k(path=str(GSM8K)).load("train")
    completions = [
        Completion((), (), (), "eos", p.metadata["solution"]) for p in problems
    ]
    rewards = GSM8KVerifier().score(problems, completions)
    assert rewards.values == (1.0,) * len(problems), rewards.info


def test_prompt_template_limit_and_custom_fields():
    task = gsm8k(
        path=str(FIXTURES / "gsm8k_wrong_field.jsonl"),
        question_field="prompt",
        answer_field="solution",
        prompt_template="Q: {question}\nA:",
    )
    (problem,) = task.load("test")
    assert problem.prompt == "Q: Cal has 6 eggs and eats 2. How many are left?\nA:"
    assert problem.answer == "4"
    assert len(gsm8k(path=str(GSM8K), limit=3).load("test")) == 3


def test_template_without_placeholder_is_a_config_error():
    with pytest.raises(ConfigError, match=r"must contain '\{question\}'"):
        gsm8k(path=str(GSM8K), prompt_template="Solve it.")
    with pytest.raises(ConfigError, match=r"must contain '\{problem\}'"):
        MathTask(MathTask.Config(prompt_template="Solve {question}"))
    with pytest.raises(ConfigError, match="limit"):
        gsm8k(path=str(GSM8K), limit=-1)


def test_split_resolution(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [row(), row("B has 1 and gets 1. How many?", "#### 2")])
    write_jsonl(tmp_path / "test.jsonl", [row("C has 4 and loses 1. How many?", "#### 3")])
    by_dir = gsm8k(path=str(tmp_path))
    assert [p.answer for p in by_dir.load("train")] == ["5", "2"]
    assert [p.answer for p in by_dir.load("test")] == ["3"]
    placeholder = gsm8k(path=str(tmp_path / "{split}.jsonl"))
    assert [p.answer for p in placeholder.load("test")] == ["3"]
    explicit = gsm8k(path=str(tmp_path), train_file="test.jsonl")
    assert [p.answer for p in explicit.load("train")] == ["3"]
    single = gsm8k(path=str(tmp_path / "train.jsonl"))
    assert len(single.load("train")) == len(single.load("test")) == 2


def test_json_array_and_parquet_files(tmp_path):
    (tmp_path / "rows.json").write_text(json.dumps([row(), row(answer="#### 1,250")]))
    assert [p.answer for p in gsm8k(path=str(tmp_path / "rows.json")).load("test")] == ["5", "1250"]
    from datasets import Dataset

    Dataset.from_list([row()]).to_parquet(str(tmp_path / "test-00000-of-00001.parquet"))
    (problem,) = gsm8k(path=str(tmp_path)).load("test")
    assert problem.answer == "5"


def test_id_field_and_duplicate_ids(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{**row(), "uid": "a"}, {**row(), "uid": "b"}])
    assert [p.id for p in gsm8k(path=str(path), id_field="uid").load("test")] == ["a", "b"]
    dup = write_jsonl(tmp_path / "dup.jsonl", [{**row(), "uid": "a"}, {**row(), "uid": "a"}])
    with pytest.raises(TaskDataError, match=r"row 2: id 'a' repeats row 1"):
        gsm8k(path=str(dup), id_field="uid").load("test")
    with pytest.raises(TaskDataError, match=r"missing id field 'key'"):
        gsm8k(path=str(path), id_field="key").load("test")


# -- clear errors ----------------------------------------------------------------------------------
def test_missing_field_names_file_row_fields_and_config_key():
    path = FIXTURES / "gsm8k_wrong_field.jsonl"
    with pytest.raises(TaskDataError) as err:
        gsm8k(path=str(path)).load("test")
    message = str(err.value)
    assert f"{path}, row 1" in message
    assert "missing field 'question'" in message
    assert "the row has: prompt, solution" in message
    assert "task.question_field" in message


def test_missing_answer_field(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [row(), {"question": "Why?", "final": "#### 1"}])
    with pytest.raises(TaskDataError, match=r"row 2: missing field 'answer' .*task\.answer_field"):
        gsm8k(path=str(path)).load("test")


@pytest.mark.parametrize(
    ("value", "shown"), [(5, "got int 5"), (["q"], "got list ['q']"), ({"a": 1}, "got dict")]
)
def test_non_string_prompt(tmp_path, value, shown):
    path = write_jsonl(tmp_path / "n.jsonl", [row(), row(question=value)])
    with pytest.raises(TaskDataError) as err:
        gsm8k(path=str(path)).load("test")
    assert f"{path}, row 2: field 'question' (the question) must be a string, {shown}" in str(
        err.value
    )


def test_empty_file_and_empty_array(tmp_path):
    with pytest.raises(TaskDataError, match=f"no rows in {FIXTURES / 'empty.jsonl'}"):
        gsm8k(path=str(FIXTURES / "empty.jsonl")).load("test")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(TaskDataError, match="no rows in"):
        gsm8k(path=str(tmp_path / "blank.jsonl")).load("test")
    (tmp_path / "arr.json").write_text("[]")
    with pytest.raises(TaskDataError, match="no rows in"):
        gsm8k(path=str(tmp_path / "arr.json")).load("test")


def test_missing_files_and_split_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"task\.path .*nope\.jsonl does not exist"):
        gsm8k(path=str(tmp_path / "nope.jsonl")).load("test")
    with pytest.raises(FileNotFoundError, match=r"split 'train' not found: .*train\.jsonl"):
        gsm8k(path=str(tmp_path / "{split}.jsonl")).load("train")
    write_jsonl(tmp_path / "test.jsonl", [row()])
    with pytest.raises(FileNotFoundError, match=r"no file for split 'train' .*found: test\.jsonl"):
        gsm8k(path=str(tmp_path)).load("train")
    (tmp_path / "data.csv").write_text("question,answer\n")
    with pytest.raises(TaskDataError, match="unsupported extension '.csv'"):
        gsm8k(path=str(tmp_path / "data.csv")).load("test")


def test_no_hashes_in_gsm8k_answer():
    path = FIXTURES / "gsm8k_no_hashes.jsonl"
    with pytest.raises(TaskDataError) as err:
        gsm8k(path=str(path)).load("test")
    assert f"{path}, row 2: the answer field 'answer' has no '####' marker" in str(err.value)
    assert "'math' task" in str(err.value)


def test_invalid_json_names_the_line(tmp_path):
    path = FIXTURES / "gsm8k_bad_json.jsonl"
    with pytest.raises(TaskDataError, match=f"invalid JSON on line 2 of {path}"):
        gsm8k(path=str(path)).load("test")
    (tmp_path / "scalar.jsonl").write_text(json.dumps(row()) + "\n[1, 2]\n")
    with pytest.raises(TaskDataError, match="line 2 of .* is a JSON list|row 2 .* JSON list"):
        gsm8k(path=str(tmp_path / "scalar.jsonl")).load("test")


# -- MATH ------------------------------------------------------------------------------------------
def test_math_fixture_loads():
    task = MathTask(MathTask.Config(path=str(MATH), id_field="unique_id"))
    problems = task.load("test")
    assert len(problems) == 10
    assert problems[0].id == "fixture/00"
    assert [p.answer for p in problems][:3] == ["\\frac{3}{4}", "\\sqrt{2}", "(-\\infty, 3]"]
    assert problems[0].metadata["level"] == "Level 1"
    assert problems[0].metadata["type"] == "Prealgebra"
    assert "\\boxed{}" in problems[0].prompt and "\\frac{1}{4}" in problems[0].prompt
    assert all(p.oracle is None for p in problems)


def test_math_answer_from_solution(tmp_path):
    from_solution = MathTask(
        MathTask.Config(path=str(MATH), answer_field="solution", answer_from_solution=True)
    ).load("test")
    direct = MathTask(MathTask.Config(path=str(MATH))).load("test")
    assert [p.answer for p in from_solution] == [p.answer for p in direct]
    assert from_solution[1].metadata["solution"].endswith("\\boxed{\\sqrt{2}}$.")
    bad = write_jsonl(tmp_path / "m.jsonl", [{"problem": "1+1?", "solution": "It is 2."}])
    with pytest.raises(TaskDataError, match=r"m\.jsonl, row 1: answer_from_solution .* no comp"):
        MathTask(
            MathTask.Config(path=str(bad), answer_field="solution", answer_from_solution=True)
        ).load("test")
    with pytest.raises(TaskDataError, match=r"missing field 'answer' \(the row has: problem, "):
        MathTask(MathTask.Config(path=str(bad))).load("test")


def test_registry_builds_tasks(tmp_path):
    task = build_part("task", {"name": "gsm8k", "path": str(GSM8K), "limit": 2})
    assert isinstance(task, GSM8KTask) and len(task.load("test")) == 2
    shutil.copy(MATH, tmp_path / "test.jsonl")
    math = build_part("task", {"name": "math", "path": str(tmp_path)})
    assert isinstance(math, MathTask) and len(math.load("test")) == 10


# -- optional: the real GSM8K test split ----------------------------------------------------------
@pytest.mark.skipif(not SHARED_GSM8K.is_file(), reason="shared GSM8K data not present")
def test_shared_gsm8k_test_split_loads():
    problems = gsm8k(path=str(SHARED_GSM8K)).load("test")
    assert len(problems) == sum(1 for line in SHARED_GSM8K.open() if line.strip())
    assert all(p.answer.lstrip("-").replace(".", "", 1).isdigit() for p in problems)

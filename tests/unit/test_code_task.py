"""The code task (shipped set, user files, hub pass-through, row validation) and code extraction."""

from __future__ import annotations

import json

import pytest
from creditlab.errors import ConfigError
from creditlab.testing import check_part
from creditlab.types import Completion
from creditlab_code.extract import extract_code, fenced_blocks
from creditlab_code.tasks import CodeTask
from creditlab_math.tasks import TaskDataError

ROW = {"id": "double", "prompt": "Return twice x.", "signature": "def double(x: int) -> int",
       "entry_point": "double", "tests": ["assert double(2) == 4", "assert double(0) == 0"],
       "solution": "def double(x):\n    return 2 * x\n"}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def load(tmp_path, rows, **options):
    return CodeTask(CodeTask.Config(path=write_jsonl(tmp_path / "p.jsonl", rows), **options)).load("test")


# -- the shipped set --------------------------------------------------------------------------
def test_shipped_set_loads_by_default():
    task = CodeTask()
    check_part("task", task)
    train, test = task.load("train"), task.load("test")
    assert (len(train), len(test)) == (36, 12)
    assert not {p.id for p in train} & {p.id for p in test}, "train and test do not overlap"
    for p in [*train, *test]:
        assert 3 <= len(p.metadata["tests"]) <= 6 and p.answer.startswith(f"def {p.metadata['entry_point']}(")
        assert "```python" in p.prompt and p.metadata["signature"] in p.prompt


def test_shipped_prompts_fit_the_tiny_model():
    """The embedded model's character tokenizer encodes every prompt without unknown tokens,
    and prompt + a 256-token answer fits its 2048-position context."""
    from creditlab_arith.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    for p in [*CodeTask().load("train"), *CodeTask().load("test")]:
        ids = tok(p.prompt)["input_ids"]
        assert tok.unk_token_id not in ids, p.id
        assert len(ids) + 256 <= 2048


def test_every_shipped_solution_passes_its_tests_in_the_sandbox():
    from creditlab_code.verifier import CodeTestsVerifier

    problems = [*CodeTask().load("train"), *CodeTask().load("test")]
    texts = [f"```python\n{p.answer}```" for p in problems]
    verifier = CodeTestsVerifier()
    try:
        rewards = verifier.score(problems, [Completion((1,), (2,), (-0.1,), "eos", t) for t in texts])
    finally:
        verifier.close()
    failed = [(p.id, i["tests"]) for p, v, i in zip(problems, rewards.values, rewards.info) if v != 1.0]
    assert not failed


def test_unknown_split_is_explained():
    with pytest.raises(FileNotFoundError, match="ships splits 'train' and 'test'"):
        CodeTask().load("validation")


# -- user data --------------------------------------------------------------------------------
def test_user_jsonl_and_parquet(tmp_path):
    problems = load(tmp_path, [ROW, {**ROW, "id": "d2"}])
    assert [p.id for p in problems] == ["double", "d2"]
    assert problems[0].metadata["tests"] == tuple(ROW["tests"]) and problems[0].answer == ROW["solution"]
    assert "Return twice x." in problems[0].prompt
    from datasets import Dataset

    Dataset.from_list([ROW]).to_parquet(str(tmp_path / "test.parquet"))
    problems = CodeTask(CodeTask.Config(path=str(tmp_path / "test.parquet"))).load("test")
    assert problems[0].metadata["tests"] == tuple(ROW["tests"])


def test_field_names_and_optional_parts_are_configurable(tmp_path):
    row = {"text": "Return twice x.", "name": "double", "checks": ROW["tests"]}
    problems = load(tmp_path, [row], id_field=None, prompt_field="text", entry_point_field="name",
                    tests_field="checks", signature_field=None, solution_field=None, limit=1)
    assert problems[0].id == "code-test-0" and problems[0].answer == ""
    assert "def double(...)" in problems[0].prompt


def test_hub_names_are_passed_to_datasets(monkeypatch):
    import datasets

    calls = []

    def fake_load(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_list([ROW])

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    problems = CodeTask(CodeTask.Config(hub_name="someone/code-set", hub_config="main")).load("train")
    assert calls == [("someone/code-set", "main", "train")] and problems[0].id == "double"

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(TaskDataError, match="could not load 'someone/code-set'.*task.path"):
        CodeTask(CodeTask.Config(hub_name="someone/code-set")).load("train")


@pytest.mark.parametrize("change,message", [
    ({"tests": None}, "row 2: missing field 'tests'"),
    ({"tests": "assert double(1) == 2"}, "row 2: field 'tests' must be a non-empty list"),
    ({"tests": []}, "row 2: field 'tests' must be a non-empty list"),
    ({"tests": ["assert double(1) == 2", "assert double(("]}, "row 2: test 2 of field 'tests' is not valid Python"),
    ({"tests": ["assert double(1) == 2", 3]}, "row 2: test 2 of field 'tests' must be a non-empty string"),
    ({"entry_point": "def"}, "row 2: field 'entry_point' must be a Python function name"),
    ({"entry_point": None}, "row 2: missing field 'entry_point'"),
    ({"signature": "def triple(x)"}, "row 2: field 'signature' must start with 'def double\\('"),
    ({"prompt": ""}, "row 2: field 'prompt' \\(the description\\) must be a non-empty string"),
    ({"solution": 5}, "row 2: field 'solution' .* must be a string"),
    ({"id": "double"}, "row 2: id 'double' repeats row 1"),
])
def test_malformed_rows_name_the_row_and_field(tmp_path, change, message):
    bad = {**ROW, "id": "second", **change}
    bad = {k: v for k, v in bad.items() if v is not None}
    with pytest.raises(TaskDataError, match=message):
        load(tmp_path, [ROW, bad])


def test_bad_files_and_config(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(TaskDataError, match="no rows"):
        CodeTask(CodeTask.Config(path=str(tmp_path / "empty.jsonl"))).load("test")
    (tmp_path / "broken.jsonl").write_text(json.dumps(ROW) + "\n{not json\n")
    with pytest.raises(TaskDataError, match="line 2"):
        CodeTask(CodeTask.Config(path=str(tmp_path / "broken.jsonl"))).load("test")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        CodeTask(CodeTask.Config(path=str(tmp_path / "missing.jsonl"))).load("test")
    with pytest.raises(ConfigError, match="prompt_template"):
        CodeTask(CodeTask.Config(prompt_template="Write code."))
    with pytest.raises(ConfigError, match="limit"):
        CodeTask(CodeTask.Config(limit=-1))


# -- extraction -------------------------------------------------------------------------------
def test_extract_takes_the_last_python_block():
    text = "First:\n```python\nx = 1\n```\nbetter:\n```py\nx = 2\n```\nnotes:\n```\nplain\n```\n"
    assert extract_code(text) == "x = 2"
    assert [tag for tag, _ in fenced_blocks(text)] == ["python", "py", ""]


def test_extract_falls_back_to_any_block_then_the_whole_text():
    assert extract_code("```\ny = 3\n```") == "y = 3"
    assert extract_code("def f():\n    return 1") == "def f():\n    return 1"
    assert extract_code("def f():\n    return 1", require_fence=True) is None


def test_extract_handles_truncated_and_empty_answers():
    assert extract_code("```python\ndef f():\n    return") == "def f():\n    return"
    assert extract_code("```python\n\n```") is None
    assert extract_code("") is None and extract_code("  \n ") is None
    assert extract_code("text ```python inline``` text") == "text ```python inline``` text"

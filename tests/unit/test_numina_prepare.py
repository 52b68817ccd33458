"""The NuminaMath olympiad selection (SRPO paper) and ``python -m creditlab_math.prepare``:
answer extraction and the verifiability rules, the seeded split, local copies (JSONL, sharded
parquet folders), clear errors for malformed rows and for the hub without network, and the
``numina_olympiads`` task reading what the preparation wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from creditlab.registry import build_part
from creditlab_math.numina import (
    PrepareError,
    last_boxed_answer,
    repair_answer,
    seeded_split,
    select,
    unverifiable_reason,
)
from creditlab_math.prepare import local_files, main
from creditlab_math.tasks import NuminaOlympiadsTask

ROOT = Path(__file__).parents[2]


def row(solution: str, source: str = "olympiads", problem: str = "Find it.") -> dict:
    """A row in the NuminaMath-CoT format (with its chat ``messages`` column)."""
    return {"source": source, "problem": problem, "solution": solution,
            "messages": [{"role": "user", "content": problem}, {"role": "assistant", "content": solution}]}


#: (solution, kept answer or drop reason) in dataset order; non-olympiad rows are ignored.
FIXTURE = [
    ("So the total is \\boxed{28}.", "28"),
    ("Thus $x = \\boxed{\\frac{3}{4}}$.", "\\frac{3}{4}"),
    ("Hence the ratio is \\boxed{frac{1}{2}}.", "\\frac{1}{2}"),  # missing backslash repaired
    ("We prove the claim by induction on $n$. $\\blacksquare$", "no_boxed"),  # a proof
    ("Therefore \\boxed{\\text{the statement holds}}.", "words"),
    ("First \\boxed{5}, in all \\boxed{12\\,\\mathrm{kg}}.", "markup"),  # the *last* box
    ("The correct option is \\boxed{C}.", "C"),
    ("The rate is \\boxed{50\\%}.", "percent_tilde_or"),
    ("The side is \\boxed{12 cm}.", "units"),
    ("The answer is \\boxed{3", "no_boxed"),  # the last box never closes
    ("So the minimum is \\boxed{x + y}.", "no_digit"),
    ("It equals \\boxed{-3}.", "leading_punctuation"),  # the official rules drop leading minus signs
    ("\\boxed{" + "1+" * 40 + "1}", "too_long"),
    ("It is \\boxed{(1, 2}.", "unbalanced"),
    ("Finally, \\boxed{\\sqrt{2}}.", "\\sqrt{2}"),
    ("Both \\boxed{2} and \\boxed{7}: the answer is 7, i.e. \\boxed{7}.", "7"),
]
OTHERS = [row("\\boxed{4}", source="synthetic_math"), row("\\boxed{11}", source="amc_aime")]


def fixture_rows() -> list[dict]:
    rows = [row(s, problem=f"Problem {i}.") for i, (s, _) in enumerate(FIXTURE)]
    return [OTHERS[0], *rows[:5], OTHERS[1], *rows[5:]]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


REASONS = {"no_boxed", "empty", "too_long", "unbalanced", "words", "no_digit", "markup",
           "leading_punctuation", "percent_tilde_or", "units"}
KEPT = [a for _, a in FIXTURE if a not in REASONS]


# -- the rules ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("solution", "expected"), FIXTURE)
def test_each_rule(solution, expected):
    answer = last_boxed_answer(solution)
    if expected == "no_boxed":
        assert answer == ""
        return
    reason = unverifiable_reason(repair_answer(answer))
    assert (repair_answer(answer) if reason is None else reason) == expected


def test_extraction_and_repair_details():
    assert last_boxed_answer("a \\boxed{\\frac{1}{\\sqrt{2}}} b") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed_answer("\\boxed{1} then \\boxed{2") == "", "no fallback to an earlier box"
    assert last_boxed_answer("\\fbox{3}") == "" and last_boxed_answer("\\boxed {3}") == ""
    assert repair_answer("sqrt{3} + frac{1}{2}") == "\\sqrt{3} + \\frac{1}{2}"
    assert repair_answer("log{2}") == "\\log{2}" and repair_answer("2log{2}") == "2log{2}"
    assert unverifiable_reason("A") is None and unverifiable_reason("F") == "no_digit"
    assert unverifiable_reason("\\pi") == "no_digit" and unverifiable_reason("2\\pi") is None
    assert unverifiable_reason("3 or 4") == "percent_tilde_or" and unverifiable_reason("") == "empty"


def test_select_keeps_olympiad_rows_in_order_and_counts_drops():
    kept = select(fixture_rows(), "fixture")
    assert kept.total == len(FIXTURE) + 2 and kept.matched == len(FIXTURE)
    assert [r["answer"] for r in kept.rows] == KEPT
    assert [r["id"] for r in kept.rows] == [f"numina-olympiads-{i}" for i in range(len(KEPT))]
    assert kept.rows[0]["source_index"] == 1 and kept.rows[0]["problem"] == "Problem 0."
    expected_drops = {}
    for _, a in FIXTURE:
        if a not in KEPT:
            expected_drops[a] = expected_drops.get(a, 0) + 1
    assert dict(kept.dropped) == expected_drops
    assert sum(kept.dropped.values()) + len(kept.rows) == kept.matched


def test_malformed_rows_name_the_row_and_the_fields():
    missing = r"fixture, row 2: field 'source' is missing \(the row has: problem, solution\)"
    with pytest.raises(PrepareError, match=missing):
        select([row("\\boxed{1}"), {"problem": "p", "solution": "s"}], "fixture")
    with pytest.raises(PrepareError, match=r"row 1: field 'solution' is int, not a string"):
        select([{"source": "olympiads", "problem": "p", "solution": 5}], "fixture")
    with pytest.raises(PrepareError, match=r"row 1: a list, not an object"):
        select([[1, 2]], "fixture")
    assert select([row("x", source="cn_k12") | {"problem": None}], "f").matched == 0  # others: source only
    kept = select([row("\\boxed{4}", problem="  ")], "fixture")
    assert kept.rows == [] and dict(kept.dropped) == {"empty_problem": 1}


def test_seeded_split_is_pandas_sample_with_the_seed():
    pd = pytest.importorskip("pandas")
    rows = [{"id": i} for i in range(57)]
    train, test = seeded_split(rows, 40, 10, 42)
    order = pd.DataFrame({"id": range(57)}).sample(frac=1, random_state=42)["id"].tolist()
    assert [r["id"] for r in train] == order[:40] and [r["id"] for r in test] == order[40:50]
    assert seeded_split(rows, 40, 10, 42) == (train, test)
    assert seeded_split(rows, 40, 10, 7) != (train, test)
    with pytest.raises(PrepareError, match=r"only 57 rows were kept, fewer than the 50 train \+ 10 test"):
        seeded_split(rows, 50, 10, 42)


# -- the command line ----------------------------------------------------------------------------
def run_cli(*args: str) -> dict:
    main(list(args))
    out = Path(args[args.index("--out") + 1])
    return json.loads((out / "prepare.json").read_text())


def test_cli_from_a_local_jsonl_copy_and_the_task_reads_it(tmp_path, capsys):
    src = write_jsonl(tmp_path / "numina.jsonl", fixture_rows())
    out = tmp_path / "prepared"
    manifest = run_cli("numina-olympiads", "--from", str(src), "--out", str(out),
                       "--n-train", "4", "--n-test", "2", "--no-self-check")
    assert "wrote train.jsonl (4 rows), test.jsonl (2 rows)" in capsys.readouterr().out
    assert manifest["local"] == str(src) and manifest["kept"] == len(KEPT) and manifest["seed"] == 42
    assert manifest["rows_read"] == len(FIXTURE) + 2 and manifest["olympiad_rows"] == len(FIXTURE)
    assert manifest["dropped"]["no_boxed"] == 2 and "self_check" not in manifest
    train = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    test = [json.loads(x) for x in (out / "test.jsonl").read_text().splitlines()]
    expected_train, expected_test = seeded_split(select(fixture_rows(), "f").rows, 4, 2, 42)
    assert train == expected_train and test == expected_test
    assert set(train[0]) == {"id", "problem", "answer", "solution", "source_index"}

    task = build_part("task", {"name": "numina_olympiads", "path": str(out)})
    problems = task.load("train")
    assert [p.answer for p in problems] == [r["answer"] for r in train]
    assert [p.id for p in problems] == [r["id"] for r in train]
    assert problems[0].prompt.endswith(f"Problem: {train[0]['problem']}\n")
    assert "</thought>" in problems[0].prompt and "\\boxed{answer}" in problems[0].prompt
    assert len(task.load("test")) == 2
    assert len(build_part("task", {"name": "numina_olympiads", "path": str(out), "limit": 1}).load("train")) == 1


def test_local_sharded_parquet_folder_gives_the_same_split(tmp_path):
    from datasets import Dataset

    rows = fixture_rows()
    data = tmp_path / "NuminaMath-CoT" / "data"
    data.mkdir(parents=True)
    Dataset.from_list(rows[:7]).to_parquet(str(data / "train-00000-of-00002.parquet"))
    Dataset.from_list(rows[7:]).to_parquet(str(data / "train-00001-of-00002.parquet"))
    Dataset.from_list(rows[:2]).to_parquet(str(data / "test-00000-of-00001.parquet"))
    assert [Path(f).name for f in local_files(str(tmp_path / "NuminaMath-CoT"), "train")] == [
        "train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    a, b = tmp_path / "a", tmp_path / "b"
    run_cli("numina-olympiads", "--from", str(tmp_path / "NuminaMath-CoT"), "--out", str(a),
            "--n-train", "4", "--n-test", "2", "--no-self-check")
    run_cli("numina-olympiads", "--from", str(write_jsonl(tmp_path / "n.jsonl", rows)), "--out", str(b),
            "--n-train", "4", "--n-test", "2", "--no-self-check")
    for name in ("train.jsonl", "test.jsonl"):
        assert (a / name).read_text() == (b / name).read_text()


def test_self_check_scores_each_gold_answer_with_math_verify(tmp_path):
    src = write_jsonl(tmp_path / "numina.jsonl", fixture_rows())
    manifest = run_cli("numina-olympiads", "--from", str(src), "--out", str(tmp_path / "o"),
                       "--n-train", "4", "--n-test", "2")
    check = manifest["self_check"]
    assert check["checked"] == 6 and check["accepted"] + len(check["rejected"]) == 6
    assert check["accepted"] == 6 and check["rejected"] == [], check


def test_cli_errors_end_with_one_line(tmp_path, capsys):
    bad = write_jsonl(tmp_path / "bad.jsonl", [row("\\boxed{1}"), {"question": "q"}])
    with pytest.raises(SystemExit) as exit_info:
        main(["numina-olympiads", "--from", str(bad), "--out", str(tmp_path / "o"), "--no-self-check"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert "row 2: field 'source' is missing (the row has: question)" in err
    with pytest.raises(SystemExit):
        main(["numina-olympiads", "--from", str(write_jsonl(tmp_path / "s.jsonl", fixture_rows())),
              "--out", str(tmp_path / "o"), "--no-self-check"])
    assert "fewer than the 400 train + 100 test requested" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        main(["numina-olympiads", "--from", str(tmp_path / "empty"), "--out", str(tmp_path / "o")])
    assert "no 'train' data file in it" in capsys.readouterr().err
    assert not (tmp_path / "o").exists(), "nothing is written when preparation fails"


def test_hub_without_network_names_the_local_copy_route(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "creditlab_math.prepare", "numina-olympiads", "--out", str(tmp_path / "o")],
        check=False, capture_output=True, text=True, env=env, timeout=120, cwd=ROOT,
    )
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "cannot read AI-MO/NuminaMath-CoT" in lines[0] and "hf download AI-MO/NuminaMath-CoT" in lines[0]
    assert "--from <folder>" in lines[0]
    assert not (tmp_path / "o").exists()


def test_task_without_prepared_files_names_the_preparation(tmp_path):
    task = NuminaOlympiadsTask(NuminaOlympiadsTask.Config(path=str(tmp_path / "missing")))
    with pytest.raises(FileNotFoundError, match=r"python -m creditlab_math\.prepare numina-olympiads --out .*missing"):
        task.load("train")
    with pytest.raises(FileNotFoundError, match=r"--out data/numina_olympiads"):
        NuminaOlympiadsTask(NuminaOlympiadsTask.Config(path=None)).load("test")


def test_math500_and_gsm8k_from_local_copies(tmp_path):
    from datasets import Dataset

    math_rows = [json.loads(x) for x in (ROOT / "tests/fixtures/math/math_small.jsonl").read_text().splitlines()]
    out = tmp_path / "math500"
    manifest = run_cli("math500", "--from", str(ROOT / "tests/fixtures/math/math_small.jsonl"), "--out", str(out),
                       "--n-train", "6", "--n-test", "4", "--no-self-check")
    assert manifest["rows_read"] == 10 and manifest["n_train"] == 6
    task = build_part("task", {"name": "math", "path": str(out), "id_field": "id"})
    train, test = task.load("train"), task.load("test")
    assert len(train) == 6 and len(test) == 4
    assert {p.id for p in train + test} == {r["unique_id"] for r in math_rows}

    gsm = tmp_path / "gsm8k"  # laid out as `hf download openai/gsm8k` writes it: one folder per config
    for config, n in (("main", 3), ("socratic", 5)):
        (gsm / config).mkdir(parents=True)
        for split in ("train", "test"):
            rows = [{"question": f"{config} {split} {i}?", "answer": f"#### {i}"} for i in range(n)]
            Dataset.from_list(rows).to_parquet(str(gsm / config / f"{split}-00000-of-00001.parquet"))
    run_cli("gsm8k", "--from", str(gsm), "--out", str(tmp_path / "g"))
    problems = build_part("task", {"name": "gsm8k", "path": str(tmp_path / "g")}).load("test")
    assert [p.answer for p in problems] == ["0", "1", "2"] and "main test 0?" in problems[0].prompt

"""``results.jsonl.gz`` (issue 55 item 5): compare writes the runs it read beside its report, and
compare on that file alone gives the same numbers; the same runs give the same bytes; a file that
is not one is a one-line error."""

import gzip
import json

import pytest
from creditlab.analysis.compare import CompareError, compare
from creditlab.cli import main

from tests.unit.test_compare_prereg import _sweep


def _numbers(path):
    """compare.json without what names the folders read (paths)."""
    data = json.loads(path.read_text())
    data["settings"].pop("paths")
    for run in data["runs"]:
        run.pop("path")
    return data


def test_a_comparison_is_recomputed_from_its_results_file(tmp_path):
    _sweep(tmp_path / "runs")
    main(["compare", str(tmp_path / "runs"), "--out", str(tmp_path / "a")])
    results = tmp_path / "a" / "results.jsonl.gz"
    lines = [json.loads(x) for x in gzip.decompress(results.read_bytes()).decode().splitlines()]
    oracle = next(x for x in lines if x["name"] == "oracle-0")
    assert len(lines) == 30 and sorted(oracle["files"]) == ["config.yaml", "eval_problems.jsonl", "metrics.jsonl",
                                                            "status.json", "summary.json"]
    main(["compare", str(results), "--out", str(tmp_path / "b")])
    assert _numbers(tmp_path / "b" / "compare.json") == _numbers(tmp_path / "a" / "compare.json")
    assert (tmp_path / "b" / "results.jsonl.gz").read_bytes() == results.read_bytes()  # no time in the header
    table = [line for line in (tmp_path / "b" / "report.md").read_text().splitlines() if line.startswith("| oracle vs grpo")]
    assert table == [line for line in (tmp_path / "a" / "report.md").read_text().splitlines()
                     if line.startswith("| oracle vs grpo")] and len(table) == 2


@pytest.mark.parametrize("content, match", [
    (b"not gzip", "not a results file of creditlab compare"),
    (gzip.compress(b'{"name": "../escape", "files": {}}\n'), "line 1 is not a run of a results file"),
    (gzip.compress(b'{"name": "a", "files": {"run.sh": "rm -rf /"}}\n'), "line 1 is not a run of a results file"),
])
def test_a_file_that_is_not_one_is_a_clear_error(tmp_path, content, match):
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(content)
    with pytest.raises(CompareError, match=match):
        compare([bad])

"""sweeps/oracle_agreement.py: the reader sees no verdict; agreement and kappa by hand."""

from __future__ import annotations

import json

from tests.helpers import load_script


def test_prepare_then_compare_by_hand(tmp_path):
    study = load_script("sweeps/oracle_agreement.py")
    records = tmp_path / "records.jsonl"
    rows = [  # gsm8k-test-1: Janet's ducks (16 - 3 - 4 = 9 eggs, 9 * 2 = 18 dollars)
        {"id": "gsm8k-test-1", "greedy": {"text": "16 - 3 - 4 = 9 eggs\n9 * 2 = 18\n#### 18", "correct": True}},
        {"id": "gsm8k-test-1", "greedy": {"text": "16 - 3 = 13 eggs\n13 * 2 = 26\n#### 26", "correct": False}},
    ]
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "study"
    study.prepare(records, 5, out, "gsm8k_test")
    shown = [json.loads(line) for line in (out / "to_read.jsonl").read_text().splitlines()]
    assert [s["lines"] for s in shown] == [["16 - 3 - 4 = 9 eggs", "9 * 2 = 18", "#### 18"],
                                           ["16 - 3 = 13 eggs", "13 * 2 = 26", "#### 26"]]
    assert all(set(s) == {"id", "problem", "answer", "lines"} for s in shown)  # no verdict shown
    oracle = [json.loads(line) for line in (out / "oracle.jsonl").read_text().splitlines()]
    # 16 - 3 = 13 is a gold step's part (16 - 3 - 4); 13 * 2 = 26 leaves the gold path
    assert oracle[0]["labels"] == ["ok"] * 3 and oracle[1]["labels"] == ["ok", "wrong", "ok"]
    assert oracle[1]["why"][1] == "off_path"
    # a reader who agrees on the second solution and calls the first one's answer line wrong
    reading = [{"id": "gsm8k-test-1", "labels": ["ok", "ok", "wrong"]},
               {"id": "gsm8k-test-1", "labels": ["ok", "wrong", "wrong"]}]
    (out / "reading.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reading))
    report = study.compare(out)
    # lines compared: 0-2 of the first (the reader's first wrong is 2), 0-1 of the second
    assert "first wrong line agrees: 1/2" in report and "lines: agree 4/5" in report
    assert "oracle wrong & reader wrong 1, oracle wrong & reader not 0, oracle not & reader wrong 1, both not 3" in report
    assert "- gsm8k-test-1: oracle None (-), reader 2; answer 18" in report


def test_the_recorded_study_gives_the_cards_figures():
    """docs/oracle_study (203 lines of the one-epoch adapter's GSM8K-test solutions and a reading
    of them by hand): the oracle as it is now agrees as docs/real-problems.md says. A change to the
    oracle that moves these numbers must update the card."""
    from pathlib import Path

    study = load_script("sweeps/oracle_agreement.py")
    folder = Path(__file__).resolve().parents[2] / "docs" / "oracle_study"
    texts = [json.loads(line) for line in (folder / "to_read.jsonl").read_text().splitlines()]
    assert sum(len(t["lines"]) for t in texts) >= 200
    report = study.compare(folder)
    assert "52 solutions, 63 lines compared" in report
    assert "first wrong line agrees: 44/52 (0.85)" in report
    assert "lines: agree 55/63 (0.87), Cohen's kappa 0.65" in report
    card = (folder.parents[0] / "real-problems.md").read_text()
    assert "44 of 52" in card and "0.65" in card

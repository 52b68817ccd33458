"""How often does the word-problem step oracle agree with a reading by hand? (docs/real-problems.md)

    python sweeps/oracle_agreement.py prepare eval/records.jsonl --steps 200 --out oracle_study/
    # a reader who has not seen the oracle's verdicts fills oracle_study/reading.jsonl
    python sweeps/oracle_agreement.py compare oracle_study/

``prepare`` takes the greedy solutions of ``creditlab eval`` records (task ``word_problems``), in
file order, until they hold ``--steps`` thoughts (non-empty lines), and writes two files:
``to_read.jsonl`` (problem, gold answer, the solution's numbered lines: all a reader sees) and
``oracle.jsonl`` (the oracle's verdict on every line, kept apart). The reader writes
``reading.jsonl``: per solution ``{"id", "labels": ["ok" | "wrong" | "none", ...]}``, one label
per line (``none``: the line claims nothing to check), one row per solution in
``to_read.jsonl``'s order, judging each line as a careful teacher
would: is it a right step toward this problem's answer, given the lines before it?

``compare`` judges the same lines again with the oracle as it is now (``oracle.jsonl`` is what
it said at ``prepare``) and reports, per solution, whether the first wrong line agrees (the oracle's use: the
first wrong step of a failed chain), and per line, up to the first line either reader calls wrong
(after it, every later line inherits the error and "right" is ill-defined), a 2 x 2 table of
wrong / not wrong with Cohen's kappa; then every disagreement with both readings.
"""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from pathlib import Path

from creditlab_wordproblems.arithmetic import to_number
from creditlab_wordproblems.steps import GoldStep, judge
from creditlab_wordproblems.task import WordProblemsTask


def _problems(split: str) -> dict[str, object]:
    return {p.id: p for p in WordProblemsTask(WordProblemsTask.Config()).load(split)}


def prepare(records: Path, steps: int, out: Path, split: str) -> None:
    problems = _problems(split)
    out.mkdir(parents=True, exist_ok=True)
    to_read, verdicts, total = [], [], 0
    for line in records.read_text().splitlines():
        row = json.loads(line)
        problem = problems.get(row["id"])
        if problem is None:
            raise SystemExit(f"{row['id']}: not a problem of word_problems:{split}; prepare from its records")
        lines = [t for t in row["greedy"]["text"].splitlines() if t.strip()]
        if not lines:
            continue
        to_read.append({"id": row["id"], "problem": problem.metadata["problem"], "answer": problem.answer,
                        "lines": lines})
        verdicts.append({"id": row["id"], "correct": row["greedy"]["correct"], **_verdicts(problem, lines)})
        total += len(lines)
        if total >= steps:
            break
    (out / "to_read.jsonl").write_text("".join(json.dumps(r) + "\n" for r in to_read))
    (out / "oracle.jsonl").write_text("".join(json.dumps(r) + "\n" for r in verdicts))
    print(f"{len(to_read)} solutions, {total} lines: {out / 'to_read.jsonl'} (for the reader), {out / 'oracle.jsonl'}")


def _verdicts(problem, lines: list[str]) -> dict[str, list[str]]:
    """The oracle's labels (``ok`` / ``wrong``), reasons and details for a solution's lines."""
    gold = tuple(GoldStep(e, Fraction(v)) for e, v in problem.metadata["steps"])
    judged = judge(problem.metadata["problem"], gold, to_number(problem.answer), lines)
    return {"labels": ["wrong" if v.wrong else "ok" for v in judged],
            "why": [v.why for v in judged], "detail": [v.detail for v in judged]}


def _first(labels: list[str]) -> int | None:
    return next((i for i, label in enumerate(labels) if label == "wrong"), None)


def compare(folder: Path, split: str = "gsm8k_test") -> str:
    """The agreement report of ``folder``'s reading with the oracle as it reads the same lines
    now (so a changed oracle is measured against the same reading)."""
    reading, texts = ([json.loads(line) for line in (folder / name).read_text().splitlines()]
                      for name in ("reading.jsonl", "to_read.jsonl"))
    problems = _problems(split)
    oracle = [{"id": t["id"], **_verdicts(problems[t["id"]], t["lines"])} for t in texts]
    if [r["id"] for r in reading] != [r["id"] for r in oracle]:
        raise SystemExit("reading.jsonl must hold one row per solution of to_read.jsonl, in its order")
    first_agree, table, disagreements, lines = 0, {(a, b): 0 for a in (0, 1) for b in (0, 1)}, [], 0
    for o, read, text in zip(oracle, reading, texts):
        pid, h = o["id"], read["labels"]
        if len(h) != len(o["labels"]):
            raise SystemExit(f"{pid}: {len(h)} labels for {len(o['labels'])} lines")
        fo, fh = _first(o["labels"]), _first(h)
        first_agree += fo == fh
        stop = min(x for x in (fo, fh, len(h) - 1) if x is not None)
        for i in range(stop + 1):
            table[(int(o["labels"][i] == "wrong"), int(h[i] == "wrong"))] += 1
            lines += 1
        if fo != fh:
            disagreements.append((pid, fo, fh, o, text))
    n = len(oracle)
    agree = table[(0, 0)] + table[(1, 1)]
    p_o = agree / lines
    p_e = ((table[(1, 0)] + table[(1, 1)]) * (table[(0, 1)] + table[(1, 1)])
           + (table[(0, 0)] + table[(0, 1)]) * (table[(0, 0)] + table[(1, 0)])) / lines**2
    kappa = (p_o - p_e) / (1 - p_e) if p_e < 1 else float("nan")
    out = [f"{n} solutions, {lines} lines compared (up to the first wrong line of either reading).",
           f"first wrong line agrees: {first_agree}/{n} ({first_agree / n:.2f})",
           f"lines: agree {agree}/{lines} ({p_o:.2f}), Cohen's kappa {kappa:.2f}",
           f"  oracle wrong & reader wrong {table[(1, 1)]}, oracle wrong & reader not {table[(1, 0)]}, "
           f"oracle not & reader wrong {table[(0, 1)]}, both not {table[(0, 0)]}", "", "disagreements:"]
    for pid, fo, fh, o, text in disagreements:
        why = o["why"][fo] + ": " + o["detail"][fo] if fo is not None else "-"
        out.append(f"- {pid}: oracle {fo} ({why}), reader {fh}; answer {text['answer']}")
        for i, line in enumerate(text["lines"]):
            mark = ("O" if i == fo else " ") + ("R" if i == fh else " ")
            out.append(f"    {mark} {i}: {line[:160]}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("records", type=Path)
    a.add_argument("--steps", type=int, default=200)
    a.add_argument("--split", default="gsm8k_test")
    a.add_argument("--out", type=Path, default=Path("oracle_study"))
    c = sub.add_parser("compare")
    c.add_argument("folder", type=Path)
    c.add_argument("--split", default="gsm8k_test")
    args = p.parse_args(argv)
    if args.command == "prepare":
        prepare(args.records, args.steps, args.out, args.split)
    else:
        report = compare(args.folder, args.split)
        (args.folder / "agreement.md").write_text(report + "\n")
        print(report)


if __name__ == "__main__":
    main()
